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
