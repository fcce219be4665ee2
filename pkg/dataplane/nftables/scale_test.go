//go:build kernel

package nftables

import (
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// scaleN is the number of Services of the scale tests (SLUICE_SCALE_SERVICES overrides).
func scaleN() int {
	if n, err := strconv.Atoi(os.Getenv("SLUICE_SCALE_SERVICES")); err == nil && n > 0 {
		return n
	}
	return 10000
}

// moveOneEndpoint replaces the last endpoint of one Service.
func moveOneEndpoint(ns *model.NodeState, target types.NamespacedName, to string) {
	sp := *ns.PortsOf(target)[0]
	eps := append([]model.Endpoint(nil), sp.ClusterEndpoints[:len(sp.ClusterEndpoints)-1]...)
	a := netip.MustParseAddrPort(to)
	sp.ClusterEndpoints = append(eps, model.Endpoint{IP: a.Addr(), Port: int32(a.Port()), Ready: true, Serving: true})
	ns.SetService(target, []*model.ServicePort{&sp}, nil)
}

// TestColdStartAtScaleKeepsForwarding loads 10 000 Services x 10 endpoints in chunks
// while a Service programmed before keeps answering, then checks a one-endpoint change
// costs what it costs with a handful of Services.
func TestColdStartAtScaleKeepsForwarding(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test")
	}
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	sentinel := svc("t", "sentinel", "http", model.TCP, "172.31.0.1", 80).Endpoints("10.180.0.1:80@local").Build()

	b := newTestBackend(t, testConfig(model.IPv4), WithLocalAddresses(hostnet.InterfaceAddrs))
	small := nodeState(model.IPv4, sentinel)
	mustApply(t, b, small, model.Changes{Full: true})

	n := scaleN()
	ns := scaleState(model.IPv4, n, 10)
	ns.ServiceCIDRs = append(ns.ServiceCIDRs, netip.MustParsePrefix("172.31.0.0/16"))
	ns.SetService(sentinel.Name.NamespacedName, []*model.ServicePort{sentinel}, nil)

	p := startProber(tp, tp.client, ap("172.31.0.1", 80), netip.AddrPort{})
	start := time.Now()
	mustApply(t, b, ns, model.Changes{Full: true})
	elapsed := time.Since(start)
	p.finish(t)
	st := b.LastStats()
	t.Logf("cold sync of %d Services x 10 endpoints: %v (read %v, plan %v, apply %v), %d batches, %d messages, %d bytes",
		n, elapsed, st.ReadTime, st.PlanTime, st.ApplyTime, st.Batches, st.Messages, st.Bytes)
	if st.Batches < 2 {
		t.Errorf("%d batches: the cold start was not chunked", st.Batches)
	}

	// One endpoint moves: the same messages whatever the number of Services.
	small2 := nodeState(model.IPv4, sentinel, svc("ns7", "svc7", "http", model.TCP, "172.30.0.8", 80).
		Endpoints("10.100.0.70:8080", "10.100.0.71:8080", "10.100.0.72:8080", "10.100.0.73:8080", "10.100.0.74:8080",
			"10.100.0.75:8080", "10.100.0.76:8080", "10.100.0.77:8080", "10.100.0.78:8080", "10.100.0.79:8080").Build())
	bSmall := newTestBackend(t, testConfig(model.IPv4))
	resetTableFamily(t, model.IPv6) // keep IPv4
	_ = bSmall
	target := types.NamespacedName{Namespace: "ns7", Name: "svc7"}
	moveOneEndpoint(ns, target, "10.250.0.1:8080")
	start = time.Now()
	mustApply(t, b, ns, changed("ns7/svc7"))
	big := b.LastStats()
	t.Logf("one-endpoint change with %d Services: %v, %d operations, %d messages, %d bytes", n, time.Since(start), big.Operations, big.Messages, big.Bytes)

	// The same change on a table holding two Services.
	resetTable(t)
	b2 := newTestBackend(t, testConfig(model.IPv4), WithLocalAddresses(hostnet.InterfaceAddrs))
	mustApply(t, b2, small2, model.Changes{Full: true})
	moveOneEndpoint(small2, target, "10.250.0.1:8080")
	mustApply(t, b2, small2, changed("ns7/svc7"))
	few := b2.LastStats()
	if big.Operations != few.Operations || big.Messages != few.Messages || big.Bytes != few.Bytes {
		t.Errorf("one-endpoint change: %+v with %d Services, %+v with 2", big, n, few)
	}
}

func resetTableFamily(t testing.TB, f model.IPFamily) {
	t.Helper()
	if err := Cleanup(t.Context(), f); err != nil {
		t.Fatal(err)
	}
}
