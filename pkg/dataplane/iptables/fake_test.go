package iptables

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
)

// fakeKernel is a stateful, validating stand-in for the iptables programs and the tables
// they edit, so that the backend's apply logic runs without root. It implements xtables.Commander
// (iptables-restore, iptables-save, iptables --version) and ruleEditor, keeps tables of
// chains of rules, commits each table of a restore atomically at COMMIT, and refuses what
// the real programs refuse: rules in or jumping to missing chains, -D of a missing rule,
// -X of a missing or referenced chain. Errors come out in the real programs' words, in
// the legacy or the nft flavour, so that error attribution is tested against both.
type fakeKernel struct {
	mu      sync.Mutex
	flavour Flavour
	tables  map[string]*fakeTable
	// rejectAtCommit, when set, refuses a table at COMMIT if it returns true for one of its
	// rules, as the kernel refuses a rule its checks do not accept.
	rejectAtCommit func(table, chain string, rule *fakeRule) bool
	// restores records every restore input.
	restores []string
	// calls counts commands by program name.
	calls map[string]int
}

type fakeTable struct {
	chains map[string]*fakeChain
}

type fakeChain struct {
	builtin bool
	rules   []*fakeRule
}

// fakeRule is one rule: its text as written (after "-A CHAIN ") and its arguments.
type fakeRule struct {
	spec string
	args []string
}

