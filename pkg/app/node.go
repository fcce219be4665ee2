package app

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// podCIDRWaitTimeout bounds the wait for spec.podCIDRs in NodeCIDR mode (upstream: 5 min,
// fatal when it expires: without them no pod traffic can be recognised).
const podCIDRWaitTimeout = 5 * time.Minute

// NodeInfoOf extracts what the model needs from a Node: its name, zone label, addresses
// (InternalIP before ExternalIP, the first of each family being that family's primary) and
// pod CIDRs. Unparseable values are skipped.
func NodeInfoOf(node *v1.Node) model.NodeInfo {
	info := model.NodeInfo{Name: node.Name, Zone: node.Labels[v1.LabelTopologyZone]}
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != kind {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(info.IPs, ip.Unmap()) {
				info.IPs = append(info.IPs, ip.Unmap())
			}
		}
	}
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			info.PodCIDRs = append(info.PodCIDRs, p.Masked())
		}
	}
	return info
}

// nodeWatcher follows this node's Node object. Like upstream, sluice restarts (by ending
// Run with an error, so the DaemonSet restarts it) when the node's IPs change or the node
// is deleted, and in NodeCIDR mode when its pod CIDRs change: those values are baked into
// the backends' configuration. A restart does not disrupt traffic: the backends converge
// the existing rules instead of flushing them.
type nodeWatcher struct {
	e      *config.Effective
	cancel context.CancelCauseFunc
	onNode func(*v1.Node)

	mu      sync.Mutex
	initial model.NodeInfo
	tracker interface{ OnNodeChange(model.NodeInfo) }
}

func newNodeWatcher(e *config.Effective, cancel context.CancelCauseFunc) *nodeWatcher {
	return &nodeWatcher{e: e, cancel: cancel}
}

// waitForNode reads the Node until it has addresses (up to timeout; then sluice goes on
// without node IPs, as upstream does) and, in NodeCIDR mode, pod CIDRs.
func (n *nodeWatcher) waitForNode(ctx context.Context, client kubernetes.Interface, timeout time.Duration) (model.NodeInfo, error) {
	logger := klog.FromContext(ctx)
	needCIDRs := n.e.DetectLocalMode == dataplane.DetectLocalNodeCIDR
	start := time.Now()
	info := model.NodeInfo{Name: n.e.NodeName}
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, n.e.NodeName, metav1.GetOptions{})
		switch {
		case err == nil:
			info = NodeInfoOf(node)
			if n.onNode != nil {
				n.onNode(node)
			}
		case apierrors.IsNotFound(err):
		default:
			logger.V(2).Info("Reading this node failed; retrying", "node", n.e.NodeName, "err", err)
		}
		haveIPs := len(info.IPs) > 0
		haveCIDRs := len(info.PodCIDRs) > 0
		waited := time.Since(start)
		if haveIPs && (!needCIDRs || haveCIDRs) {
			break
		}
		if !haveIPs && waited > timeout && (!needCIDRs || haveCIDRs) {
			logger.Error(nil, "No node IPs found; NodePorts on the primary address and health check listeners may be missing", "node", n.e.NodeName, "waited", waited.Seconds())
			break
		}
		if needCIDRs && !haveCIDRs && waited > podCIDRWaitTimeout {
			return info, fmt.Errorf("node %q has no spec.podCIDRs after %v, and detectLocalMode NodeCIDR needs them", n.e.NodeName, podCIDRWaitTimeout)
		}
		select {
		case <-ctx.Done():
			return info, context.Cause(ctx)
		case <-time.After(time.Second):
		}
	}
	n.mu.Lock()
	n.initial = info
	n.mu.Unlock()
	return info, nil
}

// observe is the Node informer's handler.
func (n *nodeWatcher) observe(node *v1.Node) {
	if n.onNode != nil {
		n.onNode(node)
	}
	if node == nil {
		n.cancel(fmt.Errorf("node %q was deleted; exiting", n.e.NodeName))
		return
	}
	info := NodeInfoOf(node)
	n.mu.Lock()
	initial, tracker := n.initial, n.tracker
	n.mu.Unlock()
	if len(initial.IPs) > 0 && !slices.Equal(initial.IPs, info.IPs) {
		n.cancel(fmt.Errorf("node IPs changed from %v to %v; restarting to reprogram them", initial.IPs, info.IPs))
		return
	}
	if n.e.DetectLocalMode == dataplane.DetectLocalNodeCIDR && !slices.Equal(initial.PodCIDRs, info.PodCIDRs) {
		n.cancel(fmt.Errorf("node pod CIDRs changed from %v to %v (detectLocalMode NodeCIDR); restarting", initial.PodCIDRs, info.PodCIDRs))
		return
	}
	if tracker != nil {
		tracker.OnNodeChange(info)
	}
}
