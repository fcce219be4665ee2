package app

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Test conventions: node "node-a"; IPv4 192.168.1.10/.11, IPv6 fd00::10/::11; pod CIDRs
// 10.244.1.0/24 and fd00:244:1::/64.

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestHostIPsAreTheFirstOfEachFamilyAsUpstream(t *testing.T) {
	for _, tc := range []struct {
		ips, want []netip.Addr
	}{
		{nil, nil},
		{addrs("192.168.1.10"), addrs("192.168.1.10")},
		{addrs("192.168.1.10", "192.168.1.11"), addrs("192.168.1.10")},
		{addrs("192.168.1.10", "192.168.1.11", "fd00::10", "fd00::11"), addrs("192.168.1.10", "fd00::10")},
		{addrs("fd00::10", "192.168.1.10"), addrs("fd00::10", "192.168.1.10")},
	} {
		if got := hostIPs(tc.ips); !slices.Equal(got, tc.want) {
			t.Errorf("hostIPs(%v) = %v, want %v", tc.ips, got, tc.want)
		}
	}
}

// recordedCancel records why the node watcher ended Run.
type recordedCancel struct {
	mu    sync.Mutex
	cause error
}

func (r *recordedCancel) cancel(err error) { r.mu.Lock(); r.cause = err; r.mu.Unlock() }
func (r *recordedCancel) get() error       { r.mu.Lock(); defer r.mu.Unlock(); return r.cause }

type recordedTracker struct{ nodes []model.NodeInfo }

func (r *recordedTracker) OnNodeChange(n model.NodeInfo) { r.nodes = append(r.nodes, n) }

func testNode(ips []string, podCIDRs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{PodCIDRs: podCIDRs}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	return n
}

// sluice restarts on exactly the Node changes upstream's NodeManager restarts on.
func TestNodeChangesThatRestart(t *testing.T) {
	v4v6 := []string{"192.168.1.10", "fd00::10"}
	for _, tc := range []struct {
		name        string
		detectLocal dataplane.LocalDetectMode
		initial     *v1.Node
		update      *v1.Node
		wantCause   string // "" means no restart, and the tracker sees the change
	}{
		{name: "another address of a family is added", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: testNode([]string{"192.168.1.10", "fd00::10", "192.168.1.11", "fd00::11"})},
		{name: "a later address is removed", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode([]string{"192.168.1.10", "192.168.1.11", "fd00::10"}), update: testNode(v4v6)},
		{name: "an external address comes and goes", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: func() *v1.Node {
				n := testNode(v4v6)
				n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.9"})
				return n
			}()},
		{name: "the first IPv4 changes", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: testNode([]string{"192.168.1.11", "fd00::10"}), wantCause: "node IPs changed"},
		{name: "the first IPv6 changes", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: testNode([]string{"192.168.1.10", "fd00::11"}), wantCause: "node IPs changed"},
		{name: "the node becomes dual-stack", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode([]string{"192.168.1.10"}), update: testNode(v4v6), wantCause: "node IPs changed"},
		{name: "the primary family changes", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: testNode([]string{"fd00::10", "192.168.1.10"}), wantCause: "node IPs changed"},
		{name: "addresses appear on a node that had none", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(nil), update: testNode(v4v6), wantCause: "node IPs changed"},
		{name: "pod CIDRs appear in NodeCIDR mode", detectLocal: dataplane.DetectLocalNodeCIDR,
			initial: testNode(v4v6), update: testNode(v4v6, "10.244.1.0/24"), wantCause: "pod CIDRs changed from [] to [10.244.1.0/24]"},
		{name: "pod CIDRs appear in ClusterCIDR mode", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: testNode(v4v6, "10.244.1.0/24")},
		{name: "the node is deleted", detectLocal: dataplane.DetectLocalClusterCIDR,
			initial: testNode(v4v6), update: nil, wantCause: "was deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cancel recordedCancel
			tracker := &recordedTracker{}
			n := newNodeWatcher(&config.Effective{NodeName: "node-a", DetectLocalMode: tc.detectLocal}, cancel.cancel)
			n.initial, n.tracker = NodeInfoOf(tc.initial), tracker
			n.observe(tc.update)
			got := cancel.get()
			switch {
			case tc.wantCause == "" && got != nil:
				t.Errorf("restarted: %v", got)
			case tc.wantCause == "" && len(tracker.nodes) != 1:
				t.Errorf("the tracker saw %d node changes, want 1", len(tracker.nodes))
			case tc.wantCause != "" && (got == nil || !strings.Contains(got.Error(), tc.wantCause)):
				t.Errorf("cause %v, want %q", got, tc.wantCause)
			}
		})
	}
}

