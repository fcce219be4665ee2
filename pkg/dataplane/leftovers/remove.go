package leftovers

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// What each mode removes of the others', after its own first successful sync ("own":
// the mode's own state, which its syncs converge):
//
//	                                            mode iptables  mode ipvs  mode nftables
//	the nftables mode's table (of the family)   removed        removed    own
//	IPVS virtual servers and kube-ipvs0         removed        own        removed
//	kube-proxy chains, the other flavour        removed        removed    removed (both flavours)
//	the ipvs mode's chains, own flavour         removed        own
//	the iptables mode's chains, own flavour     own            (a)
//	the ipvs mode's ipsets (of the family)      removed        own        removed
//
// (a) The ipvs mode shares KUBE-SERVICES, KUBE-MARK-MASQ and KUBE-POSTROUTING with the
// iptables mode, so it removes the iptables mode's other chains (and the jumps to them)
// in the restore of its full syncs that rewrites those shared chains (ipvs.planFixes): a
// KUBE-SERVICES that still jumps to a KUBE-SVC-* chain cannot exist without it, and the
// first full sync has done it before this runs.
//
// Everything else is the same for every mode: what one mode leaves, the others remove.

// RemoveOtherModes removes, for family, what the proxy modes other than mode (sluice's or
// kube-proxy's) left in this network namespace; see the table above. A backend calls it
// once, after its first successful sync, when its own rules serve every Service: removing
// the old rules before would leave the node without any for a while, and until then both
// sets are active, which is harmless (nat PREROUTING and OUTPUT DNAT a packet once, and
// IPVS only sees packets still addressed to the node after that).
//
// own are the iptables programs the mode writes with (nil for nftables). Every step runs
// whatever the others' outcome; what was removed and what failed is logged with logger.
// Nothing is retried and the sync does not fail: the leftovers are rules for the same
// Services, which at worst send a new connection where the old ruleset would have, until
// an operator runs `sluice cleanup`.
//
// IPVS and kube-ipvs0 are shared by both families: the first family's backend to get here
// flushes every virtual server, so on a dual-stack node switched from the ipvs mode the
// other family's Services are without IPVS until its own first sync, a moment later in the
// same pass of the sync loop.
func RemoveOtherModes(ctx context.Context, logger klog.Logger, mode dataplane.Mode, family model.IPFamily, own *xtables.Tools) {
	r := &remover{mode: mode, family: family, own: own, cmd: xtables.Exec{}, probe: xtables.SystemProbe{}, kernel: netlinkKernel{}, logger: logger}
	if err := r.run(ctx); err != nil {
		logger.Error(err, "Could not remove all leftovers of other proxy modes")
	}
}

// kernelState is what RemoveOtherModes removes besides iptables chains; a seam for tests.
type kernelState interface {
	deleteNFTablesTable(family model.IPFamily) (bool, error)
	removeIPVSServersAndDevice() (bool, error)
	destroyIPVSIPSets(family model.IPFamily) (int, error)
}

type netlinkKernel struct{}

func (netlinkKernel) deleteNFTablesTable(f model.IPFamily) (bool, error) {
	return DeleteNFTablesTable(f)
}
func (netlinkKernel) removeIPVSServersAndDevice() (bool, error)       { return RemoveIPVSServersAndDevice() }
func (netlinkKernel) destroyIPVSIPSets(f model.IPFamily) (int, error) { return DestroyIPVSIPSets(f) }

type remover struct {
	mode   dataplane.Mode
	family model.IPFamily
	own    *xtables.Tools
	cmd    xtables.Commander
	probe  xtables.Probe
	kernel kernelState
	logger klog.Logger
}

func (r *remover) run(ctx context.Context) error {
	var errs []error
	if r.mode != dataplane.ModeNFTables {
		if removed, err := r.kernel.deleteNFTablesTable(r.family); err != nil {
			errs = append(errs, fmt.Errorf("the nftables mode's table: %w", err))
		} else if removed {
			r.logger.Info("Removed the nftables mode's table", "table", NFTablesTable)
		}
	}
	if r.mode != dataplane.ModeIPVS {
		if found, err := r.kernel.removeIPVSServersAndDevice(); err != nil {
			errs = append(errs, fmt.Errorf("the ipvs mode's virtual servers and %s: %w", IPVSDevice, err))
		} else if found {
			r.logger.Info("Removed the ipvs mode's virtual servers and device", "device", IPVSDevice)
		}
	}
	// Chains before sets: the kernel refuses to destroy a set a rule still uses.
	errs = append(errs, r.removeChains(ctx)...)
	if r.mode != dataplane.ModeIPVS {
		if n, err := r.kernel.destroyIPVSIPSets(r.family); err != nil {
			errs = append(errs, fmt.Errorf("the ipvs mode's ipsets: %w", err))
		} else if n > 0 {
			r.logger.Info("Removed the ipvs mode's ipsets", "ipsets", n)
		}
	}
	return errors.Join(errs...)
}

// removeChains removes the other modes' chains from each iptables flavour that has any.
func (r *remover) removeChains(ctx context.Context) []error {
	installed := xtables.Flavour("")
	if r.own != nil {
		installed = r.own.Installed
	} else if f, err := xtables.Installed(ctx, r.cmd, r.family); err == nil {
		installed = f
	}
	var errs []error
	for _, f := range []xtables.Flavour{xtables.Legacy, xtables.NFT} {
		t := xtables.NewTools(r.cmd, r.family, f, installed)
		if r.own != nil && f == r.own.Flavour {
			t = r.own
		}
		owned := r.otherModesChains(f)
		if owned == nil || !t.Available() || !r.probe.InUse(t) {
			continue
		}
		if has, err := xtables.HasChains(ctx, r.probe, t, owned); err == nil && !has {
			continue
		}
		n, err := xtables.RemoveChains(ctx, t, owned, xtables.RemoveChainsPerRestore)
		if err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy chains in the %s iptables flavour: %w", f, err))
		} else if n > 0 {
			r.logger.Info("Removed other proxy modes' iptables chains", "flavour", f, "chains", n)
		}
	}
	return errs
}

// otherModesChains says which chains of flavour f are other modes' (nil: none to look for).
func (r *remover) otherModesChains(f xtables.Flavour) func(table, chain string) bool {
	switch {
	case r.mode == dataplane.ModeNFTables:
		return xtables.KubeProxyChain
	case r.own == nil:
		// An iptables-based mode whose flavour is not known: any chain may be its own.
		return nil
	case f != r.own.Flavour:
		return xtables.KubeProxyChain
	}
	switch r.mode {
	case dataplane.ModeIPTables:
		return func(table, chain string) bool {
			return xtables.IPVSModeChain(table, chain) && !xtables.IPTablesModeChain(table, chain)
		}
	case dataplane.ModeIPVS:
		return nil // (a) above
	}
	return xtables.KubeProxyChain
}
