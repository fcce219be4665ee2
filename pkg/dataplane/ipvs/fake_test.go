package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// fakeKernel is a stateful, validating stand-in for the kernel parts the backend uses:
// the IPVS table, links and addresses, ipsets, one iptables flavour and sysctls. It refuses
// what the kernel refuses (a real server of a missing virtual server, an entry of the wrong
// shape for its set, a rule jumping to a missing chain or matching a missing set, destroying
// a set a rule uses ...) with the errors the real seams return, and it can inject failures.
type fakeKernel struct {
	services   map[vsKey]*fakeVS
	links      map[string][]netip.Addr // link name -> addresses
	dummies    map[string]bool
	sets       map[string]*fakeSet
	tables     map[string]*fakeTable // iptables
	tables6    map[string]*fakeTable // ip6tables
	sysctls    map[string]int
	schedulers map[string]bool
	timeouts   [3]time.Duration

	// fault, when set, is asked before every call ("add-vs TCP/10.0.0.1:80", "restore",
	// "list-rs ..."); a non-nil answer fails the call without changing anything.
	fault func(call string) error
	// calls logs every call that changed something, in order.
	calls []string
	// restores holds every iptables-restore input accepted.
	restores []string
}

type fakeVS struct {
	params vsParams
	dests  map[netip.AddrPort]*realServer
}

type fakeSet struct {
	typ     ipsetType
	family  model.IPFamily
	entries map[setEntry]bool
}

type fakeTable struct {
	order  []string            // user chains in creation order
	chains map[string][]string // chain -> rules, each the rule's arguments joined by "\x00"
}

func newFakeKernel() *fakeKernel {
	k := &fakeKernel{
		services:   map[vsKey]*fakeVS{},
		links:      map[string][]netip.Addr{"lo": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}},
		dummies:    map[string]bool{},
		sets:       map[string]*fakeSet{},
		tables:     map[string]*fakeTable{},
		sysctls:    map[string]int{},
		schedulers: map[string]bool{},
	}
	for _, s := range []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf"} {
		k.schedulers[s] = true
	}
	k.tables6 = map[string]*fakeTable{}
	for _, t := range []string{tableNAT, tableFilter, tableMangle} {
		k.tables[t] = &fakeTable{chains: map[string][]string{}}
		k.tables6[t] = &fakeTable{chains: map[string][]string{}}
	}
	for _, name := range []string{sysctlVSConnTrack, sysctlConnReuseMode, sysctlExpireNoDestConn, sysctlExpireQuiescentTemplate,
		sysctlIPForward, sysctlARPIgnore, sysctlARPAnnounce} {
		k.sysctls[name] = 0
	}
	k.sysctls[sysctlConnReuseMode] = 1
	return k
}

func (k *fakeKernel) check(call string) error {
	if k.fault != nil {
		if err := k.fault(call); err != nil {
			return err
		}
	}
	return nil
}

func (k *fakeKernel) record(call string) { k.calls = append(k.calls, call) }

// lookup checks call against the injected failures and returns what m holds under key, or
// missing when it holds nothing there: the first step of an operation on one kernel object.
func lookup[K comparable, V any](k *fakeKernel, call string, m map[K]V, key K, missing error) (V, error) {
	var zero V
	if err := k.check(call); err != nil {
		return zero, err
	}
	v, ok := m[key]
	if !ok {
		return zero, missing
	}
	return v, nil
}

// errInjected is what injected faults return.
var errInjected = errors.New("injected fault")

// failRandomly returns a fault function failing each call with probability p.
func failRandomly(r *rand.Rand, p float64) func(string) error {
	return func(call string) error {
		if r.Float64() < p {
			return fmt.Errorf("%s: %w", call, errInjected)
		}
		return nil
	}
}

// failMatching returns a fault function failing every call containing substr.
func failMatching(substr string) func(string) error {
	return func(call string) error {
		if strings.Contains(call, substr) {
			return fmt.Errorf("%s: %w", call, errInjected)
		}
		return nil
	}
}

func kerr(errno syscall.Errno, kind error) error { return &kernelError{err: errno, kind: kind} }

// --- IPVS -------------------------------------------------------------------------------------

type fakeIPVS struct{ k *fakeKernel }