// scriptedNodes answers Get with the next of its answers, then repeats the last.
type scriptedNodes struct {
	mu      sync.Mutex
	answers []func() (*v1.Node, error)
	calls   int
}

func (s *scriptedNodes) Get(context.Context, string, metav1.GetOptions) (*v1.Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := min(s.calls, len(s.answers)-1)
	s.calls++
	return s.answers[i]()
}

func bufferLogger() (klog.Logger, *syncBuffer) {
	var buf syncBuffer
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf))), &buf
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.buf.String() }

func TestWaitForNodeDoesNotWaitForPodCIDRs(t *testing.T) {
	nodes := &scriptedNodes{answers: []func() (*v1.Node, error){
		func() (*v1.Node, error) { return testNode([]string{"192.168.1.10"}), nil },
	}}
	n := newNodeWatcher(&config.Effective{NodeName: "node-a", DetectLocalMode: dataplane.DetectLocalNodeCIDR}, (&recordedCancel{}).cancel)
	start := time.Now()
	info, err := n.waitForNode(context.Background(), nodes, time.Minute)
	if err != nil || len(info.IPs) != 1 || len(info.PodCIDRs) != 0 {
		t.Fatalf("info %+v, err %v", info, err)
	}
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Errorf("waited %v for a Node that has its IPs", waited)
	}
}

// API errors while waiting for the Node are logged at default verbosity (an RBAC mistake
// must be visible without -v), and not once a second.
func TestWaitForNodeLogsWhyItWaits(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "node-a", errors.New("RBAC: no"))
	nodes := &scriptedNodes{answers: []func() (*v1.Node, error){
		func() (*v1.Node, error) { return nil, forbidden },
		func() (*v1.Node, error) { return nil, forbidden },
		func() (*v1.Node, error) { return testNode([]string{"192.168.1.10"}), nil },
	}}
	logger, logs := bufferLogger()
	ctx := klog.NewContext(context.Background(), logger)
	n := newNodeWatcher(&config.Effective{NodeName: "node-a"}, (&recordedCancel{}).cancel)
	n.poll = 10 * time.Millisecond
	var seen []*v1.Node
	n.onNode = func(node *v1.Node) { seen = append(seen, node) }
	if _, err := n.waitForNode(ctx, nodes, time.Minute); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Count(out, "Reading this node's Node object failed") != 1 || !strings.Contains(out, "RBAC: no") || !strings.Contains(out, `node="node-a"`) {
		t.Errorf("log, want one line with the API error:\n%s", out)
	}
	if len(seen) != 1 {
		t.Errorf("onNode called %d times, want 1 (the health server learns of the Node)", len(seen))
	}
}

