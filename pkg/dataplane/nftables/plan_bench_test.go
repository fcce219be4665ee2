package nftables

import (
	"fmt"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// BenchmarkFullPlan measures the planner alone (no kernel): a cold plan of 10 000
// Services x 10 endpoints.
func BenchmarkFullPlan(b *testing.B) {
	ns := scaleState(model.IPv4, 10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		k := newFakeKernel(testConfig(model.IPv4))
		k.plan(ns, model.Changes{Full: true})
	}
}

// BenchmarkPartialPlan measures the planner alone (no kernel) on a one-endpoint change
// (1 <-> 2 endpoints) of one Service in a table of N Services x 10 endpoints: the part
// of a one-change sync that is sluice's own, which must not grow with N either
// (docs/benchmarks-nftables.md, "A table with a bounded number of chains").
func BenchmarkPartialPlan(b *testing.B) {
	for _, n := range []int{100, 10000, 50000} {
		ns := scaleState(model.IPv4, n, 10)
		k := newFakeKernel(testConfig(model.IPv4))
		k.apply(ns, model.Changes{Full: true})
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				eps := []string{"10.250.0.1:8080", "10.250.0.2:8080"}
				if i%2 == 1 {
					eps = eps[:1]
				}
				sp := svc("ns0", "svc0", "http", model.TCP, "172.30.0.1", 80).Endpoints(eps...).Build()
				ns.SetService(sp.Name.NamespacedName, []*model.ServicePort{sp}, nil)
				k.apply(ns, changed("ns0/svc0"))
			}
		})
	}
}
