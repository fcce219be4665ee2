//go:build kernel

package iptables

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
	"github.com/sluiceproxy/sluice/test/loopharness"
)

// hasEndpoint reports whether one of ports has an endpoint at ip.
func hasEndpoint(ports []*model.ServicePort, ip string) bool {
	return slices.ContainsFunc(ports, func(sp *model.ServicePort) bool {
		return slices.ContainsFunc(sp.AllEndpoints, func(e model.Endpoint) bool { return e.IP.String() == ip })
	})
}

// answers returns "" when a connection from ns to addr gets want, else what it got.
func answers(ns, network, addr, want string) func() string {
	return func() string {
		got, err := dial(ns, network, addr, time.Second)
		if err != nil {
			return err.Error()
		}
		if got != want {
			return fmt.Sprintf("got %q, want %q", got, want)
		}
		return ""
	}
}

// TestKernelRejectedUpdateKeepsLastGoodRules runs the sync loop over the real backend. The
// kernel refuses the update of Service web that moves it from pod-a to pod-b (an extra rule
// it rejects, written only into that version's rules): clients keep reaching pod-a, a
// change of another Service is programmed meanwhile, the loop retries web on its backoff
// although nothing else changes (maxInterval is an hour, as in the iptables mode), and once
// the kernel takes the update clients reach pod-b.
func TestKernelRejectedUpdateKeepsLastGoodRules(t *testing.T) {
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		var broken atomic.Bool
		broken.Store(true)
		b := newKernelBackend(t, f, withFault(func(n types.NamespacedName, ports []*model.ServicePort) bool {
			return broken.Load() && n == web && hasEndpoint(ports, kPodB)
		}))
		h := loopharness.New(t, loopharness.Config{Backends: []dataplane.Backend{b}, Node: kNode,
			SyncPeriod: time.Second, MaxSyncInterval: time.Hour})
		h.Set(loopharness.Service("ns", "web", "172.30.0.10", 80), loopharness.EndpointSlice("ns", "web", 80, kPodA),
			loopharness.Service("ns", "other", "172.30.0.11", 80), loopharness.EndpointSlice("ns", "other", 80, kPodA))
		h.Start(t)
		loopharness.Eventually(t, "web programmed", 10*time.Second, answers(top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1"))

		// The update is rejected: web keeps its last good rules.
		h.Set(loopharness.EndpointSlice("ns", "web", 80, kPodB))
		st := h.WaitFor(t, "web's update rejected", 10*time.Second, func(st syncloop.FamilyStatus) bool { return st.Failed[web.String()] != "" })
		t.Logf("rejected: %s", st.Failed[web.String()])
		expect(t, "web keeps its last good rules", top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1")

		// Another Service's change goes through meanwhile.
		h.Set(loopharness.EndpointSlice("ns", "other", 80, kPodB))
		loopharness.Eventually(t, "other programmed", 10*time.Second, answers(top.client, "tcp", "172.30.0.11:80", "pod-b 10.180.2.1"))
		expect(t, "web still on its last good rules", top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1")

		// Retried on its own (1 s, then 2 s after the failure), still rejected, still served.
		first := h.Reports.Failed(web)
		loopharness.Eventually(t, "web retried", 10*time.Second, func() string {
			if n := h.Reports.Failed(web); n < first+2 {
				return fmt.Sprintf("%d failed attempts", n)
			}
			return ""
		})
		expect(t, "web served by its last good rules between retries", top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1")

		// The kernel takes it now: the next retry programs it.
		broken.Store(false)
		loopharness.Eventually(t, "web recovered", 15*time.Second, answers(top.client, "tcp", "172.30.0.10:80", "pod-b 10.180.2.1"))
		h.WaitFor(t, "web no longer failing", 5*time.Second, func(st syncloop.FamilyStatus) bool { return len(st.Failed) == 0 })
		expect(t, "other unaffected", top.client, "tcp", "172.30.0.11:80", "pod-b 10.180.2.1")
	})
}

// TestKernelDriftRepairsAreCounted: full syncs over the rules as sluice wrote them count
// no repair against the real iptables; a rule deleted inside a Service's chain (counted by
// the legacy flavour, which reads iptables-save) and a jump deleted from PREROUTING (both
// flavours) are counted when the next full sync repairs them, and a flush is counted too.
func TestKernelDriftRepairsAreCounted(t *testing.T) {
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		b, w := kSynced(t, f)
		before := driftCounts()
		kApply(t, b, w.kstate(), full())
		kApply(t, b, w.kstate(), full())
		if d := driftDelta(before); len(d) != 0 {
			t.Fatalf("full syncs over sluice's own rules counted repairs: %v", d)
		}

		ipt := "iptables-" + string(f)
		var sep string
		for _, l := range strings.Split(run(t, ipt+"-save", "-t", "nat"), "\n") {
			if strings.HasPrefix(l, "-A KUBE-SEP-") && strings.Contains(l, "DNAT") {
				sep = strings.Fields(l)[1]
				break
			}
		}
		run(t, ipt, "-t", "nat", "-D", sep, "1")
		run(t, ipt, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
		kApply(t, b, w.kstate(), full())
		got := driftDelta(before)
		want := 1.0 // the jump
		if f == FlavourLegacy {
			want = 2 // and the rule in sep
		}
		if got["rule"] != want {
			t.Errorf("rule repairs counted %v, want %v", got, want)
		}
		expect(t, "repaired", top.client, "tcp", kNodeIP+":30003", "pod-a "+kClientIP)

		before = driftCounts()
		for _, table := range []string{"filter", "nat", "mangle"} {
			run(t, ipt, "-t", table, "-F")
			run(t, ipt, "-t", table, "-X")
		}
		kApply(t, b, w.kstate(), changed())
		if got := driftDelta(before); got["chain"] < 10 || got["rule"] < 1 {
			t.Errorf("a flush counted %v, want every chain and the jumps", got)
		}
	})
}
