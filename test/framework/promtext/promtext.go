// Package promtext reads what a /metrics endpoint serves (the Prometheus text format) the
// way sluice's process-level tests ask about it: the value of one metric over the series
// whose labels include some name=value pairs.
package promtext

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Parse parses a scrape's body.
func Parse(body string) (Families, error) {
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return mf, nil
}

// Value returns the sum over the series of metric name whose labels include labels
// (name, value pairs): the value of a counter, gauge or untyped metric, the sample count
// of a histogram or summary. found is false when no series matches.
func (f Families) Value(name string, labels ...string) (v float64, found bool) {
	return Value(f[name], labels...)
}

// Value is Families.Value on one family (nil: not found).
func Value(mf *dto.MetricFamily, labels ...string) (v float64, found bool) {
	if mf == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, metric := range mf.Metric {
		matched := 0
		for _, lp := range metric.Label {
			if w, ok := want[lp.GetName()]; ok && w == lp.GetValue() {
				matched++
			}
		}
		if matched != len(want) {
			continue
		}
		found = true
		switch {
		case metric.Counter != nil:
			v += metric.Counter.GetValue()
		case metric.Gauge != nil:
			v += metric.Gauge.GetValue()
		case metric.Histogram != nil:
			v += float64(metric.Histogram.GetSampleCount())
		case metric.Summary != nil:
			v += float64(metric.Summary.GetSampleCount())
		case metric.Untyped != nil:
			v += metric.Untyped.GetValue()
		}
	}
	return v, found
}