func TestWaitForNodeGivesUpOnIPsAfterTheTimeout(t *testing.T) {
	nodes := &scriptedNodes{answers: []func() (*v1.Node, error){
		func() (*v1.Node, error) {
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "node-a")
		},
	}}
	logger, logs := bufferLogger()
	ctx := klog.NewContext(context.Background(), logger)
	n := newNodeWatcher(&config.Effective{NodeName: "node-a", DetectLocalMode: dataplane.DetectLocalNodeCIDR}, (&recordedCancel{}).cancel)
	n.poll = 10 * time.Millisecond
	info, err := n.waitForNode(ctx, nodes, 100*time.Millisecond)
	if err != nil || len(info.IPs) != 0 {
		t.Fatalf("info %+v, err %v", info, err)
	}
	for _, want := range []string{"Waiting for this node's Node object to exist", "No node IPs found"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// recordedWarnings records Node Events.
type recordedWarnings struct{ events []string }

func (r *recordedWarnings) NodeWarning(reason, message string) bool {
	r.events = append(r.events, reason+": "+message)
	return true
}

func TestLocalDetectionMissingIsReported(t *testing.T) {
	dual := []model.IPFamily{model.IPv4, model.IPv6}
	withCIDRs := NodeInfoOf(testNode([]string{"192.168.1.10", "fd00::10"}, "10.244.1.0/24", "fd00:244:1::/64"))
	v4CIDROnly := NodeInfoOf(testNode([]string{"192.168.1.10", "fd00::10"}, "10.244.1.0/24"))
	noCIDRs := NodeInfoOf(testNode([]string{"192.168.1.10", "fd00::10"}))
	for _, tc := range []struct {
		name        string
		e           config.Effective
		node        model.NodeInfo
		wantMissing []model.IPFamily
		wantEvent   string
	}{
		{name: "NodeCIDR with pod CIDRs", e: config.Effective{DetectLocalMode: dataplane.DetectLocalNodeCIDR}, node: withCIDRs},
		{name: "NodeCIDR without pod CIDRs", e: config.Effective{DetectLocalMode: dataplane.DetectLocalNodeCIDR}, node: noCIDRs,
			wantMissing: dual, wantEvent: "NoLocalTrafficDetection: Services are programmed without local-traffic detection for IPv4: detectLocalMode is NodeCIDR and Node node-a has no IPv4 pod CIDR"},
		{name: "NodeCIDR, only the secondary family lacks one: counted, no Event (as upstream logs only the primary)",
			e: config.Effective{DetectLocalMode: dataplane.DetectLocalNodeCIDR}, node: v4CIDROnly, wantMissing: []model.IPFamily{model.IPv6}},
		{name: "ClusterCIDR without clusterCIDR", e: config.Effective{DetectLocalMode: dataplane.DetectLocalClusterCIDR}, node: withCIDRs,
			wantMissing: dual, wantEvent: "NoLocalTrafficDetection: Services are programmed without local-traffic detection for IPv4: detectLocalMode is ClusterCIDR and clusterCIDR has no IPv4 range"},
		{name: "ClusterCIDR with both families",
			e:    config.Effective{DetectLocalMode: dataplane.DetectLocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}},
			node: noCIDRs},
		{name: "interface modes need no CIDR", e: config.Effective{DetectLocalMode: dataplane.DetectLocalInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, node: noCIDRs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.e.NodeName = "node-a"
			if got := localDetectionMissing(&tc.e, tc.node, dual); !slices.Equal(got, tc.wantMissing) {
				t.Errorf("missing %v, want %v", got, tc.wantMissing)
			}
			logger, logs := bufferLogger()
			var to recordedWarnings
			reportLocalDetection(logger, &tc.e, tc.node, dual, &to)
			for _, f := range dual {
				want := 0.0
				if slices.Contains(tc.wantMissing, f) {
					want = 1
				}
				if got := metricstest.Value(t, metrics.LocalTrafficDetectionMissing.WithLabelValues(f.String())); got != want {
					t.Errorf("sluice_local_traffic_detection_missing{%s} = %v, want %v", f, got, want)
				}
			}
			switch {
			case tc.wantEvent == "" && len(to.events) > 0:
				t.Errorf("Events %q", to.events)
			case tc.wantEvent != "" && (len(to.events) != 1 || !strings.HasPrefix(to.events[0], tc.wantEvent)):
				t.Errorf("Events %q, want one starting %q", to.events, tc.wantEvent)
			case tc.wantEvent != "" && !strings.Contains(logs.String(), "Programming Services without local-traffic detection"):
				t.Errorf("log:\n%s", logs.String())
			}
		})
	}
}
