package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Removing rules: Cleanup (for `sluice cleanup`), and the leftovers of other modes that a
// start removes.

// ownedByIPTablesMode reports whether a chain belongs to kube-proxy's iptables or ipvs mode
// (and so to sluice). Kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-MARK-DROP, KUBE-IPTABLES-HINT) are not; neither is anything without the KUBE- prefix.
func ownedByIPTablesMode(table, chain string) bool {
	switch chain {
	case chainServices, chainExternalServices, chainNodePorts, chainPostrouting, chainMarkMasq,
		chainForward, chainProxyFirewall, chainCanary:
		return true
	}
	if isServiceChain(chain) || strings.HasPrefix(chain, "KUBE-XLB-") { // KUBE-XLB: before 1.24
		return true
	}
	for _, c := range ipvsOnlyChains[table] {
		if c == chain {
			return true
		}
	}
	return false
}

// ownedByIPVSModeOnly reports whether a chain is one the ipvs mode has and the iptables mode
// does not use.
func ownedByIPVSModeOnly(table, chain string) bool {
	for _, c := range ipvsOnlyChains[table] {
		if c == chain {
			return true
		}
	}
	return false
}

var allBuiltinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// removeChains removes the chains owned(table, chain) selects from one flavour, with the
// rules in built-in chains that jump to them, in one restore per step. It reads the tables
// with iptables-save: slow for a large iptables-nft ruleset, acceptable for a cleanup.
// maxChains bounds the chains deleted per restore (0: no bound).
func removeChains(ctx context.Context, t *tools, owned func(table, chain string) bool, maxChains int) (removed int, err error) {
	out, err := t.runSave(ctx, "")
	if err != nil {
		return 0, err
	}
	type tableState struct {
		chains []string
		jumps  []string
	}
	tables := map[string]*tableState{}
	var order []string
	var cur *tableState
	var curName string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			curName = l[1:]
			cur = &tableState{}
			tables[curName] = cur
			order = append(order, curName)
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			name := strings.Fields(l[1:])[0]
			if !allBuiltinChains[name] && owned(curName, name) {
				cur.chains = append(cur.chains, name)
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) < 2 || !allBuiltinChains[f[1]] {
				continue
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && owned(curName, f[i+1]) {
					cur.jumps = append(cur.jumps, "-D"+l[2:])
				}
			}
		}
	}
	// Step 1: unlink and flush everything. Step 2: delete, in bounded batches.
	first := newRestoreInput()
	var deletes []struct{ table, chain string }
	for _, name := range order {
		ts := tables[name]
		if len(ts.chains) == 0 && len(ts.jumps) == 0 {
			continue
		}
		first.beginTable(name)
		var decls []chainDecl
		for _, c := range ts.chains {
			decls = append(decls, chainDecl{chain: c})
			deletes = append(deletes, struct{ table, chain string }{name, c})
		}
		writeDecls(first, decls)
		for _, j := range ts.jumps {
			first.add(lineOwner{}, j)
		}
		first.commit()
	}
	if first.empty() {
		return 0, nil
	}
	if err := t.runRestore(ctx, first.buf.Bytes()); err != nil {
		return 0, err
	}
	for len(deletes) > 0 {
		n := len(deletes)
		if maxChains > 0 && n > maxChains {
			n = maxChains
		}
		batch := deletes[:n]
		deletes = deletes[n:]
		in := newRestoreInput()
		table := ""
		for _, d := range batch {
			if d.table != table {
				if table != "" {
					in.commit()
				}
				table = d.table
				in.beginTable(table)
			}
			in.add(lineOwner{}, "-X "+d.chain)
		}
		in.commit()
		if err := t.runRestore(ctx, in.buf.Bytes()); err != nil {
			return removed, err
		}
		removed += n
	}
	return removed, nil
}

// Cleanup removes everything kube-proxy's iptables mode (and its ipvs mode's iptables
// rules) or sluice installed for one family, from both iptables flavours: the jumps from
// built-in chains, the KUBE-* chains of filter and nat, and the canaries. Kubelet's
// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-MARK-DROP stay, as upstream leaves them.
// A flavour whose tools are missing or whose tables do not exist is skipped.
func Cleanup(ctx context.Context, family model.IPFamily) error {
	return cleanup(ctx, family, execCommander{}, systemProbe{cmd: execCommander{}, family: family})
}

func cleanup(ctx context.Context, family model.IPFamily, cmd commander, probe flavourProbe) error {
	logger := klog.FromContext(ctx)
	installed, err := installedFlavour(ctx, cmd, family)
	if err != nil {
		installed = ""
	}
	var errs []error
	for _, f := range []Flavour{FlavourLegacy, FlavourNFT} {
		ipt, restore, save := toolNames(family, f, installed)
		if _, err := cmd.LookPath(restore); err != nil {
			continue
		}
		if !probe.inUse(f) || !probe.hasOwnedChains(ctx, f) {
			continue
		}
		t := &tools{flavour: f, installed: installed, family: family, iptables: ipt, restore: restore, save: save, waitSeconds: defaultWaitSeconds, cmd: cmd}
		n, err := removeChains(ctx, t, ownedByIPTablesMode, 5000)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s rules (%s): %w", family, f, err))
			continue
		}
		if n > 0 {
			logger.Info("Removed iptables chains", "ipFamily", family, "flavour", f, "chains", n)
		}
	}
	return errors.Join(errs...)
}

