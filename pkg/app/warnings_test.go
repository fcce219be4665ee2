package app

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
)

func TestStartupWarningsAreLoggedCountedAndReportedOnce(t *testing.T) {
	logger, logs := bufferLogger()
	w := newStartupWarnings(logger)
	w.configFields([]config.FieldWarning{{Kind: config.UnknownField, Path: "iptables.syncPerod"}, {Kind: config.DuplicateField, Path: "mode"}, {Kind: config.UnknownField, Path: "bogus"}})
	if got := metricstest.Value(t, metrics.ConfigWarnings.WithLabelValues("unknown_field")); got != 2 {
		t.Errorf("sluice_config_warnings{unknown_field} = %v, want 2", got)
	}
	if got := metricstest.Value(t, metrics.ConfigWarnings.WithLabelValues("duplicate_field")); got != 1 {
		t.Errorf("sluice_config_warnings{duplicate_field} = %v, want 1", got)
	}

	const setting = "net.netfilter.nf_conntrack_tcp_timeout_established"
	before := metricstest.Value(t, metrics.NodeSetupWarningsTotal.WithLabelValues(setting))
	refused := &os.PathError{Op: "open", Path: "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established", Err: syscall.EROFS}
	w.settingNotWritten(setting, 3600, refused)
	if got := metricstest.Value(t, metrics.NodeSetupWarningsTotal.WithLabelValues(setting)) - before; got != 1 {
		t.Errorf("sluice_node_setup_warnings_total{setting=%s} grew by %v, want 1", setting, got)
	}
	if out := logs.String(); !strings.Contains(out, "Could not change a kernel setting") || !strings.Contains(out, `setting="`+setting+`"`) || !strings.Contains(out, "value=3600") {
		t.Errorf("log:\n%s", out)
	}

	var to recordedWarnings
	w.report(&to)
	if len(to.events) != 2 {
		t.Fatalf("Events %q, want one per kind", to.events)
	}
	for i, want := range []string{
		`ConfigurationWarning: The configuration file has 3 field(s) that upstream kube-proxy and sluice accept only leniently: unknown field "iptables.syncPerod" (ignored); duplicate field "mode" (the last value is used); unknown field "bogus" (ignored).`,
		"NodeSetupWarning: sluice could not change 1 kernel setting(s) and runs with their current values: " + setting + "=3600 (read-only file system).",
	} {
		if !strings.HasPrefix(to.events[i], want) {
			t.Errorf("Event %d:\n got %s\nwant %s...", i, to.events[i], want)
		}
	}
}

func TestNoWarningsNoEvents(t *testing.T) {
	logger, _ := bufferLogger()
	w := newStartupWarnings(logger)
	w.configFields(nil)
	var to recordedWarnings
	w.report(&to)
	if len(to.events) != 0 {
		t.Errorf("Events %q", to.events)
	}
}

// The daemon's sysctls go through hostnet.Tolerant: a write the container may not make is
// recorded here under sysctl(8)'s name, and the setup goes on.
func TestTolerantSysctlsNameTheSetting(t *testing.T) {
	logger, _ := bufferLogger()
	w := newStartupWarnings(logger)
	s := w.tolerantSysctls().(hostnet.Tolerant)
	s.Warn("net/ipv4/conf/all/route_localnet", 1, &os.PathError{Op: "open", Err: syscall.EACCES})
	p := w.tolerantModuleParameters().(hostnet.Tolerant)
	p.Warn("nf_conntrack/parameters/hashsize", 32768, &os.PathError{Op: "open", Err: syscall.EROFS})
	if len(w.nodeSetup) != 2 || !strings.HasPrefix(w.nodeSetup[0], "net.ipv4.conf.all.route_localnet=1 (permission denied)") ||
		!strings.HasPrefix(w.nodeSetup[1], "/sys/module/nf_conntrack/parameters/hashsize=32768 (read-only file system)") {
		t.Errorf("recorded %q", w.nodeSetup)
	}
}
