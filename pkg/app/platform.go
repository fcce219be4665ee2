package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"time"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/iptables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// platformSetup does the privileged node setup every mode shares (upstream's
// platformSetup): the OOM score and the conntrack sysctls. Failures to set the OOM score
// are only logged, as upstream.
func platformSetup(ctx context.Context, e *config.Effective) error {
	logger := klog.FromContext(ctx)
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(e.OOMScoreAdj)), 0o644); err != nil {
		logger.Info("Could not set the OOM score", "oomScoreAdj", e.OOMScoreAdj, "err", err)
	}
	return setConntrackSysctls(ctx, e)
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

// modeSetup does what --init-only adds to platformSetup, as upstream's proxiers do under
// --init-only: the node setup the configured mode's backend would do at start, without
// building it. iptables: route_localnet when NodePorts answer on localhost. ipvs: the IPVS
// check, its sysctls (they are shared by both families) and IPVS's timeouts. nftables and
// the recording backend have none.
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
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		cur, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if s := sha256.Sum256(cur); !bytes.Equal(s[:], sum[:]) {
			cancel(fmt.Errorf("configuration file %s changed; exiting so that the new configuration is used", path))
			return
		}
	}
}

// newConntrack returns the stale-entry reconciler of each family.
func newConntrack(families []model.IPFamily) map[model.IPFamily]syncloop.Conntrack {
	out := map[model.IPFamily]syncloop.Conntrack{}
	for _, f := range families {
		out[f] = conntrack.NewReconciler(f)
	}
	return out
}

func setConntrackSysctls(ctx context.Context, e *config.Effective) error {
	if err := conntrack.ApplySysctls(ctx, conntrack.Settings(e.Conntrack)); err != nil {
		return fmt.Errorf("setting conntrack sysctls: %w", err)
	}
	return nil
}