// removeNFTablesLeftovers deletes upstream nftables mode's table (`ip kube-proxy` or
// `ip6 kube-proxy`): a node switched from nftables to iptables mode must not keep serving
// Services through the old table.
func removeNFTablesLeftovers(family model.IPFamily) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("netlink connection for nf_tables: %w", err)
	}
	f := nftables.TableFamilyIPv4
	if family == model.IPv6 {
		f = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(f)
	if err != nil {
		return false, fmt.Errorf("listing nf_tables tables: %w", err)
	}
	found := false
	for _, t := range tables {
		if t.Name == "kube-proxy" {
			c.DelTable(t)
			found = true
		}
	}
	if !found {
		return false, nil
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("deleting nftables table kube-proxy: %w", err)
	}
	return true, nil
}

// ipvsDummyLink is the device upstream's ipvs mode binds Service IPs to.
const ipvsDummyLink = "kube-ipvs0"

// removeIPVSLeftovers removes what upstream's ipvs mode leaves in the kernel when a node
// switches to the iptables mode: the IPVS virtual servers and the kube-ipvs0 device that
// holds every ClusterIP as a local address (with it, the node answers ClusterIP traffic
// itself). Both only if kube-ipvs0 exists: that is the evidence the ipvs mode ran here, and
// other users of IPVS are left alone otherwise. moby/ipvs quietly does nothing when the
// kernel has no IPVS, so the generic netlink family is checked first.
func removeIPVSLeftovers() (bool, error) {
	link, err := netlink.LinkByName(ipvsDummyLink)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return false, nil
		}
		return false, fmt.Errorf("looking up %s: %w", ipvsDummyLink, err)
	}
	var errs []error
	if _, err := netlink.GenlFamilyGet("IPVS"); err == nil {
		h, err := ipvs.New("")
		if err != nil {
			errs = append(errs, fmt.Errorf("opening IPVS: %w", err))
		} else {
			if err := h.Flush(); err != nil {
				errs = append(errs, fmt.Errorf("flushing IPVS virtual servers: %w", err))
			}
			h.Close()
		}
	}
	if err := netlink.LinkDel(link); err != nil {
		errs = append(errs, fmt.Errorf("deleting %s: %w", ipvsDummyLink, err))
	}
	return true, errors.Join(errs...)
}

// ipvsIPSets are the ipvs mode's ipsets, by their IPv4 names: upstream's
// (pkg/proxy/ipvs/ipset.go) and sluice's own KUBE-SLUICE-NO-LOCAL-EPS
// (pkg/dataplane/ipvs/names.go).
var ipvsIPSets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL", "KUBE-LOAD-BALANCER",
	"KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
	"KUBE-SLUICE-NO-LOCAL-EPS",
}

// maxIPSetNameLength is the kernel's limit on ipset names (IPSET_MAXNAMELEN - 1).
const maxIPSetNameLength = 31

// ipvsIPSetNames returns the names of the ipvs mode's ipsets in one family. ipset names are
// global to the network namespace, so the ipvs mode keeps the IPv4 names and names the IPv6
// sets "KUBE-6-...", cut to the kernel's 31 characters (KUBE-6-LOAD-BALANCER-SOURCE-CID).
func ipvsIPSetNames(family model.IPFamily) []string {
	names := make([]string, 0, len(ipvsIPSets))
	for _, name := range ipvsIPSets {
		if family == model.IPv6 {
			name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
			if len(name) > maxIPSetNameLength {
				name = name[:maxIPSetNameLength]
			}
		}
		names = append(names, name)
	}
	return names
}

// removeIPVSIPSets destroys the ipvs mode's ipsets of one family that exist. It must run
// after the rules using them are gone; a set still in use is reported and kept.
func removeIPVSIPSets(family model.IPFamily) (int, error) {
	return removeIPSets(netlinkIPSets{}, ipvsIPSetNames(family))
}

// ipsetDestroyer is the part of the kernel's ipset interface removeIPSets needs; a seam for
// tests.
type ipsetDestroyer interface {
	exists(name string) bool
	destroy(name string) error
}

// netlinkIPSets is the real ipsetDestroyer.
type netlinkIPSets struct{}

func (netlinkIPSets) exists(name string) bool {
	_, err := netlink.IpsetList(name)
	return err == nil
}

func (netlinkIPSets) destroy(name string) error { return netlink.IpsetDestroy(name) }

// removeIPSets destroys every set of names that exists and returns how many it destroyed.
// The failures (a set still referenced by a rule) are joined; the other sets go anyway.
func removeIPSets(k ipsetDestroyer, names []string) (int, error) {
	var errs []error
	n := 0
	for _, name := range names {
		if !k.exists(name) {
			continue
		}
		if err := k.destroy(name); err != nil {
			errs = append(errs, fmt.Errorf("destroying ipset %s: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
