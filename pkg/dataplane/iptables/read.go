package iptables

import (
	"context"
	"fmt"
	"slices"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
)

// builtinChains are the built-in chains jump rules live in, per table.
var builtinChains = map[string][]string{
	tableNAT:    {"PREROUTING", "OUTPUT", "POSTROUTING"},
	tableFilter: {"INPUT", "FORWARD", "OUTPUT"},
}

// kernelView is what a full sync reads from the kernel before writing.
type kernelView struct {
	// chains lists the chains of each table.
	chains map[string]map[string]bool
	// builtin holds the rules of the built-in chains, as iptables-save prints them
	// ("-A INPUT ..."), keyed by table.
	builtin map[string][]string
	// rules counts the rules of every chain, by table and chain; nil when the chains were
	// listed without their rules (the nft flavour lists names only).
	rules map[string]map[string]int
}

// readKernel lists chains and built-in rules of nat and filter. The legacy flavour reads
// both from one iptables-save per table (its cost is copying the table out of the kernel,
// once). iptables-nft-save is slow on large rulesets (it translates every rule back: 14 s
// for 110 000 chains), so the nft flavour lists chains over netlink and reads only the
// built-in chains with `iptables -S`.
func (b *Backend) readKernel(ctx context.Context) (*kernelView, error) {
	kv := &kernelView{chains: map[string]map[string]bool{}, builtin: map[string][]string{}}
	if b.tools.Flavour == FlavourNFT && !b.opts.listChains {
		for _, table := range []string{tableNAT, tableFilter} {
			chains, err := xtables.ListNFTChains(b.cfg.Family, table)
			if err != nil {
				return nil, err
			}
			kv.chains[table] = chains
			for _, chain := range builtinChains[table] {
				rules, err := b.editor.List(table, chain)
				if err != nil {
					return nil, fmt.Errorf("listing %s %s: %w", table, chain, err)
				}
				kv.builtin[table] = append(kv.builtin[table], rules...)
			}
		}
		return kv, nil
	}
	kv.rules = map[string]map[string]int{}
	for _, table := range []string{tableNAT, tableFilter} {
		saved, err := xtables.ReadSaved(ctx, b.tools, table)
		if err != nil {
			return nil, err
		}
		st := saved[table]
		kv.chains[table] = st.ChainSet()
		kv.rules[table] = map[string]int{}
		if st == nil {
			continue
		}
		for _, r := range st.Rules {
			kv.rules[table][r.Chain]++
			if slices.Contains(builtinChains[table], r.Chain) {
				kv.builtin[table] = append(kv.builtin[table], r.Line)
			}
		}
	}
	return kv, nil
}

// canaryPresent reports whether KUBE-PROXY-CANARY is still in mangle (upstream's monitor
// watches mangle first: it is small, so the check is cheap in both flavours).
func (b *Backend) canaryPresent() (bool, error) {
	return b.editor.ChainExists(tableMangle, chainCanary)
}
