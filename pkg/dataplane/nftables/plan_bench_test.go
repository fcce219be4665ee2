package nftables

import (
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
