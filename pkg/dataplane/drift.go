package dataplane

import (
	"fmt"
	"maps"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// maxDriftExamples bounds the objects one log line names: a flushed table is one line,
// not thousands.
const maxDriftExamples = 10

// Drift is what one full resync found different from what the backend last wrote (someone
// else changed the backend's kernel objects: an operator by hand, a firewall reload,
// another proxy such as a kube-proxy brought back by an upgrade). The resync repairs it;
// Report makes the repair visible. Only a backend that trusts its memory of what it wrote
// (its last sync did not fail as a whole) may count: otherwise the difference is its own
// unfinished work, not drift.
type Drift struct {
	counts   map[string]int
	examples []string
}

// Add records one object of kind (a DriftKinds value of the mode) that had to be repaired;
// what names it for the log ("element 10.96.0.10 . tcp . 80 of map service-ips missing").
func (d *Drift) Add(kind, what string) {
	if d.counts == nil {
		d.counts = map[string]int{}
	}
	d.counts[kind]++
	if len(d.examples) < maxDriftExamples {
		d.examples = append(d.examples, kind+" "+what)
	}
}

// Total is the number of objects recorded.
func (d *Drift) Total() int {
	n := 0
	for _, c := range d.counts {
		n += c
	}
	return n
}

// Count is the number of objects of kind recorded.
func (d *Drift) Count(kind string) int { return d.counts[kind] }

// Report counts the repairs in sluice_drift_repairs_total and logs them at default
// verbosity, naming up to ten objects. It does nothing when nothing was recorded.
func (d *Drift) Report(logger klog.Logger, mode Mode, family model.IPFamily) {
	if d.Total() == 0 {
		return
	}
	kinds := slices.Sorted(maps.Keys(d.counts))
	counts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		metrics.DriftRepairsTotal.WithLabelValues(string(mode), family.String(), k).Add(float64(d.counts[k]))
		counts = append(counts, fmt.Sprintf("%s=%d", k, d.counts[k]))
	}
	logger.Info("Repaired kernel state changed behind sluice's back (if this keeps happening, another program writes sluice's rules)",
		"mode", mode, "repairs", counts, "examples", d.examples)
}

// DriftRepairs reads sluice_drift_repairs_total of one mode and family, by kind (tests,
// diagnostics).
func DriftRepairs(mode Mode, family model.IPFamily) map[string]float64 {
	out := map[string]float64{}
	for _, kind := range metrics.DriftKinds[string(mode)] {
		var m dto.Metric
		if err := metrics.DriftRepairsTotal.WithLabelValues(string(mode), family.String(), kind).Write(&m); err == nil {
			out[kind] = m.GetCounter().GetValue()
		}
	}
	return out
}