var fakeBuiltins = map[string][]string{
	tableFilter: {"INPUT", "FORWARD", "OUTPUT"},
	tableNAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	tableMangle: {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

func newFakeKernel(f Flavour) *fakeKernel {
	k := &fakeKernel{flavour: f, tables: map[string]*fakeTable{}, calls: map[string]int{}}
	for name, chains := range fakeBuiltins {
		t := &fakeTable{chains: map[string]*fakeChain{}}
		for _, c := range chains {
			t.chains[c] = &fakeChain{builtin: true}
		}
		k.tables[name] = t
	}
	return k
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{chains: make(map[string]*fakeChain, len(t.chains))}
	for name, ch := range t.chains {
		c.chains[name] = &fakeChain{builtin: ch.builtin, rules: slices.Clone(ch.rules)}
	}
	return c
}

func isStandardTarget(t string) bool {
	switch t {
	case "ACCEPT", "DROP", "RETURN", "REJECT", "DNAT", "SNAT", "MASQUERADE", "MARK", "LOG":
		return true
	}
	return false
}

func sameArgs(a, b []string) bool { return slices.Equal(a, b) }

// restoreFailure is an error in the flavour's words.
type restoreFailure struct {
	line int
	msg  string
	// atCommit: the kernel refused the table (legacy names the COMMIT line).
	atCommit bool
}

func (k *fakeKernel) format(f restoreFailure, program string) (string, int) {
	if k.flavour == FlavourNFT {
		if f.atCommit {
			return fmt.Sprintf("%s v1.8.9 (nf_tables): \nline %d: RULE_APPEND failed (Invalid argument): %s\n", program, f.line, f.msg), 4
		}
		return fmt.Sprintf("%s v1.8.9 (nf_tables): %s\nError occurred at line: %d\nTry `%s -h' for more information.\n", program, f.msg, f.line, program), 2
	}
	if f.atCommit {
		return fmt.Sprintf("%s: line %d failed\n", program, f.line), 1
	}
	return fmt.Sprintf("%s v1.8.9 (legacy): %s\nError occurred at line: %d\nTry `%s -h' for more information.\n", program, f.msg, f.line, program), 2
}

// restore applies restore input with --noflush semantics.
func (k *fakeKernel) restore(input string) *restoreFailure {
	k.restores = append(k.restores, input)
	var tx *fakeTable
	var txName string
	var ruleLines map[*fakeRule]int
	sc := bufio.NewScanner(strings.NewReader(input))
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	n := 0
	for sc.Scan() {
		n++
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "*") {
			name := l[1:]
			t, ok := k.tables[name]
			if !ok {
				return &restoreFailure{line: n, msg: "table '" + name + "' does not exist"}
			}
			tx, txName, ruleLines = t.clone(), name, map[*fakeRule]int{}
			continue
		}
		if tx == nil {
			return &restoreFailure{line: n, msg: "no command specified"}
		}
		if l == "COMMIT" {
			if k.rejectAtCommit != nil {
				for cname, ch := range tx.chains {
					for _, r := range ch.rules {
						if k.rejectAtCommit(txName, cname, r) {
							line := n
							if k.flavour == FlavourNFT {
								line = ruleLines[r]
							}
							return &restoreFailure{line: line, msg: "rule in chain " + cname, atCommit: true}
						}
					}
				}
			}
			k.tables[txName] = tx
			tx = nil
			continue
		}
		if strings.HasPrefix(l, ":") {
			f := strings.Fields(l[1:])
			name := f[0]
			if ch, ok := tx.chains[name]; ok {
				if !ch.builtin {
					ch.rules = nil
				}
			} else {
				tx.chains[name] = &fakeChain{}
			}
			continue
		}
		args := xtables.SplitArgs(l)
		if len(args) < 2 {
			return &restoreFailure{line: n, msg: "bad line"}
		}
		cmd, chain := args[0], args[1]
		ch, ok := tx.chains[chain]
		switch cmd {
		case "-A", "-I", "-D":
			if !ok {
				return &restoreFailure{line: n, msg: "Chain '" + chain + "' does not exist"}
			}
			rest := args[2:]
			pos := 1
			if cmd == "-I" && len(rest) > 0 {
				if p, err := strconv.Atoi(rest[0]); err == nil {
					pos, rest = p, rest[1:]
				}
			}
			spec := specOf(l, cmd == "-I" && len(args) > 2 && len(rest) < len(args[2:]))
			if tgt := xtables.TargetOf(rest); tgt != "" && !isStandardTarget(tgt) {
				if _, ok := tx.chains[tgt]; !ok {
					return &restoreFailure{line: n, msg: "Couldn't load target `" + tgt + "':No such file or directory"}
				}
			}
			r := &fakeRule{spec: spec, args: rest}
			switch cmd {
			case "-A":
				ch.rules = append(ch.rules, r)
				ruleLines[r] = n
			case "-I":
				if pos < 1 || pos > len(ch.rules)+1 {
					return &restoreFailure{line: n, msg: "Index of insertion too big."}
				}
				ch.rules = slices.Insert(ch.rules, pos-1, r)
				ruleLines[r] = n
			case "-D":
				i := slices.IndexFunc(ch.rules, func(x *fakeRule) bool { return sameArgs(x.args, rest) })
				if i < 0 {
					return &restoreFailure{line: n, msg: "Bad rule (does a matching rule exist in that chain?)", atCommit: k.flavour == FlavourLegacy}
				}
				ch.rules = slices.Delete(ch.rules, i, i+1)
			}
		case "-X":
			if !ok || ch.builtin {
				return &restoreFailure{line: n, msg: "No chain/target/match by that name.", atCommit: k.flavour == FlavourLegacy}
			}
			for _, other := range tx.chains {
				for _, r := range other.rules {
					if xtables.TargetOf(r.args) == chain {
						return &restoreFailure{line: n, msg: "Too many links", atCommit: k.flavour == FlavourLegacy}
					}
				}
			}
			if len(ch.rules) > 0 {
				return &restoreFailure{line: n, msg: "Directory not empty", atCommit: k.flavour == FlavourLegacy}
			}
			delete(tx.chains, chain)
		default:
			return &restoreFailure{line: n, msg: "unknown command " + cmd}
		}
	}
	if tx != nil {
		return &restoreFailure{line: n, msg: "COMMIT expected"}
	}
	return nil
}

// specOf returns the text of a rule line after "-A CHAIN " (or "-I CHAIN N ").
func specOf(l string, hasPos bool) string {
	f := 2
	if hasPos {
		f = 3
	}
	s := l
	for i := 0; i < f; i++ {
		j := strings.IndexByte(s, ' ')
		if j < 0 {
			return ""
		}
		s = s[j+1:]
	}
	return s
}

// Run implements xtables.Commander.
func (k *fakeKernel) Run(_ context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls[name]++
	switch {
	case slices.Contains(args, "--version"):
		return []byte(fmt.Sprintf("iptables v1.8.9 (%s)\n", map[Flavour]string{FlavourNFT: "nf_tables", FlavourLegacy: "legacy"}[k.flavour])), nil, nil
	case strings.HasSuffix(name, "-restore"):
		if f := k.restore(string(stdin)); f != nil {
			msg, code := k.format(*f, name)
			_ = code
			return nil, []byte(msg), xtables.ErrExit
		}
		return nil, nil, nil
	case strings.HasSuffix(name, "-save"):
		table := ""
		if len(args) == 2 && args[0] == "-t" {
			table = args[1]
		}
		return []byte(k.save(table)), nil, nil
	}
	return nil, []byte("fake: unknown program " + name), xtables.ErrExit
}

// LookPath implements xtables.Commander.
func (k *fakeKernel) LookPath(name string) (string, error) { return "/usr/sbin/" + name, nil }

// save prints tables as iptables-save does (chains sorted, rules as written).
func (k *fakeKernel) save(only string) string {
	var b strings.Builder
	names := make([]string, 0, len(k.tables))
	for n := range k.tables {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		if only != "" && name != only {
			continue
		}
		t := k.tables[name]
		fmt.Fprintf(&b, "*%s\n", name)
		chains := make([]string, 0, len(t.chains))
		for c := range t.chains {
			chains = append(chains, c)
		}
		slices.Sort(chains)
		for _, c := range chains {
			policy := "-"
			if t.chains[c].builtin {
				policy = "ACCEPT"
			}
			fmt.Fprintf(&b, ":%s %s [0:0]\n", c, policy)
		}
		for _, c := range chains {
			for _, r := range t.chains[c].rules {
				fmt.Fprintf(&b, "-A %s %s\n", c, r.spec)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// ruleEditor implementation.

func (k *fakeKernel) ChainExists(table, chain string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls["ChainExists"]++
	t, ok := k.tables[table]
	if !ok {
		return false, nil
	}
	_, ok = t.chains[chain]
	return ok, nil
}

func (k *fakeKernel) NewChain(table, chain string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls["NewChain"]++
	t := k.tables[table]
	if _, ok := t.chains[chain]; ok {
		return fmt.Errorf("iptables: Chain already exists")
	}
	t.chains[chain] = &fakeChain{}
	return nil
}

// chainLocked counts a call of method and returns the chain it names, or iptables' error
// for a missing chain. k.mu must be held.
func (k *fakeKernel) chainLocked(method, table, chain string) (*fakeChain, error) {
	k.calls[method]++
	ch, ok := k.tables[table].chains[chain]
	if !ok {
		return nil, fmt.Errorf("iptables: No chain/target/match by that name")
	}
	return ch, nil
}

func (k *fakeKernel) Exists(table, chain string, spec ...string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, err := k.chainLocked("Exists", table, chain)
	if err != nil {
		return false, err
	}
	for _, r := range ch.rules {
		if sameArgs(r.args, spec) {
			return true, nil
		}
	}
	return false, nil
}

func (k *fakeKernel) Insert(table, chain string, pos int, spec ...string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, err := k.chainLocked("Insert", table, chain)
	if err != nil {
		return err
	}
	if tgt := xtables.TargetOf(spec); tgt != "" && !isStandardTarget(tgt) {
		if _, ok := k.tables[table].chains[tgt]; !ok {
			return fmt.Errorf("iptables: Couldn't load target `%s'", tgt)
		}
	}
	ch.rules = slices.Insert(ch.rules, pos-1, &fakeRule{spec: shellArgs(spec), args: slices.Clone(spec)})
	return nil
}

func (k *fakeKernel) List(table, chain string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, err := k.chainLocked("List", table, chain)
	if err != nil {
		return nil, err
	}
	var out []string
	if ch.builtin {
		out = append(out, "-P "+chain+" ACCEPT")
	} else {
		out = append(out, "-N "+chain)
	}
	for _, r := range ch.rules {
		out = append(out, "-A "+chain+" "+r.spec)
	}
	return out, nil
}

// flush removes every rule and user chain, as `iptables -F; iptables -X` on every table
// (what a firewall reload does).
func (k *fakeKernel) flush() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, t := range k.tables {
		for name, c := range t.chains {
			if c.builtin {
				c.rules = nil
			} else {
				delete(t.chains, name)
			}
		}
	}
}

// chainNames returns the chains of a table whose name has prefix.
func (k *fakeKernel) chainNames(table, prefix string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for name := range k.tables[table].chains {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// rules returns a chain's rule specs.
func (k *fakeKernel) rules(table, chain string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, ok := k.tables[table].chains[chain]
	if !ok {
		return nil
	}
	var out []string
	for _, r := range ch.rules {
		out = append(out, r.spec)
	}
	return out
}

// fakeSysctl is an in-memory /proc/sys.
type fakeSysctl map[string]int

func (f fakeSysctl) Get(name string) (int, error) {
	v, ok := f[name]
	if !ok {
		return 0, fmt.Errorf("no sysctl %s", name)
	}
	return v, nil
}
func (f fakeSysctl) Set(name string, v int) error { f[name] = v; return nil }

// noNFAcct is a kernel without nfacct.
type noNFAcct struct{}

func (noNFAcct) Ensure(string) error { return fmt.Errorf("nfacct: operation not supported") }
func (noNFAcct) Packets(string) (uint64, error) {
	return 0, fmt.Errorf("nfacct: operation not supported")
}

// fakeProbe says no flavour is in use.
type fakeProbe struct{}

func (fakeProbe) InUse(*xtables.Tools) bool { return false }
func (fakeProbe) Chains(context.Context, *xtables.Tools) (map[string]map[string]bool, error) {
	return nil, nil
}

// kernelProbe answers for the fake kernel: its flavour is in use, with its chains.
type kernelProbe struct{ k *fakeKernel }

func (p kernelProbe) InUse(t *xtables.Tools) bool { return t.Flavour == p.k.flavour }
func (p kernelProbe) Chains(_ context.Context, t *xtables.Tools) (map[string]map[string]bool, error) {
	if t.Flavour != p.k.flavour {
		return nil, nil
	}
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	out := map[string]map[string]bool{}
	for name, table := range p.k.tables {
		out[name] = map[string]bool{}
		for c := range table.chains {
			out[name][c] = true
		}
	}
	return out, nil
}
