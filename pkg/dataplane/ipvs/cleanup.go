package ipvs

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Cleanup removes what the ipvs mode, sluice's or upstream kube-proxy's, installed for one
// family: the virtual servers, the family's addresses on kube-ipvs0 (and the device once it
// holds none), the kube-proxy chains of nat, filter and mangle in both iptables flavours
// (the iptables mode's too: both modes share KUBE-SERVICES and KUBE-MARK-MASQ, so neither
// can go alone), and the family's ipsets.
//
// IPVS is touched only where the ipvs mode evidently ran (kube-ipvs0 or one of its ipsets
// exists): then every virtual server of the family goes, as upstream's --cleanup flushes
// them all (ipvs.excludeCIDRs is not known here). Without that evidence, or on a kernel
// without IPVS, nothing of IPVS is touched and Cleanup still succeeds: it runs on every
// host, whatever mode ran there.
func Cleanup(ctx context.Context, family model.IPFamily) error {
	deps := cleanupDeps{supported: KernelSupportsIPVS}
	links, err := newNetlinkLinks()
	if err != nil {
		return err
	}
	defer links.close()
	deps.links = links
	sets, err := newNetlinkIPSets()
	if err != nil {
		return err
	}
	defer sets.close()
	deps.sets = sets
	deps.openIPVS = func() (ipvsKernel, func(), error) {
		h, err := newMobyIPVS()
		if err != nil {
			return nil, nil, err
		}
		return h, h.close, nil
	}
	deps.runners = installedRunners(ctx, family)
	return cleanup(ctx, family, deps)
}

// cleanupDeps are Cleanup's seams.
type cleanupDeps struct {
	supported func() (bool, error)
	openIPVS  func() (ipvsKernel, func(), error)
	links     linkKernel
	sets      ipsetKernel
	runners   []xtables.Runner
}

func cleanup(ctx context.Context, family model.IPFamily, d cleanupDeps) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", family.String())
	var errs []error

	linkExists, addrs, err := d.links.Dummy(dummyDevice)
	if err != nil {
		errs = append(errs, err)
	}
	var present []ipsetID
	for id := ipsetID(0); id < numIPSets; id++ {
		if _, err := d.sets.List(ipsetName(id, family)); err == nil {
			present = append(present, id)
		}
	}

	// IPVS: only where the ipvs mode ran, and only when the kernel has IPVS (moby/ipvs
	// reports success for everything on a kernel without it).
	if linkExists || len(present) > 0 {
		supported, err := d.supported()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("probe the kernel for IPVS: %w", err))
		case supported:
			n, err := deleteVirtualServers(d, family)
			if err != nil {
				errs = append(errs, err)
			}
			if n > 0 {
				logger.Info("Deleted IPVS virtual servers", "count", n)
			}
		}
	}

	// The device: this family's addresses, then the device when nothing is left on it.
	if linkExists {
		remaining := 0
		for _, a := range addrs {
			switch {
			case a.IsLinkLocalUnicast():
			case model.FamilyOf(a) != family:
				remaining++
			default:
				if err := d.links.DelAddr(dummyDevice, a); err != nil && !errors.Is(err, errNotExist) {
					errs = append(errs, fmt.Errorf("remove %s from %s: %w", a, dummyDevice, err))
					remaining++
				}
			}
		}
		if remaining == 0 {
			if err := d.links.DeleteLink(dummyDevice); err != nil && !errors.Is(err, errNotExist) {
				errs = append(errs, fmt.Errorf("delete %s: %w", dummyDevice, err))
			} else {
				logger.Info("Deleted the IPVS dummy device", "device", dummyDevice)
			}
		}
	}

	// Chains before sets: ipset refuses to destroy a set that a rule still uses.
	for _, r := range d.runners {
		n, err := xtables.RemoveChains(ctx, r, xtables.KubeProxyChain, xtables.RemoveChainsPerRestore)
		if err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			logger.Info("Removed kube-proxy iptables chains", "chains", n)
		}
	}
	for _, id := range present {
		name := ipsetName(id, family)
		if err := d.sets.Destroy(name); err != nil && !errors.Is(err, errNotExist) {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", name, err))
		}
	}
	if len(present) > 0 {
		logger.Info("Destroyed the ipvs mode's ipsets", "count", len(present))
	}
	return errors.Join(errs...)
}

func deleteVirtualServers(d cleanupDeps, family model.IPFamily) (int, error) {
	h, closeFn, err := d.openIPVS()
	if err != nil {
		return 0, err
	}
	defer closeFn()
	all, err := h.Services()
	if err != nil {
		return 0, fmt.Errorf("list IPVS services: %w", err)
	}
	var errs []error
	n := 0
	for k := range all {
		if model.FamilyOf(k.Addr) != family {
			continue
		}
		if err := h.DeleteService(k); err != nil && !errors.Is(err, errNotExist) {
			errs = append(errs, fmt.Errorf("delete IPVS virtual server %s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// installedRunners returns a runner for each installed iptables flavour whose tables exist
// in this network namespace.
func installedRunners(ctx context.Context, family model.IPFamily) []xtables.Runner {
	var out []xtables.Runner
	for _, t := range xtables.ToolsInUse(ctx, xtables.Exec{}, xtables.SystemProbe{}, family) {
		out = append(out, t)
	}
	return out
}