func (f fakeIPVS) Services() (map[vsKey]vsParams, error) {
	if err := f.k.check("list-vs"); err != nil {
		return nil, err
	}
	out := map[vsKey]vsParams{}
	for key, vs := range f.k.services {
		out[key] = vs.params
	}
	return out, nil
}

func (f fakeIPVS) Destinations(key vsKey) ([]realServer, error) {
	if err := f.k.check("list-rs " + key.String()); err != nil {
		return nil, err
	}
	vs, ok := f.k.services[key]
	if !ok {
		return nil, kerr(unix.ESRCH, errNotExist)
	}
	out := make([]realServer, 0, len(vs.dests))
	for _, rs := range vs.dests {
		out = append(out, *rs)
	}
	slices.SortFunc(out, func(a, b realServer) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

func (f fakeIPVS) validate(key vsKey, p vsParams) error {
	if !key.Addr.IsValid() || key.Port == 0 || protoNumber(key.Proto) == 0 {
		return fmt.Errorf("fake IPVS: invalid virtual server %v: %w", key, unix.EINVAL)
	}
	if !f.k.schedulers[p.Scheduler] {
		return kerr(unix.ENOENT, errNoScheduler)
	}
	if p.Flags&flagHashed != 0 {
		return fmt.Errorf("fake IPVS: the hashed flag is the kernel's: %w", unix.EINVAL)
	}
	if (p.Flags&flagPersistent != 0) != (p.Timeout != 0) {
		return fmt.Errorf("fake IPVS: persistence flag %#x with timeout %d: %w", p.Flags, p.Timeout, unix.EINVAL)
	}
	return nil
}

func (f fakeIPVS) AddService(key vsKey, p vsParams) error {
	call := "add-vs " + key.String()
	if err := f.k.check(call); err != nil {
		return err
	}
	if err := f.validate(key, p); err != nil {
		return err
	}
	if _, ok := f.k.services[key]; ok {
		return kerr(unix.EEXIST, errExist)
	}
	f.k.services[key] = &fakeVS{params: p, dests: map[netip.AddrPort]*realServer{}}
	f.k.record(call)
	return nil
}

func (f fakeIPVS) UpdateService(key vsKey, p vsParams) error {
	call := "update-vs " + key.String()
	vs, err := f.vs(call, key)
	if err != nil {
		return err
	}
	if err := f.validate(key, p); err != nil {
		return err
	}
	vs.params = p
	f.k.record(call)
	return nil
}

func (f fakeIPVS) DeleteService(key vsKey) error {
	call := "delete-vs " + key.String()
	if _, err := f.vs(call, key); err != nil {
		return err
	}
	delete(f.k.services, key)
	f.k.record(call)
	return nil
}

// vs checks call against the injected failures and returns the virtual server it names,
// or the kernel's ESRCH.
func (f fakeIPVS) vs(call string, key vsKey) (*fakeVS, error) {
	return lookup(f.k, call, f.k.services, key, kerr(unix.ESRCH, errNotExist))
}

func (f fakeIPVS) AddDestination(key vsKey, rs netip.AddrPort, weight int) error {
	call := "add-rs " + key.String() + " " + rs.String()
	vs, err := f.vs(call, key)
	if err != nil {
		return err
	}
	if !rs.IsValid() || rs.Port() == 0 || rs.Addr().Is4() != key.Addr.Is4() || weight < 0 {
		return fmt.Errorf("fake IPVS: invalid real server %v weight %d for %v: %w", rs, weight, key, unix.EINVAL)
	}
	if _, ok := vs.dests[rs]; ok {
		return kerr(unix.EEXIST, errExist)
	}
	vs.dests[rs] = &realServer{Addr: rs, Weight: weight}
	f.k.record(call)
	return nil
}

func (f fakeIPVS) UpdateDestination(key vsKey, rs netip.AddrPort, weight int) error {
	call := fmt.Sprintf("update-rs %s %s weight %d", key, rs, weight)
	vs, err := f.vs(call, key)
	if err != nil {
		return err
	}
	d, ok := vs.dests[rs]
	if !ok {
		return kerr(unix.ENOENT, errNotExist)
	}
	if weight < 0 {
		return unix.EINVAL
	}
	d.Weight = weight
	f.k.record(call)
	return nil
}

func (f fakeIPVS) DeleteDestination(key vsKey, rs netip.AddrPort) error {
	call := "delete-rs " + key.String() + " " + rs.String()
	vs, err := f.vs(call, key)
	if err != nil {
		return err
	}
	if _, ok := vs.dests[rs]; !ok {
		return kerr(unix.ENOENT, errNotExist)
	}
	delete(vs.dests, rs)
	f.k.record(call)
	return nil
}

func (f fakeIPVS) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	if err := f.k.check("set-timeouts"); err != nil {
		return err
	}
	for i, d := range []time.Duration{tcp, tcpFin, udp} {
		if d > 0 {
			f.k.timeouts[i] = d
		}
	}
	return nil
}

// setConnections sets a real server's connection counts (what clients would do).
func (k *fakeKernel) setConnections(key vsKey, rs netip.AddrPort, active, inactive int) {
	vs, ok := k.services[key]
	if !ok {
		panic(fmt.Sprintf("no virtual server %s", key))
	}
	d, ok := vs.dests[rs]
	if !ok {
		panic(fmt.Sprintf("no real server %s in %s", rs, key))
	}
	d.Active, d.Inactive = active, inactive
}

// --- links --------------------------------------------------------------------------------

type fakeLinks struct{ k *fakeKernel }

func (f fakeLinks) Dummy(name string) (bool, []netip.Addr, error) {
	if err := f.k.check("list-link " + name); err != nil {
		return false, nil, err
	}
	addrs, ok := f.k.links[name]
	if !ok {
		return false, nil, nil
	}
	return true, slices.Clone(addrs), nil
}

func (f fakeLinks) CreateDummy(name string) error {
	if err := f.k.check("create-link " + name); err != nil {
		return err
	}
	if _, ok := f.k.links[name]; ok {
		return kerr(unix.EEXIST, errExist)
	}
	f.k.links[name] = nil
	f.k.dummies[name] = true
	f.k.record("create-link " + name)
	return nil
}

func (f fakeLinks) DeleteLink(name string) error {
	if _, err := f.link("delete-link "+name, name, kerr(unix.ENODEV, errNotExist)); err != nil {
		return err
	}
	delete(f.k.links, name)
	delete(f.k.dummies, name)
	f.k.record("delete-link " + name)
	return nil
}

func (f fakeLinks) AddAddr(name string, a netip.Addr) error {
	call := "add-addr " + name + " " + a.String()
	// Adding to a missing link is an error, not "already so".
	addrs, err := f.link(call, name, fmt.Errorf("fake link %s: %w", name, unix.ENODEV))
	if err != nil {
		return err
	}
	if slices.Contains(addrs, a) {
		return kerr(unix.EEXIST, errExist)
	}
	f.k.links[name] = append(addrs, a)
	f.k.record(call)
	return nil
}

func (f fakeLinks) DelAddr(name string, a netip.Addr) error {
	call := "del-addr " + name + " " + a.String()
	addrs, err := f.link(call, name, kerr(unix.ENODEV, errNotExist))
	if err != nil {
		return err
	}
	i := slices.Index(addrs, a)
	if i < 0 {
		return kerr(unix.EADDRNOTAVAIL, errNotExist)
	}
	f.k.links[name] = slices.Delete(addrs, i, i+1)
	f.k.record(call)
	return nil
}

// link checks call against the injected failures and returns the addresses of the link it
// names, or missing when there is no such link.
func (f fakeLinks) link(call, name string, missing error) ([]netip.Addr, error) {
	return lookup(f.k, call, f.k.links, name, missing)
}

func (f fakeLinks) Addrs() ([]linkAddr, error) {
	if err := f.k.check("list-addrs"); err != nil {
		return nil, err
	}
	var out []linkAddr
	for name, addrs := range f.k.links {
		for _, a := range addrs {
			out = append(out, linkAddr{addr: a, link: name})
		}
	}
	return out, nil
}

// --- ipsets -------------------------------------------------------------------------------

type fakeIPSets struct{ k *fakeKernel }

func (f fakeIPSets) List(name string) (*kernelSet, error) {
	s, err := f.set("list-set "+name, name)
	if err != nil {
		return nil, err
	}
	ks := &kernelSet{Type: s.typ, Entries: map[setEntry]bool{}}
	if s.typ != typeBitmapPort {
		ks.Family = afOf(s.family)
	}
	for e := range s.entries {
		ks.Entries[e] = true
	}
	return ks, nil
}

func (f fakeIPSets) Create(name string, t ipsetType, family model.IPFamily) error {
	call := "create-set " + name
	if err := f.k.check(call); err != nil {
		return err
	}
	if len(name) > maxIPSetNameLength {
		return fmt.Errorf("fake ipset: name %q too long: %w", name, unix.EINVAL)
	}
	switch t {
	case typeHashIP, typeHashIPPort, typeHashIPPortIP, typeHashIPPortNet, typeBitmapPort:
	default:
		return fmt.Errorf("fake ipset: unknown type %q: %w", t, unix.EINVAL)
	}
	if _, ok := f.k.sets[name]; ok {
		return kerr(unix.EEXIST, errExist)
	}
	f.k.sets[name] = &fakeSet{typ: t, family: family, entries: map[setEntry]bool{}}
	f.k.record(call)
	return nil
}

func (f fakeIPSets) Destroy(name string) error {
	call := "destroy-set " + name
	if _, err := f.set(call, name); err != nil {
		return err
	}
	if f.k.setReferenced(name) {
		return fmt.Errorf("fake ipset: set %s is in use by iptables: %w", name, unix.EBUSY)
	}
	delete(f.k.sets, name)
	f.k.record(call)
	return nil
}

// set checks call against the injected failures and returns the set it names, or the
// kernel's ENOENT.
func (f fakeIPSets) set(call, name string) (*fakeSet, error) {
	return lookup(f.k, call, f.k.sets, name, kerr(unix.ENOENT, errNotExist))
}

func (f fakeIPSets) validEntry(s *fakeSet, t ipsetType, e setEntry) error {
	if t != s.typ {
		return fmt.Errorf("fake ipset: entry for %s sent to a %s set: %w", t, s.typ, unix.EINVAL)
	}
	if e != e.normalize(t) {
		return fmt.Errorf("fake ipset: entry %v has fields a %s set does not keep", e, t)
	}
	ipOK := func(a netip.Addr) bool { return a.IsValid() && model.FamilyOf(a) == s.family }
	protoOK := e.Proto == unix.IPPROTO_TCP || e.Proto == unix.IPPROTO_UDP || e.Proto == unix.IPPROTO_SCTP
	var ok bool
	switch t {
	case typeBitmapPort:
		ok = e.Port != 0
	case typeHashIP:
		ok = ipOK(e.IP)
	case typeHashIPPort:
		ok = ipOK(e.IP) && protoOK && e.Port != 0
	case typeHashIPPortIP:
		ok = ipOK(e.IP) && protoOK && e.Port != 0 && ipOK(e.IP2)
	case typeHashIPPortNet:
		ok = ipOK(e.IP) && protoOK && e.Port != 0 && ipOK(e.Net.Addr()) && e.Net.Bits() > 0
	}
	if !ok {
		return fmt.Errorf("fake ipset: invalid %s entry %v: %w", t, e, unix.EINVAL)
	}
	return nil
}

func (f fakeIPSets) Add(name string, t ipsetType, e setEntry) error {
	return f.entryOp("add-entry", name, e, func(s *fakeSet) error {
		if err := f.validEntry(s, t, e); err != nil {
			return err
		}
		if s.entries[e] {
			return &kernelError{err: errors.New("element exists"), kind: errExist}
		}
		s.entries[e] = true
		return nil
	})
}

func (f fakeIPSets) Del(name string, t ipsetType, e setEntry) error {
	return f.entryOp("del-entry", name, e, func(s *fakeSet) error {
		if !s.entries[e] {
			return &kernelError{err: errors.New("element missing"), kind: errNotExist}
		}
		delete(s.entries, e)
		return nil
	})
}

// entryOp runs op, an entry's change to the set it names, and records the call when op
// succeeds.
func (f fakeIPSets) entryOp(verb, name string, e setEntry, op func(*fakeSet) error) error {
	call := verb + " " + name + " " + e.String()
	s, err := f.set(call, name)
	if err != nil {
		return err
	}
	if err := op(s); err != nil {
		return err
	}
	f.k.record(call)
	return nil
}

// setReferenced reports whether any rule matches the set.
func (k *fakeKernel) setReferenced(name string) bool {
	for _, t := range append(slices.Collect(maps.Values(k.tables)), slices.Collect(maps.Values(k.tables6))...) {
		for _, rules := range t.chains {
			for _, r := range rules {
				args := strings.Split(r, "\x00")
				for i := 0; i+1 < len(args); i++ {
					if args[i] == "--match-set" && args[i+1] == name {
						return true
					}
				}
			}
		}
	}
	return false
}

// --- iptables -------------------------------------------------------------------------------

// fakeIPTables is iptables (or, with v6, ip6tables) of the fake kernel.
type fakeIPTables struct {
	k  *fakeKernel
	v6 bool
}

func (f fakeIPTables) tables() map[string]*fakeTable {
	if f.v6 {
		return f.k.tables6
	}
	return f.k.tables
}

var builtinTargets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "MASQUERADE": true, "MARK": true, "DNAT": true, "SNAT": true}

