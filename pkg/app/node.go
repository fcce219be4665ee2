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
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// nodeWaitPollInterval is how often the wait for this node's Node object reads it, as
// upstream's NodeManager polls.
const nodeWaitPollInterval = time.Second

// nodeWaitLogInterval is how often the wait for this node's Node object says why it is
// still waiting (an API error, a missing Node, no addresses yet).
const nodeWaitLogInterval = 10 * time.Second

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

// nodeWatcher follows this node's Node object. Like upstream's NodeManager, sluice restarts
// (by ending Run with an error, so the DaemonSet restarts it) when the node's host IPs
// change (the first IP, and the first of the other family: hostIPs) or the node is
// deleted, and in NodeCIDR mode when its pod CIDRs change, including when they first
// appear: those values are baked into the backends' configuration. A restart does not
// disrupt traffic: the backends converge the existing rules instead of flushing them.
type nodeWatcher struct {
	e      *config.Effective
	cancel context.CancelCauseFunc
	onNode func(*v1.Node)
	// poll is how often waitForNode reads the Node (nodeWaitPollInterval; tests shorten it).
	poll time.Duration

	mu      sync.Mutex
	initial model.NodeInfo
	tracker interface{ OnNodeChange(model.NodeInfo) }
}

func newNodeWatcher(e *config.Effective, cancel context.CancelCauseFunc) *nodeWatcher {
	return &nodeWatcher{e: e, cancel: cancel, poll: nodeWaitPollInterval}
}

// nodeGetter reads one Node; the client's CoreV1().Nodes() is one.
type nodeGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Node, error)
}

// waitForNode reads the Node until it has addresses, for at most timeout (upstream's 30 s;
// then sluice goes on without node IPs, as upstream does). It does not wait for pod CIDRs:
// in NodeCIDR mode a Node without them is programmed without local-traffic detection (see
// localDetectionMissing), and observe restarts sluice when they appear. Until the Node is
// found, the reason it is not (an API error such as a missing RBAC permission, no Node of
// that name, no addresses yet) is logged every nodeWaitLogInterval at default verbosity.
func (n *nodeWatcher) waitForNode(ctx context.Context, nodes nodeGetter, timeout time.Duration) (model.NodeInfo, error) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	var lastLog time.Time
	info := model.NodeInfo{Name: n.e.NodeName}
	for {
		node, err := nodes.Get(ctx, n.e.NodeName, metav1.GetOptions{})
		if err == nil {
			info = NodeInfoOf(node)
			if n.onNode != nil {
				n.onNode(node)
			}
		}
		waited := time.Since(start)
		if len(info.IPs) > 0 {
			break
		}
		if waited > timeout {
			logger.Error(nil, "No node IPs found; NodePorts on the primary address and health check listeners may be missing", "node", klog.KRef("", n.e.NodeName), "waited", waited.Seconds())
			break
		}
		if ctx.Err() == nil && time.Since(lastLog) >= nodeWaitLogInterval {
			lastLog = time.Now()
			switch {
			case apierrors.IsNotFound(err):
				logger.Info("Waiting for this node's Node object to exist", "node", klog.KRef("", n.e.NodeName), "waited", waited.Seconds())
			case err != nil:
				logger.Error(err, "Reading this node's Node object failed; retrying", "node", klog.KRef("", n.e.NodeName), "waited", waited.Seconds())
			default:
				logger.Info("Waiting for this node's Node object to get addresses (status.addresses)", "node", klog.KRef("", n.e.NodeName), "waited", waited.Seconds())
			}
		}
		select {
		case <-ctx.Done():
			return info, context.Cause(ctx)
		case <-time.After(n.poll):
		}
	}
	n.mu.Lock()
	n.initial = info
	n.mu.Unlock()
	return info, nil
}

// hostIPs returns what upstream's NodeManager compares to decide whether a Node's
// addresses changed (k8s.io/kubernetes/pkg/util/node GetNodeHostIPs): the node's first IP
// and the first IP of the other family, in that order. ips is NodeInfo.IPs, InternalIPs
// before ExternalIPs. Other addresses may come and go without a restart: no backend uses
// them.
func hostIPs(ips []netip.Addr) []netip.Addr {
	if len(ips) == 0 {
		return nil
	}
	out := []netip.Addr{ips[0]}
	for _, ip := range ips[1:] {
		if ip.Is4() != ips[0].Is4() {
			return append(out, ip)
		}
	}
	return out
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
	if was, now := hostIPs(initial.IPs), hostIPs(info.IPs); !slices.Equal(was, now) {
		n.cancel(fmt.Errorf("node IPs changed from %v to %v; restarting to reprogram them", was, now))
		return
	}
	if n.e.DetectLocalMode == dataplane.DetectLocalNodeCIDR && !slices.Equal(initial.PodCIDRs, info.PodCIDRs) {
		n.cancel(fmt.Errorf("node pod CIDRs changed from %v to %v (detectLocalMode NodeCIDR); restarting to detect local traffic by them", initial.PodCIDRs, info.PodCIDRs))
		return
	}
	if tracker != nil {
		tracker.OnNodeChange(info)
	}
}

// localDetectionMissing returns the families among families whose detectLocalMode has no
// CIDR to work with on node (NodeCIDR: no pod CIDR of the family; ClusterCIDR: no
// clusterCIDR of the family). Their backends get a detector that matches nothing, as
// upstream's no-op detector: Services are still programmed, only without the shortcuts
// and masquerading decisions that need to know pod traffic.
func localDetectionMissing(e *config.Effective, node model.NodeInfo, families []model.IPFamily) []model.IPFamily {
	var missing []model.IPFamily
	for _, f := range families {
		d := e.LocalDetectorFor(f, node)
		switch d.Mode {
		case dataplane.DetectLocalNodeCIDR, dataplane.DetectLocalClusterCIDR:
			if len(d.CIDRs) == 0 {
				missing = append(missing, f)
			}
		}
	}
	return missing
}

// reportLocalDetection sets sluice_local_traffic_detection_missing for every family and,
// when the node's primary family has no local-traffic detection (the case upstream logs),
// logs an error and writes a Warning Event saying why and what happens next.
func reportLocalDetection(logger klog.Logger, e *config.Effective, node model.NodeInfo, families []model.IPFamily, to nodeWarner) {
	missing := localDetectionMissing(e, node, families)
	for _, f := range families {
		v := 0.0
		if slices.Contains(missing, f) {
			v = 1
		}
		metrics.LocalTrafficDetectionMissing.WithLabelValues(f.String()).Set(v)
	}
	primary := e.PrimaryFamily(node)
	if !slices.Contains(missing, primary) {
		return
	}
	var why string
	switch e.DetectLocalMode {
	case dataplane.DetectLocalNodeCIDR:
		why = fmt.Sprintf("detectLocalMode is NodeCIDR and Node %s has no %s pod CIDR (spec.podCIDRs %v). sluice restarts to use them when they are set; with a CNI that allocates pod addresses itself, use ClusterCIDR with clusterCIDR, or InterfaceNamePrefix",
			node.Name, primary, node.PodCIDRs)
	default:
		why = fmt.Sprintf("detectLocalMode is ClusterCIDR and clusterCIDR has no %s range (%v); set it to the cluster's pod network", primary, e.ClusterCIDRs)
	}
	logger.Error(nil, "Programming Services without local-traffic detection", "ipFamily", primary, "reason", why)
	to.NodeWarning(events.ReasonNoLocalTrafficDetection, "Services are programmed without local-traffic detection for "+primary.String()+": "+why+".")
}
