package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	goiptables "github.com/coreos/go-iptables/iptables"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ruleEditor is the small imperative part: chains and single rules in built-in chains,
// which iptables-restore cannot add conditionally. *goiptables.IPTables implements it.
type ruleEditor interface {
	ChainExists(table, chain string) (bool, error)
	NewChain(table, chain string) error
	Exists(table, chain string, rulespec ...string) (bool, error)
	Insert(table, chain string, pos int, rulespec ...string) error
	List(table, chain string) ([]string, error)
}

// newGoIPTables returns go-iptables bound to the flavour's iptables program.
func newGoIPTables(t *xtables.Tools) (ruleEditor, error) {
	proto := goiptables.ProtocolIPv4
	if t.Family == model.IPv6 {
		proto = goiptables.ProtocolIPv6
	}
	ipt, err := goiptables.New(goiptables.IPFamily(proto), goiptables.Path(t.IPTables), goiptables.Timeout(t.WaitSeconds))
	if err != nil {
		return nil, fmt.Errorf("go-iptables for %s: %w", t.IPTables, err)
	}
	return ipt, nil
}

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
		out, err := b.tools.Save(ctx, table)
		if err != nil {
			return nil, err
		}
		saved, err := xtables.ParseSave(out)
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

// saveForm returns a jump rule as iptables-save prints it, to find it in a listing without
// running `iptables -C` for each (on a large legacy table each run copies the whole table).
func (j jumpRule) saveForm() string {
	parts := []string{"-A", j.from}
	for _, a := range j.spec() {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// ensureJumps creates the chains jump rules point at and inserts missing jump rules at the
// top of their built-in chains, as upstream does on every full sync. A rule present
// anywhere in the chain is left where it is.
func (b *Backend) ensureJumps(kv *kernelView) (inserted []string, err error) {
	var errs []error
	for _, j := range append(append([]jumpRule(nil), jumpRules...), kubeletJumpRules...) {
		if !kv.chains[j.table][j.to] {
			if err := b.editor.NewChain(j.table, j.to); err != nil && !isExistsError(err) {
				errs = append(errs, fmt.Errorf("creating chain %s in %s: %w", j.to, j.table, err))
				continue
			}
			if kv.chains[j.table] == nil {
				kv.chains[j.table] = map[string]bool{}
			}
			kv.chains[j.table][j.to] = true
		}
		found := false
		want := j.saveForm()
		for _, r := range kv.builtin[j.table] {
			if r == want {
				found = true
				break
			}
		}
		if !found {
			// The listing may print the rule differently; ask iptables before adding a
			// duplicate.
			ok, err := b.editor.Exists(j.table, j.from, j.spec()...)
			if err != nil {
				errs = append(errs, fmt.Errorf("checking jump %s -> %s in %s: %w", j.from, j.to, j.table, err))
				continue
			}
			found = ok
		}
		if found {
			continue
		}
		if err := b.editor.Insert(j.table, j.from, 1, j.spec()...); err != nil {
			errs = append(errs, fmt.Errorf("inserting jump %s -> %s in %s: %w", j.from, j.to, j.table, err))
			continue
		}
		b.logger.V(2).Info("Inserted jump rule", "table", j.table, "chain", j.from, "target", j.to)
		inserted = append(inserted, j.table+" "+j.from+" -> "+j.to)
	}
	return inserted, errors.Join(errs...)
}

// isExistsError reports whether an iptables error says the chain already exists.
func isExistsError(err error) bool {
	var e *goiptables.Error
	if errors.As(err, &e) && e.ExitStatus() == 1 {
		return true
	}
	return strings.Contains(err.Error(), "already exists") || strings.Contains(err.Error(), "File exists")
}

// canaryPresent reports whether KUBE-PROXY-CANARY is still in mangle (upstream's monitor
// watches mangle first: it is small, so the check is cheap in both flavours).
func (b *Backend) canaryPresent() (bool, error) {
	return b.editor.ChainExists(tableMangle, chainCanary)
}
