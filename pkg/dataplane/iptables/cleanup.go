package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Removing rules: Cleanup (for `sluice cleanup`), and the other modes' iptables chains that
// a start removes (their nftables table, IPVS state and ipsets go through package
// leftovers).

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