func (f fakeIPTables) Save(ctx context.Context, tables ...string) ([]byte, error) {
	if err := f.k.check("save"); err != nil {
		return nil, err
	}
	if len(tables) == 0 {
		tables = []string{tableFilter, tableMangle, tableNAT}
	}
	var b strings.Builder
	for _, name := range tables {
		t := f.tables()[name]
		fmt.Fprintf(&b, "*%s\n", name)
		for _, c := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
			fmt.Fprintf(&b, ":%s ACCEPT [0:0]\n", c)
		}
		for _, c := range t.order {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, c := range append([]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}, t.order...) {
			for _, r := range t.chains[c] {
				args := strings.Split(r, "\x00")
				b.WriteString(line(c, args))
				b.WriteString("\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String()), nil
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{order: slices.Clone(t.order), chains: map[string][]string{}}
	for k, v := range t.chains {
		c.chains[k] = slices.Clone(v)
	}
	return c
}

func (t *fakeTable) has(chain string) bool {
	if builtinChains[chain] {
		return true
	}
	return slices.Contains(t.order, chain)
}

// Restore applies iptables-restore --noflush input, table by table at each COMMIT, the way
// the legacy flavour does; a table with an error is not committed, and neither is anything
// after it.
func (f fakeIPTables) Restore(ctx context.Context, input []byte) error {
	if err := f.k.check("restore"); err != nil {
		return err
	}
	var cur *fakeTable
	var curName string
	for n, l := range strings.Split(string(input), "\n") {
		lineNo := n + 1
		l = strings.TrimSpace(l)
		fail := func(format string, a ...any) error {
			return fmt.Errorf("fake iptables-restore: line %d (%q): %s", lineNo, l, fmt.Sprintf(format, a...))
		}
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			if cur != nil {
				return fail("table %s not committed", curName)
			}
			curName = l[1:]
			t, ok := f.tables()[curName]
			if !ok {
				return fail("no table %s", curName)
			}
			cur = t.clone()
		case cur == nil:
			return fail("outside a table")
		case l == "COMMIT":
			for c, rules := range cur.chains {
				for _, r := range rules {
					if err := f.validateRule(cur, r); err != nil {
						return fail("chain %s: %v", c, err)
					}
				}
			}
			f.tables()[curName] = cur
			cur = nil
		case strings.HasPrefix(l, ":"):
			name := strings.Fields(l[1:])[0]
			if builtinChains[name] {
				continue
			}
			if !cur.has(name) {
				cur.order = append(cur.order, name)
			}
			cur.chains[name] = nil
		default:
			args := xtables.SplitArgs(l)
			if len(args) < 2 {
				return fail("short rule")
			}
			chain := args[1]
			if !cur.has(chain) {
				return fail("no chain %s", chain)
			}
			switch args[0] {
			case "-A":
				cur.chains[chain] = append(cur.chains[chain], strings.Join(args[2:], "\x00"))
			case "-I":
				rest := args[2:]
				pos := 1
				if len(rest) > 0 {
					if p, err := strconv.Atoi(rest[0]); err == nil {
						pos, rest = p, rest[1:]
					}
				}
				if pos < 1 || pos > len(cur.chains[chain])+1 {
					return fail("index %d out of range", pos)
				}
				cur.chains[chain] = slices.Insert(cur.chains[chain], pos-1, strings.Join(rest, "\x00"))
			case "-D":
				r := strings.Join(args[2:], "\x00")
				i := slices.Index(cur.chains[chain], r)
				if i < 0 {
					return fail("Bad rule (does a matching rule exist in that chain?)")
				}
				cur.chains[chain] = slices.Delete(cur.chains[chain], i, i+1)
			case "-X":
				if builtinChains[chain] {
					return fail("cannot delete built-in chain")
				}
				if len(cur.chains[chain]) > 0 {
					return fail("chain %s not empty", chain)
				}
				for c, rules := range cur.chains {
					for _, r := range rules {
						if target := xtables.TargetOf(strings.Split(r, "\x00")); target == chain {
							return fail("chain %s is referenced by %s", chain, c)
						}
					}
				}
				delete(cur.chains, chain)
				cur.order = slices.DeleteFunc(cur.order, func(c string) bool { return c == chain })
			default:
				return fail("unknown command %s", args[0])
			}
		}
	}
	if cur != nil {
		return fmt.Errorf("fake iptables-restore: table %s not committed", curName)
	}
	f.k.restores = append(f.k.restores, string(input))
	f.k.record("restore")
	return nil
}

func (f fakeIPTables) validateRule(t *fakeTable, r string) error {
	args := strings.Split(r, "\x00")
	target := xtables.TargetOf(args)
	if target == "" {
		return fmt.Errorf("rule %q has no target", strings.Join(args, " "))
	}
	if !builtinTargets[target] && !t.has(target) {
		return fmt.Errorf("no chain/target/match by the name %s", target)
	}
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--match-set" {
			if _, ok := f.k.sets[args[i+1]]; !ok {
				return fmt.Errorf("set %s doesn't exist", args[i+1])
			}
		}
	}
	return nil
}

