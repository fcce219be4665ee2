package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	goiptables "github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
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
func newGoIPTables(t *tools) (ruleEditor, error) {
	proto := goiptables.ProtocolIPv4
	if t.family == model.IPv6 {
		proto = goiptables.ProtocolIPv6
	}
	ipt, err := goiptables.New(goiptables.IPFamily(proto), goiptables.Path(t.iptables), goiptables.Timeout(t.waitSeconds))
	if err != nil {
		return nil, fmt.Errorf("go-iptables for %s: %w", t.iptables, err)
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
	if b.tools.flavour == FlavourNFT && !b.opts.listChains {
		for _, table := range []string{tableNAT, tableFilter} {
			chains, err := listNFTChains(b.cfg.Family, table)
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
	for _, table := range []string{tableNAT, tableFilter} {
		out, err := b.tools.runSave(ctx, table)
		if err != nil {
			return nil, err
		}
		chains, rules := parseSave(out)
		kv.chains[table] = chains
		if kv.rules == nil {
			kv.rules = map[string]map[string]int{}
		}
		kv.rules[table] = map[string]int{}
		for _, r := range rules {
			if f := strings.Fields(r); len(f) > 1 {
				kv.rules[table][f[1]]++
			}
		}
		for _, r := range rules {
			for _, bc := range builtinChains[table] {
				if strings.HasPrefix(r, "-A "+bc+" ") {
					kv.builtin[table] = append(kv.builtin[table], r)
				}
			}
		}
	}
	return kv, nil
}

// parseSave returns the chains and rule lines of one table's iptables-save output.
func parseSave(out []byte) (chains map[string]bool, rules []string) {
	chains = map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, ":"):
			if i := strings.IndexByte(l, ' '); i > 1 {
				chains[l[1:i]] = true
			}
		case strings.HasPrefix(l, "-A "):
			rules = append(rules, l)
		}
	}
	return chains, rules
}

// listNFTChains lists the chains of an iptables-nft table over netlink: one dump of the
// table's chains, reading only their names. (google/nftables' ListChains decodes every
// chain of every table in full: 6.5 s for 110 000 chains; this takes a fraction of that.)
func listNFTChains(family model.IPFamily, table string) (map[string]bool, error) {
	fam := uint8(unix.NFPROTO_IPV4)
	if family == model.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: fam, Version: nl.NFNETLINK_V0})
	// The kernel filters the dump by table; older kernels ignore the attribute, and the
	// table of each chain is checked here anyway.
	req.AddData(nl.NewRtAttr(unix.NFTA_CHAIN_TABLE, nl.ZeroTerminated(table)))
	out := map[string]bool{}
	err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if len(msg) < nl.SizeofNfgenmsg {
			return true
		}
		var name, tbl string
		nlattr.Walk(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
			switch typ {
			case unix.NFTA_CHAIN_TABLE:
				tbl = nlattr.String(v)
			case unix.NFTA_CHAIN_NAME:
				name = nlattr.String(v)
			}
		})
		if tbl == table && name != "" {
			out[name] = true
		}
		return true
	})
	if errors.Is(err, unix.ENOENT) {
		// No such table: no chains.
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing nf_tables chains of %s: %w", table, err)
	}
	return out, nil
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
