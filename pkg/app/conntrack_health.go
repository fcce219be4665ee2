package app

import (
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// registerConntrackHealth makes the conntrack table's size and the kernel's conntrack
// statistics part of /metrics (sluice_conntrack_*, read on each scrape) in every mode, and
// returns the Monitor the status report reads too. A registration that fails (a second
// Run in one process) only costs the metrics.
func registerConntrackHealth(logger klog.Logger) *conntrack.Monitor {
	m := conntrack.NewMonitor()
	if err := metrics.Registry.Register(m); err != nil {
		logger.Error(err, "Could not register the conntrack metrics")
	}
	return m
}
