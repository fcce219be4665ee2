package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/iptables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// oomScoreAdjPath is where a process sets its own OOM score.
const oomScoreAdjPath = "/proc/self/oom_score_adj"

// setOOMScore sets this process's oom_score_adj, unless it has that value already. A
// failure is a warning, never a reason not to start (upstream only logs it): lowering the
// score needs CAP_SYS_RESOURCE, which a hardened container may not grant, and the kubelet's
// score for a critical pod is close anyway.
func setOOMScore(score int, warnings *startupWarnings) {
	if cur, err := os.ReadFile(oomScoreAdjPath); err == nil && strings.TrimSpace(string(cur)) == strconv.Itoa(score) {
		return
	}
	if err := os.WriteFile(oomScoreAdjPath, []byte(strconv.Itoa(score)), 0o644); err != nil {
		warnings.settingNotWritten("oom_score_adj", score, err)
	}
}

// setConntrackSysctls sets the conntrack sysctls every mode shares (upstream's
// platformSetup) through k: the machine's own for --init-only, where a failure is an error,
// or tolerant ones that turn a write the container may not make into a warning.
func setConntrackSysctls(ctx context.Context, e *config.Effective, k conntrack.Kernel) error {
	if err := conntrack.ApplySysctls(ctx, e.Conntrack, k); err != nil {
		return fmt.Errorf("setting conntrack sysctls: %w", err)
	}
	return nil
}

// modeSetupSteps are the privileged setup steps of the modes that have any beyond
// platformSetup; a seam for tests.
type modeSetupSteps struct {
	iptables func(context.Context, dataplane.Config) error
	ipvs     func(context.Context, ipvs.Settings) error
}

// kernelModeSetup are the real steps, each the one its backend's constructor takes.
var kernelModeSetup = modeSetupSteps{
	iptables: func(ctx context.Context, cfg dataplane.Config) error { return iptables.ApplySysctls(ctx, cfg) },
	ipvs:     func(ctx context.Context, s ipvs.Settings) error { return ipvs.ApplyKernelSettings(ctx, s) },
}

// modeSetup does what --init-only adds to the conntrack sysctls, as upstream's proxiers do under
// --init-only: the node setup the configured mode's backend would do at start, without
// building it. iptables: route_localnet when NodePorts answer on localhost. ipvs: the IPVS
// check, its sysctls (they are shared by both families) and IPVS's timeouts. nftables and
// the recording backend have none. Every failure is an error: the privileged init container
// that runs it exists to make these writes.
//
// No Node object is read (--init-only stops before sluice talks to the API server), so a
// nodePortAddresses "primary" resolves to no address and NodePorts count as served on every
// address: route_localnet is set whenever localhost NodePorts may be in use, as upstream
// does when it cannot learn the node's IP (it then takes 127.0.0.1 as the primary one).
func modeSetup(ctx context.Context, mode dataplane.Mode, e *config.Effective, families []model.IPFamily, steps modeSetupSteps) error {
	var node model.NodeInfo
	switch mode {
	case dataplane.ModeIPTables:
		for _, f := range families {
			if err := steps.iptables(ctx, e.DataplaneConfig(f, node)); err != nil {
				return fmt.Errorf("iptables mode setup for %s: %w", f, err)
			}
		}
	case dataplane.ModeIPVS:
		if err := steps.ipvs(ctx, ipvsSettings(e, model.IPv4)); err != nil {
			return fmt.Errorf("ipvs mode setup: %w", err)
		}
	}
	return nil
}

// watchConfigFile ends sluice when its configuration file changes, so that the DaemonSet
// restarts it with the new content (upstream does the same with fsnotify). It polls the
// content: a ConfigMap update swaps a symlink, which a watch on the file itself misses.
func watchConfigFile(ctx context.Context, path string, cancel context.CancelCauseFunc) {
	initial, err := os.ReadFile(path)
	if err != nil {
		return
	}
	sum := sha256.Sum256(initial)
	_ = wait.PollUntilContextCancel(ctx, 2*time.Second, false, func(context.Context) (bool, error) {
		cur, err := os.ReadFile(path)
		if err != nil {
			return false, nil
		}
		if s := sha256.Sum256(cur); !bytes.Equal(s[:], sum[:]) {
			cancel(fmt.Errorf("configuration file %s changed; exiting so that the new configuration is used", path))
			return true, nil
		}
		return false, nil
	})
}

// newConntrack returns the stale-entry reconciler of each family.
func newConntrack(families []model.IPFamily) map[model.IPFamily]syncloop.Conntrack {
	out := map[model.IPFamily]syncloop.Conntrack{}
	for _, f := range families {
		out[f] = conntrack.NewReconciler(f)
	}
	return out
}
