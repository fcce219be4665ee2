//go:build kernel

package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestBadServiceDoesNotFailTheOthers: one Service whose messages the kernel rejects is
// left out and reported; every other Service of the same sync is programmed and carries
// traffic; once fixed, the next sync programs it.
func TestBadServiceDoesNotFailTheOthers(t *testing.T) {
	for _, kind := range []faultKind{faultMissingChain, faultLoop} {
		t.Run(map[faultKind]string{faultMissingChain: "rejected message", faultLoop: "rejected at commit"}[kind], func(t *testing.T) {
			resetTable(t)
			tp := newTopology(t, model.IPv4)
			tp.addPod("pod-a", "10.180.0.1")
			tp.addPod("pod-b", "10.180.0.2")
			bad := types.NamespacedName{Namespace: "t", Name: "dns"}
			broken := true
			b := newTestBackend(t, testConfig(model.IPv4), fixedAddrs(testNodeIP),
				withFault(func(svc types.NamespacedName, _ []*model.ServicePort) faultKind {
					if svc == bad && broken {
						return kind
					}
					return noFault
				}))
			family := model.IPv4.String()
			before := metricstest.Value(t, metrics.NFTablesSyncFailuresTotal.WithLabelValues(family))
			ns := takeoverState()
			res := b.Apply(t.Context(), ns, model.Changes{Full: true})
			if res.Err != nil {
				t.Fatalf("the sync failed as a whole: %v", res.Err)
			}
			if len(res.Failed) != 1 || res.Failed[bad] == nil {
				t.Fatalf("Failed = %v, want just %v", res.Failed, bad)
			}
			t.Logf("reported: %v", res.Failed[bad])
			if after := metricstest.Value(t, metrics.NFTablesSyncFailuresTotal.WithLabelValues(family)); after != before+1 {
				t.Errorf("nftables_sync_failures_total went from %v to %v", before, after)
			}
			if _, err := tp.tcp(tp.client, netip.Addr{}, ap("172.30.0.10", 80), quick); err != nil {
				t.Fatalf("the good Service does not work: %v", err)
			}
			if _, err := tp.udp(tp.client, netip.Addr{}, ap("172.30.0.11", 53), slow); err == nil {
				t.Error("the bad Service answers although its group was left out")
			}

			// The sync loop retries the failed Service; now the kernel takes it.
			broken = false
			mustApply(t, b, ns, changed("t/dns"))
			if r, err := tp.udp(tp.client, netip.Addr{}, ap("172.30.0.11", 53), quick); err != nil || r.pod != "pod-a" {
				t.Fatalf("the repaired Service: %+v, %v", r, err)
			}
			b2 := newTestBackend(t, testConfig(model.IPv4), fixedAddrs(testNodeIP))
			mustApply(t, b2, ns, model.Changes{Full: true})
			if n := b2.LastStats().Operations; n != 0 {
				t.Errorf("the table is not converged after the retry: %d operations:\n%s", n, b2.lastPlan)
			}
		})
	}
}

// TestInvalidServiceIsReportedNotSent: the planner refuses a Service it cannot program
// safely (here an endpoint of the other family) without bothering the kernel.
func TestInvalidServiceIsReportedNotSent(t *testing.T) {
	resetTable(t)
	b := newTestBackend(t, testConfig(model.IPv4), fixedAddrs(testNodeIP))
	ns := takeoverState()
	badSvc := svc("t", "bad", "p", model.TCP, "172.30.0.99", 80).Endpoints("[fd00::1]:80").Build()
	ns.SetService(badSvc.Name.NamespacedName, []*model.ServicePort{badSvc}, nil)
	res := b.Apply(t.Context(), ns, model.Changes{Full: true})
	if res.Err != nil || len(res.Failed) != 1 || res.Failed[badSvc.Name.NamespacedName] == nil {
		t.Fatalf("Err=%v Failed=%v", res.Err, res.Failed)
	}
	if !strings.Contains(nftList(t, model.IPv4), "172.30.0.11") {
		t.Error("the valid Services were not programmed")
	}
}
