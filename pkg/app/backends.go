package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/iptables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/pkg/dataplane/nftables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/recording"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// newBackends builds one backend per family. Each removes the other modes' leftovers
// after its first successful sync (leftovers.RemoveOtherModes). The sysctls a mode sets
// (iptables: route_localnet; ipvs: its net/ipv4/vs and ARP settings) go through sysctls.
func newBackends(ctx context.Context, mode dataplane.Mode, e *config.Effective, node model.NodeInfo, families []model.IPFamily, sysctls hostnet.Sysctls) ([]dataplane.Backend, error) {
	var out []dataplane.Backend
	for _, f := range families {
		cfg := e.DataplaneConfig(f, node)
		var b dataplane.Backend
		var err error
		switch mode {
		case dataplane.ModeIPTables:
			b, err = iptables.New(ctx, cfg, iptables.WithSysctls(sysctls))
		case dataplane.ModeNFTables:
			b, err = nftables.New(ctx, cfg)
		case dataplane.ModeIPVS:
			b, err = ipvs.New(ctx, cfg, ipvsSettings(e, f), ipvs.WithSysctls(sysctls))
		case dataplane.ModeRecording:
			b = recording.New(f)
		default:
			err = fmt.Errorf("mode %q has no backend in this build", mode)
		}
		if err != nil {
			return nil, fmt.Errorf("setting up the %s backend for %s: %w", mode, f, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// ipvsSettings is the ipvs section of the configuration for one family.
func ipvsSettings(e *config.Effective, f model.IPFamily) ipvs.Settings {
	return ipvs.Settings{
		Scheduler:     e.IPVS.Scheduler,
		ExcludeCIDRs:  e.IPVS.ExcludeCIDRsOf(f),
		StrictARP:     e.IPVS.StrictARP,
		TCPTimeout:    e.IPVS.TCPTimeout,
		TCPFinTimeout: e.IPVS.TCPFinTimeout,
		UDPTimeout:    e.IPVS.UDPTimeout,
	}
}

// cleanupAll removes what any mode (sluice's or upstream kube-proxy's) installed, for
// both families, and reports every failure.
func cleanupAll(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, f := range model.Families {
		for name, fn := range map[string]func(context.Context, model.IPFamily) error{
			"iptables": iptables.Cleanup,
			"nftables": nftables.Cleanup,
			"ipvs":     ipvs.Cleanup,
		} {
			if err := fn(ctx, f); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", name, f, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	logger.Info("Removed every proxy rule sluice or kube-proxy installed")
	return nil
}

// supportedFamilies returns the families this host can proxy: IPv4, and IPv6 unless the
// kernel has it off (or, for the modes that need them, ip6tables is missing), the same
// checks upstream uses to choose dual-stack.
func supportedFamilies(ctx context.Context, mode dataplane.Mode) []model.IPFamily {
	families := []model.IPFamily{model.IPv4}
	if _, err := os.Stat("/proc/net/if_inet6"); err != nil {
		klog.FromContext(ctx).Info("IPv6 is not available; proxying IPv4 only")
		return families
	}
	if v, err := (hostnet.ProcSys{}).Get("net/ipv6/conf/all/disable_ipv6"); err == nil && v == 1 {
		klog.FromContext(ctx).Info("IPv6 is disabled; proxying IPv4 only")
		return families
	}
	if mode == dataplane.ModeIPTables || mode == dataplane.ModeIPVS {
		if _, err := exec.LookPath("ip6tables-restore"); err != nil {
			klog.FromContext(ctx).Info("ip6tables-restore not found; proxying IPv4 only")
			return families
		}
	}
	return append(families, model.IPv6)
}

// familyNames spells families for logs ("IPv4", "IPv6"): a []model.IPFamily is a byte
// slice underneath, which structured loggers print as base64 ("BAY=").
func familyNames(families []model.IPFamily) []string {
	out := make([]string, 0, len(families))
	for _, f := range families {
		out = append(out, f.String())
	}
	return out
}
