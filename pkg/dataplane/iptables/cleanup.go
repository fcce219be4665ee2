package iptables

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Cleanup removes everything kube-proxy's iptables mode (and its ipvs mode's iptables
// rules) or sluice installed for one family, from both iptables flavours: the jumps from
// built-in chains, the KUBE-* chains of filter and nat, and the canaries. Kubelet's
// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-MARK-DROP stay, as upstream leaves them.
// A flavour whose tools are missing or whose tables do not exist is skipped.
func Cleanup(ctx context.Context, family model.IPFamily) error {
	return cleanup(ctx, family, xtables.Exec{}, xtables.SystemProbe{})
}

func cleanup(ctx context.Context, family model.IPFamily, cmd xtables.Commander, probe xtables.Probe) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, t := range xtables.ToolsInUse(ctx, cmd, probe, family) {
		if has, err := xtables.HasChains(ctx, probe, t, xtables.KubeProxyChain); err == nil && !has {
			continue
		}
		n, err := xtables.RemoveChains(ctx, t, xtables.KubeProxyChain, xtables.RemoveChainsPerRestore)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s rules (%s): %w", family, t.Flavour, err))
			continue
		}
		if n > 0 {
			logger.Info("Removed iptables chains", "ipFamily", family, "flavour", t.Flavour, "chains", n)
		}
	}
	return errors.Join(errs...)
}
