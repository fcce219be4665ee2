//go:build kernel

package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
	"github.com/sluiceproxy/sluice/test/loopharness"
)

// reaches returns "" when a TCP connection from the client to dst is answered by pod.
func (tp *topology) reaches(dst netip.AddrPort, pod string) func() string {
	return func() string {
		r, err := tp.tcp(tp.client, netip.Addr{}, dst, time.Second)
		if err != nil {
			return err.Error()
		}
		if r.pod != pod {
			return fmt.Sprintf("answered by %s, want %s", r.pod, pod)
		}
		return ""
	}
}

// TestKernelRejectedUpdateKeepsLastGoodRules runs the sync loop over the real backend, with
// a full resync at every sync (the backend's syncPeriod equals the loop's, 1 s, as in the
// nftables mode). The kernel refuses the message that moves Service web from pod-a to
// pod-b (a bad message added to that version's transaction group): clients keep reaching
// pod-a, through the periodic full syncs too; another Service's change is programmed
// meanwhile; web is retried on its backoff (1 s, 2 s ...), not at every sync; once the
// kernel takes it, clients reach pod-b.
func TestKernelRejectedUpdateKeepsLastGoodRules(t *testing.T) {
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	tp.addPod("pod-b", "10.180.0.2")
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	var broken atomic.Bool
	broken.Store(true)
	cfg := testConfig(model.IPv4)
	cfg.SyncPeriod = time.Second
	b := newTestBackend(t, cfg, fixedAddrs(testNodeIP), withFault(func(n types.NamespacedName, ports []*model.ServicePort) faultKind {
		if broken.Load() && n == web && slices.ContainsFunc(ports, func(sp *model.ServicePort) bool {
			return slices.ContainsFunc(sp.AllEndpoints, func(e model.Endpoint) bool { return e.IP.String() == "10.180.0.2" })
		}) {
			return faultMissingChain
		}
		return noFault
	}))
	h := loopharness.New(t, loopharness.Config{Backends: []dataplane.Backend{b}, SyncPeriod: time.Second,
		Node: model.NodeInfo{Name: "node1", IPs: []netip.Addr{testNodeIP}}})
	h.Set(loopharness.Service("ns", "web", "172.30.0.10", 80), loopharness.EndpointSlice("ns", "web", 80, "10.180.0.1"),
		loopharness.Service("ns", "other", "172.30.0.11", 80), loopharness.EndpointSlice("ns", "other", 80, "10.180.0.1"))
	h.Start(t)
	loopharness.Eventually(t, "web programmed", 10*time.Second, tp.reaches(ap("172.30.0.10", 80), "pod-a"))

	// The update is rejected: web keeps its last good rules.
	h.Set(loopharness.EndpointSlice("ns", "web", 80, "10.180.0.2"))
	st := h.WaitFor(t, "web's update rejected", 10*time.Second, func(st syncloop.FamilyStatus) bool { return st.Failed[web.String()] != "" })
	firstFailure := time.Now()
	t.Logf("rejected: %s", st.Failed[web.String()])
	if msg := tp.reaches(ap("172.30.0.10", 80), "pod-a")(); msg != "" {
		t.Fatalf("web lost its last good rules: %s", msg)
	}

	// Another Service's change goes through meanwhile.
	h.Set(loopharness.EndpointSlice("ns", "other", 80, "10.180.0.2"))
	loopharness.Eventually(t, "other programmed", 10*time.Second, tp.reaches(ap("172.30.0.11", 80), "pod-b"))

	// Retried twice on its backoff (1 s and 2 s after the failures): that takes 3 s, not
	// the 2 s that retrying at every (full) sync would take.
	loopharness.Eventually(t, "web retried", 15*time.Second, func() string {
		if n := h.Reports.Failed(web); n < 3 {
			return fmt.Sprintf("%d failed attempts", n)
		}
		return ""
	})
	if elapsed := time.Since(firstFailure); elapsed < 2500*time.Millisecond {
		t.Errorf("two retries within %v of the first failure: retried at every sync, not on a backoff", elapsed)
	}
	fulls := h.Status(model.IPv4).LastFullSync
	if fulls.Before(firstFailure) {
		t.Errorf("no full sync since the failure (last %v): the test does not show that full syncs keep the last good rules", fulls)
	}
	if msg := tp.reaches(ap("172.30.0.10", 80), "pod-a")(); msg != "" {
		t.Fatalf("web lost its last good rules through the retries and full syncs: %s", msg)
	}

	// The kernel takes it now: the next retry programs it.
	broken.Store(false)
	loopharness.Eventually(t, "web recovered", 15*time.Second, tp.reaches(ap("172.30.0.10", 80), "pod-b"))
	h.WaitFor(t, "web no longer failing", 5*time.Second, func(st syncloop.FamilyStatus) bool { return len(st.Failed) == 0 })
	if msg := tp.reaches(ap("172.30.0.11", 80), "pod-b")(); msg != "" {
		t.Errorf("other: %s", msg)
	}
}
