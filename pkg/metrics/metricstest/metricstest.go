// Package metricstest reads metric values in tests.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of a gauge or a counter (of one label set: a vector's
// WithLabelValues). A metric that cannot be written fails the test.
func Value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatalf("reading metric %v: %v", m.Desc(), err)
	}
	if out.Gauge != nil {
		return out.Gauge.GetValue()
	}
	return out.Counter.GetValue()
}

// Collect registers c with a new pedantic registry (which also checks that what c
// collects matches what it describes) and returns what the registry gathers.
func Collect(t testing.TB, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return families
}