// rules returns a chain's rules as "-A chain ..." lines.
func (k *fakeKernel) rules(table, chain string) []string {
	var out []string
	for _, r := range k.tables[table].chains[chain] {
		out = append(out, line(chain, strings.Split(r, "\x00")))
	}
	return out
}

// --- sysctl --------------------------------------------------------------------------------

type fakeSysctl struct{ k *fakeKernel }

func (f fakeSysctl) Get(name string) (int, error) {
	v, ok := f.k.sysctls[name]
	if !ok {
		return 0, fmt.Errorf("fake sysctl %s: %w", name, unix.ENOENT)
	}
	return v, nil
}

func (f fakeSysctl) Set(name string, value int) error {
	if err := f.k.check("sysctl " + name); err != nil {
		return err
	}
	if _, ok := f.k.sysctls[name]; !ok {
		return fmt.Errorf("fake sysctl %s: %w", name, unix.ENOENT)
	}
	f.k.sysctls[name] = value
	return nil
}

// --- views for assertions ---------------------------------------------------------------------

// dumpIPVS renders the IPVS table like `ipvsadm -Ln`, sorted, one line per virtual server
// and real server: "TCP 172.30.0.10:80 rr" / "  -> 10.180.1.2:8080 1".
func (k *fakeKernel) dumpIPVS() string {
	keys := make([]vsKey, 0, len(k.services))
	for key := range k.services {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, compareVSKeys)
	var b strings.Builder
	for _, key := range keys {
		vs := k.services[key]
		fmt.Fprintf(&b, "%s %s %s\n", key.Proto, netip.AddrPortFrom(key.Addr, key.Port), vs.params)
		var dests []string
		for _, d := range vs.dests {
			dests = append(dests, fmt.Sprintf("  -> %s %d\n", d.Addr, d.Weight))
		}
		sort.Strings(dests)
		b.WriteString(strings.Join(dests, ""))
	}
	return b.String()
}

// setEntries returns a set's entries as sorted strings.
func (k *fakeKernel) setEntries(name string) []string {
	s, ok := k.sets[name]
	if !ok {
		return nil
	}
	var out []string
	for e := range s.entries {
		out = append(out, e.String())
	}
	sort.Strings(out)
	return out
}

// dummyAddrs returns the dummy device's addresses, sorted.
func (k *fakeKernel) dummyAddrs() []string {
	var out []string
	for _, a := range k.links[dummyDevice] {
		out = append(out, a.String())
	}
	sort.Strings(out)
	return out
}

// snapshot is the whole state, for comparing two kernels.
func (k *fakeKernel) snapshot() string {
	var b strings.Builder
	b.WriteString(k.dumpIPVS())
	fmt.Fprintf(&b, "dummy %v\n", k.dummyAddrs())
	var names []string
	for n := range k.sets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "set %s %s %v\n", n, k.sets[n].typ, k.setEntries(n))
	}
	saved, _ := fakeIPTables{k: k}.Save(context.Background())
	b.Write(saved)
	return b.String()
}
