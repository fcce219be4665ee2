//go:build kernel

package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
	"github.com/sluiceproxy/sluice/test/loopharness"
)

// answeredOnlyBy returns "" when n connections from the client to addr are all answered by
// pod (round robin would show any other real server in rotation).
func answeredOnlyBy(ns, addr, pod string, n int) func() string {
	return func() string {
		for range n {
			got, err := fetch(ns, netip.Addr{}, addr)
			if err != nil {
				return err.Error()
			}
			if answeredBy(got) != pod {
				return fmt.Sprintf("answered by %q, want only %s", got, pod)
			}
		}
		return ""
	}
}

// TestKernelRejectedUpdateKeepsLastGoodRules runs the sync loop over the real backend (a
// full sync at every sync, as in the ipvs mode). Service web's update moves it from pod1 to
// pod2 and adds NodePort 30080; the kernel rejects the NodePort's real server (written with
// a weight IPVS refuses, through the backend's fault seam) after the ClusterIP's real
// servers already changed: the update is undone, clients keep reaching pod1 alone on the
// ClusterIP, another Service's change is programmed meanwhile, web is retried on its
// backoff, and once the kernel takes it clients reach pod2 on both.
func TestKernelRejectedUpdateKeepsLastGoodRules(t *testing.T) {
	tp := newTopology(t, 2)
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	var broken atomic.Bool
	broken.Store(true)
	cfg := kernelConfig()
	cfg.SyncPeriod = time.Second
	b, err := New(klog.NewContext(context.Background(), klog.Background()), cfg, Settings{}, func(o *options) {
		o.fault = func(o op) bool { return broken.Load() && o.kind == opAddRS && o.vs.Port == 30080 }
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	h := loopharness.New(t, loopharness.Config{Backends: []dataplane.Backend{b}, SyncPeriod: time.Second,
		Node: model.NodeInfo{Name: nodeName, IPs: []netip.Addr{kNodeIP}}})
	h.Set(loopharness.Service("ns", "web", "172.30.8.10", 80), loopharness.EndpointSlice("ns", "web", 8080, "10.180.1.2"),
		loopharness.Service("ns", "other", "172.30.8.11", 80), loopharness.EndpointSlice("ns", "other", 8080, "10.180.1.2"))
	h.Start(t)
	loopharness.Eventually(t, "web programmed", 20*time.Second, answeredOnlyBy(tp.client, "172.30.8.10:80", "pod1", 1))

	update := loopharness.Service("ns", "web", "172.30.8.10", 80)
	update.Spec.Type = "NodePort"
	update.Spec.Ports[0].NodePort = 30080
	h.Set(update, loopharness.EndpointSlice("ns", "web", 8080, "10.180.2.2"))
	st := h.WaitFor(t, "web's update rejected", 20*time.Second, func(st syncloop.FamilyStatus) bool { return st.Failed[web.String()] != "" })
	t.Logf("rejected: %s", st.Failed[web.String()])
	if msg := answeredOnlyBy(tp.client, "172.30.8.10:80", "pod1", 4)(); msg != "" {
		t.Fatalf("web's ClusterIP does not serve its last good version: %s", msg)
	}
	if got, err := fetch(tp.client, netip.Addr{}, "192.168.0.2:30080"); err == nil {
		t.Fatalf("the rejected update's NodePort answers (%q)", got)
	}

	h.Set(loopharness.EndpointSlice("ns", "other", 8080, "10.180.2.2"))
	loopharness.Eventually(t, "other programmed", 20*time.Second, answeredOnlyBy(tp.client, "172.30.8.11:80", "pod2", 2))

	loopharness.Eventually(t, "web retried", 30*time.Second, func() string {
		if n := h.Reports.Failed(web); n < 3 {
			return fmt.Sprintf("%d failed attempts", n)
		}
		return ""
	})
	if msg := answeredOnlyBy(tp.client, "172.30.8.10:80", "pod1", 4)(); msg != "" {
		t.Fatalf("web lost its last good version through the retries and full syncs: %s", msg)
	}

	broken.Store(false)
	loopharness.Eventually(t, "web recovered", 30*time.Second, answeredOnlyBy(tp.client, "172.30.8.10:80", "pod2", 2))
	loopharness.Eventually(t, "web's NodePort", 10*time.Second, answeredOnlyBy(tp.client, "192.168.0.2:30080", "pod2", 2))
	h.WaitFor(t, "web no longer failing", 10*time.Second, func(st syncloop.FamilyStatus) bool { return len(st.Failed) == 0 })
}
