package app

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// nodeWarner writes a rate-limited Warning Event on the Node (events.Reporter).
type nodeWarner interface {
	NodeWarning(reason, message string) bool
}

// startupWarnings gathers what sluice finds wrong with its environment while it starts and
// goes on despite: fields of the configuration file only a lenient decode accepts, and
// kernel settings its container may not write. Each one is logged and counted when it is
// found; report then puts each kind in one Warning Event on the Node, once the setup that
// finds them (platform setup, then the backends) is done. Safe for concurrent use.
type startupWarnings struct {
	logger klog.Logger

	mu sync.Mutex
	// config are the configuration file's fields that strict decoding refuses.
	config []config.FieldWarning
	// nodeSetup describes each kernel setting that could not be written.
	nodeSetup []string
}

func newStartupWarnings(logger klog.Logger) *startupWarnings {
	return &startupWarnings{logger: logger}
}

// configFields records the fields of the configuration file that only the lenient decode
// accepted (cmd/sluice has logged each one) and sets sluice_config_warnings.
func (w *startupWarnings) configFields(fields []config.FieldWarning) {
	counts := map[config.FieldWarningKind]int{}
	for _, f := range fields {
		counts[f.Kind]++
	}
	for _, kind := range config.FieldWarningKinds {
		metrics.ConfigWarnings.WithLabelValues(string(kind)).Set(float64(counts[kind]))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.config = append(w.config, fields...)
}

// settingNotWritten records a kernel setting sluice wanted to change and may not: it logs
// the setting, counts it in sluice_node_setup_warnings_total and keeps it for the Event.
func (w *startupWarnings) settingNotWritten(setting string, value int, err error) {
	w.logger.Error(err, "Could not change a kernel setting; going on with its current value. Set it on the node, or let the privileged init container (sluice --init-only) set it",
		"setting", setting, "value", value)
	metrics.NodeSetupWarningsTotal.WithLabelValues(setting).Inc()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nodeSetup = append(w.nodeSetup, fmt.Sprintf("%s=%d (%v)", setting, value, rootCause(err)))
}

// tolerantSysctls returns sysctls below /proc/sys whose refused writes are recorded here.
func (w *startupWarnings) tolerantSysctls() hostnet.Sysctls {
	return hostnet.Tolerant{Sysctls: hostnet.ProcSys{}, Warn: func(name string, value int, err error) {
		w.settingNotWritten(sysctlName(name), value, err)
	}}
}

// tolerantModuleParameters returns module parameters below /sys/module whose refused writes
// are recorded here.
func (w *startupWarnings) tolerantModuleParameters() hostnet.Sysctls {
	return hostnet.Tolerant{Sysctls: hostnet.SysModule(), Warn: func(name string, value int, err error) {
		w.settingNotWritten("/sys/module/"+name, value, err)
	}}
}

// report writes one Warning Event on the Node for each kind of warning recorded so far.
func (w *startupWarnings) report(to nodeWarner) {
	w.mu.Lock()
	fields, settings := w.config, w.nodeSetup
	w.mu.Unlock()
	if len(fields) > 0 {
		described := make([]string, len(fields))
		for i, f := range fields {
			described[i] = f.String()
		}
		to.NodeWarning(events.ReasonConfigurationWarning, fmt.Sprintf(
			"The configuration file has %d field(s) that upstream kube-proxy and sluice accept only leniently: %s. Run `sluice config check` on it and fix them.",
			len(fields), strings.Join(described, "; ")))
	}
	if len(settings) > 0 {
		to.NodeWarning(events.ReasonNodeSetupWarning, fmt.Sprintf(
			"sluice could not change %d kernel setting(s) and runs with their current values: %s. Set them on the node, or let the privileged init container (sluice --init-only) set them.",
			len(settings), strings.Join(settings, "; ")))
	}
}

// sysctlName spells a sysctl as sysctl(8) does: net.ipv4.conf.all.route_localnet.
func sysctlName(path string) string {
	return strings.ReplaceAll(path, "/", ".")
}

// rootCause strips the wrapping of a file error down to the errno's words ("read-only file
// system"), which is what an Event reader needs.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
