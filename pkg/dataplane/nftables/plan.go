package nftables

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables/userdata"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/google/nftables/expr"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// staleChainDelay is how long a flushed chain waits before it is deleted, on kernels
// that need the wait (before 6.2).
const staleChainDelay = time.Second

// planInput is everything the planner looks at. The planner does no I/O: the caller
// reads the kernel (for a full plan), lists the node's addresses and takes the time.
type planInput struct {
	cfg *layoutConfig
	// nodeIP is the node's primary address of the family (loadBalancerSourceRanges let
	// the node reach its own VIPs when it is inside a range).
	nodeIP netip.Addr
	// localAddrs are the node's local addresses, for @nodeport-ips (full plans only).
	localAddrs []netip.Addr
	desired    *model.NodeState
	// full plans every Service and the fixed part against state, which must then be a
	// fresh read of the kernel. Otherwise only the Services in changed are planned.
	full    bool
	changed sets.Set[types.NamespacedName]
	// state is the model the plan starts from; the planner never modifies it.
	state *tableState
	// prevRecords are the records of the model before a full read, so that a Service that
	// fails validation keeps what it had.
	prevRecords map[types.NamespacedName]*serviceRecord
	// deleteChainsNow deletes stale chains in the transaction that unreferences them
	// (kernel 6.2 and later); otherwise they are flushed and deleted a second later.
	deleteChainsNow bool
	now             time.Time
	// skipValidation is for tests that must get a bad Service past the planner to the
	// kernel.
	skipValidation bool
}

// plan computes the changes that make the kernel match in.desired.
// The plan of a large table is big (every rule compiled, every element), so the
// backend does not hold it whole: streamPlan hands each group to a sink as soon as it is
// planned, and the applier sends and drops it batch by batch. plan collects the groups
// instead, for tests and `sluice render`.
func plan(in *planInput) *Plan {
	var groups []*group
	out := streamPlan(in, func(bool, *tableState) {}, func(g *group) { groups = append(groups, g) })
	out.groups = groups
	return out
}

// streamPlan plans, calls begin once (telling whether the table is replaced), then sink
// for each group in order. The returned Plan has no groups.
func streamPlan(in *planInput, begin func(replace bool, base *tableState), sink func(*group)) *Plan {
	p := newPlanner(in, in.state, sink)
	if in.full && p.incompatible() {
		// The table cannot be converged in place (a set or map of ours exists with
		// another type, a chain we need as a base chain is a regular one, ...):
		// rebuild it in one transaction, so that there is no moment without rules.
		fresh := newTableState()
		begin(true, fresh)
		sink(&group{ops: []op{{kind: opDeleteTable, name: kubeProxyTable}}})
		p = newPlanner(in, fresh, sink)
		p.plan()
		out := p.result()
		out.replace = true
		out.base = fresh
		return out
	}
	begin(false, in.state)
	p.plan()
	out := p.result()
	out.base = in.state
	return out
}

// planner plans against a view: the starting state plus what earlier groups of the
// same plan changed. Every change is also recorded in the effects of the current group,
// so that the model can be updated with exactly the groups the kernel accepted.
type planner struct {
	in   *planInput
	f    *family
	base *tableState

	exists  *bool
	chains  map[string]*chainState // nil value: deleted
	sets    map[string]*setDef     // nil value: deleted
	elems   map[elemRef]elemValue
	records map[types.NamespacedName]*serviceRecord
	claims  map[elemRef][]claim
	stale   map[string]time.Time

	// cleared are the sets this plan deletes (and maybe adds again): their elements are
	// gone with them.
	cleared sets.Set[string]

	// desiredChains and desiredSets are the chains and sets this plan wants (full plans:
	// all of them; partial plans: those of the changed Services).
	desiredChains sets.Set[string]
	desiredSets   sets.Set[string]

	sink    func(*group)
	cur     *group
	invalid map[types.NamespacedName]error
	fp      fingerprinter

	scratch svcScratch

	// Endpoint map blocks: the view over base.slots.
	blocks map[string]*slotBlock // nil value: freed
	// free is a copy of base.slots.free (the applier may commit groups to the base
	// while the plan goes on); blocks taken from it are gone from the copy.
	free [endpointMaps][]uint32
	next [endpointMaps]uint64
	// pendingFx holds the effects of block allocations made by preclaim, until the
	// Service's group exists.
	pendingFx map[types.NamespacedName]*groupEffects
	// wantedBlocks holds, for a full plan, each block in use and its number of
	// endpoints: the endpoint map elements outside them are leftovers.
	wantedBlocks map[slotBlock]int
}

// svcScratch is reused from one Service to the next: a full plan of 10 000 Services
// would otherwise allocate these 10 000 times.
type svcScratch struct {
	addChains, flushChains, delSets, addSets, addRules, delChains []op
	delElems, addElems                                            []elemDef
	newElems                                                      map[elemRef]elemDef
	newChains, newSets, slotChains                                sets.Set[string]
	touched                                                       []elemRef
}

func (s *svcScratch) reset() {
	if s.newElems == nil {
		s.newElems, s.newChains, s.newSets, s.slotChains = map[elemRef]elemDef{}, sets.New[string](), sets.New[string](), sets.New[string]()
	}
	s.addChains, s.flushChains, s.delSets = s.addChains[:0], s.flushChains[:0], s.delSets[:0]
	s.addSets, s.addRules, s.delChains = s.addSets[:0], s.addRules[:0], s.delChains[:0]
	s.delElems, s.addElems, s.touched = s.delElems[:0], s.addElems[:0], s.touched[:0]
	clear(s.newElems)
	clear(s.newChains)
	clear(s.newSets)
	clear(s.slotChains)
}

func newPlanner(in *planInput, base *tableState, sink func(*group)) *planner {
	p := &planner{
		in: in, f: in.cfg.f, base: base, sink: sink,
		chains:        map[string]*chainState{},
		sets:          map[string]*setDef{},
		elems:         map[elemRef]elemValue{},
		records:       map[types.NamespacedName]*serviceRecord{},
		claims:        map[elemRef][]claim{},
		stale:         map[string]time.Time{},
		cleared:       sets.New[string](),
		desiredChains: sets.New[string](),
		desiredSets:   sets.New[string](),
		invalid:       map[types.NamespacedName]error{},
	}
	for k, v := range base.staleChains {
		p.stale[k] = v
	}
	p.blocks = map[string]*slotBlock{}
	for i, bases := range base.slots.free {
		p.free[i] = slices.Clone(bases)
	}
	p.next = base.slots.next
	p.wantedBlocks = map[slotBlock]int{}
	p.pendingFx = map[types.NamespacedName]*groupEffects{}
	return p
}

func (p *planner) result() *Plan {
	return &Plan{fam: p.f, invalid: p.invalid, full: p.in.full, staleChains: p.stale}
}

// View accessors.

func (p *planner) tableExists() bool {
	if p.exists != nil {
		return *p.exists
	}
	return p.base.exists
}

func (p *planner) chain(name string) *chainState {
	if c, ok := p.chains[name]; ok {
		return c
	}
	return p.base.chains[name]
}

func (p *planner) set(name string) *setDef {
	if s, ok := p.sets[name]; ok {
		return s
	}
	if s := p.base.sets[name]; s != nil {
		return &s.def
	}
	return nil
}

func (p *planner) elem(ref elemRef) (string, bool) {
	if v, ok := p.elems[ref]; ok {
		return v.value, v.present
	}
	if p.cleared.Has(ref.set) {
		return "", false
	}
	if s := p.base.sets[ref.set]; s != nil && s.elems != nil {
		v, ok := s.elems[ref.key]
		return v, ok
	}
	return "", false
}

func (p *planner) record(svc types.NamespacedName) *serviceRecord {
	if r, ok := p.records[svc]; ok {
		return r
	}
	if p.in.full {
		// A full plan rebuilds every record; the base (a fresh read) has none.
		return nil
	}
	return p.base.services[svc]
}

func (p *planner) claimsOf(ref elemRef) []claim {
	if c, ok := p.claims[ref]; ok {
		return c
	}
	if p.in.full {
		return nil
	}
	return p.base.claims[ref]
}

// Writers: change the view and record the effect in the current group.

func (p *planner) emit(o op) { p.cur.ops = append(p.cur.ops, o) }

func (p *planner) fx() *groupEffects {
	if p.cur.fx == nil {
		p.cur.fx = &groupEffects{}
	}
	return p.cur.fx
}

func (p *planner) setTableExists(v bool) {
	p.exists = &v
	p.fx().table = &v
}

func (p *planner) putChain(name string, c *chainState) {
	p.chains[name] = c
	p.fx().chains = append(p.fx().chains, chainFx{name, c})
}

func (p *planner) putSet(name string, d *setDef) {
	p.sets[name] = d
	p.fx().sets = append(p.fx().sets, setFx{name, d})
}

// putElem records that element ref now has value (or, with present false, is gone).
func (p *planner) putElem(ref elemRef, value string, present bool) {
	if !p.in.full {
		// A full plan writes each element once, from the group that owns it, and never
		// reads it back: the view needs no copy (and saves a 100 000-entry map).
		p.elems[ref] = elemValue{value, present}
	}
	p.fx().elems = append(p.fx().elems, elemFx{ref, elemValue{value, present}})
}

func (p *planner) putRecord(svc types.NamespacedName, r *serviceRecord) {
	p.records[svc] = r
	p.fx().records = append(p.fx().records, recordFx{svc, r})
}

func (p *planner) putClaims(ref elemRef, c []claim) {
	p.claims[ref] = c
	p.fx().claims = append(p.fx().claims, claimsFx{ref, c})
}

func (p *planner) markStale(name string) {
	p.stale[name] = p.in.now
	p.fx().stale = append(p.fx().stale, staleFx{name, true})
}

func (p *planner) unmarkStale(name string) {
	if _, ok := p.stale[name]; ok {
		delete(p.stale, name)
		p.fx().stale = append(p.fx().stale, staleFx{name, false})
	}
}

func (p *planner) startGroup(svc types.NamespacedName) {
	p.cur = &group{service: svc}
}

// endGroup hands the group to the sink, unless it turned out empty.
func (p *planner) endGroup() {
	if len(p.cur.ops) > 0 || p.cur.fx != nil {
		p.sink(p.cur)
	}
	p.cur = nil
}

// incompatible reports whether the kernel's table can not be converged in place.
func (p *planner) incompatible() bool {
	if !p.base.exists {
		return false
	}
	if p.base.flags != 0 {
		return true
	}
	for _, d := range staticSets(p.in.cfg) {
		if s := p.base.sets[d.name]; s != nil && !s.def.sameKind(&d) {
			return true
		}
	}
	for _, d := range staticChains(p.in.cfg) {
		c := p.base.chains[d.name]
		if c != nil && (c.base == nil) != (d.base == nil) {
			return true
		}
	}
	return false
}

func (p *planner) plan() {
	if p.in.full {
		p.startGroup(types.NamespacedName{})
		p.planStatic()
		p.endGroup()
	}

	names := p.servicesToPlan()
	if p.in.full {
		p.preclaim(names)
	}
	for _, svc := range names {
		p.startGroup(svc)
		p.planService(svc)
		p.endGroup()
	}

	p.startGroup(types.NamespacedName{})
	p.cur.cleanup = true
	if p.in.full {
		p.planLeftovers()
	}
	p.deleteStaleChains()
	p.endGroup()
}

// servicesToPlan returns the Services to plan, sorted: all of them (desired, and for a
// partial plan those being removed) in a full plan, the changed ones otherwise.
func (p *planner) servicesToPlan() []types.NamespacedName {
	var names []types.NamespacedName
	if p.in.full {
		// Services gone since the last plan are not planned: their objects are
		// leftovers of the table now.
		names = p.in.desired.ServiceNames().UnsortedList()
	} else {
		names = p.in.changed.UnsortedList()
	}
	slices.SortFunc(names, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return names
}

// The fixed part of the table.

func (p *planner) planStatic() {
	cfg := p.in.cfg
	if !p.tableExists() {
		p.emit(op{kind: opAddTable, name: kubeProxyTable, comment: tableComment})
		p.setTableExists(true)
	}
	wantSets := staticSets(cfg)
	for i := range wantSets {
		d := &wantSets[i]
		p.desiredSets.Insert(d.name)
		if p.set(d.name) == nil {
			p.emit(op{kind: opAddSet, name: d.name, set: d})
			p.putSet(d.name, d)
		}
	}

	// Base chains whose hook or priority differs are deleted and added again in the same
	// transaction; their rules are then rewritten below.
	wantChains := staticChains(cfg)
	var addRules []op
	for i := range wantChains {
		d := &wantChains[i]
		p.desiredChains.Insert(d.name)
		p.unmarkStale(d.name)
		planned, fp := p.planChainRules(d)
		cur := p.chain(d.name)
		switch {
		case cur == nil:
			p.emit(op{kind: opAddChain, name: d.name, base: d.base, comment: d.comment})
		case d.base != nil && (cur.base == nil || *cur.base != *d.base):
			p.emit(op{kind: opDeleteChain, name: d.name})
			p.emit(op{kind: opAddChain, name: d.name, base: d.base, comment: d.comment})
		case cur.fp != fp:
			p.emit(op{kind: opFlushChain, name: d.name})
		default:
			continue
		}
		p.putChain(d.name, &chainState{base: d.base, fp: fp})
		for _, r := range planned {
			addRules = append(addRules, op{kind: opAddRule, name: d.name, rule: r})
		}
	}
	p.cur.ops = append(p.cur.ops, addRules...)

	// @nodeport-ips holds the node addresses NodePorts answer on.
	if !cfg.nodePortMatchAll {
		var want []elemDef
		for _, a := range nodePortAddrs(p.f, cfg.nodePortCIDRs, p.in.localAddrs) {
			want = append(want, elemDef{set: nodePortIPsSet, key: keyAddr(p.f, a)})
		}
		p.syncStaticElements(nodePortIPsSet, want)
	}
	// A fixed set we no longer use (nodeport-ips after nodePortAddresses became "all").
	for _, name := range []string{nodePortIPsSet} {
		if !p.desiredSets.Has(name) && p.set(name) != nil {
			p.emit(op{kind: opDeleteSet, name: name})
			p.putSet(name, nil)
		}
	}
}

// syncStaticElements makes a set owned by the fixed part hold exactly want.
func (p *planner) syncStaticElements(set string, want []elemDef) {
	wantKeys := sets.New[string]()
	var add []elemDef
	for _, e := range want {
		wantKeys.Insert(e.key)
		if _, ok := p.elem(elemRef{set, e.key}); !ok {
			add = append(add, e)
			p.putElem(elemRef{set, e.key}, e.value, true)
		}
	}
	var del []elemDef
	if s := p.base.sets[set]; s != nil {
		for _, k := range sortedKeys(s.elems) {
			if !wantKeys.Has(k) {
				del = append(del, elemDef{set: set, key: k})
				p.putElem(elemRef{set, k}, "", false)
			}
		}
	}
	if len(del) > 0 {
		p.emit(op{kind: opDeleteElements, name: set, elems: del})
	}
	if len(add) > 0 {
		p.emit(op{kind: opAddElements, name: set, elems: add})
	}
}

// planChainRules compiles a chain's rules and fingerprints them.
func (p *planner) planChainRules(d *chainDef) ([]*plannedRule, fingerprint) {
	p.fp.reset()
	p.fp.addChainComment(d.comment)
	out := make([]*plannedRule, 0, len(d.rules))
	for i := range d.rules {
		pr := compileRule(p.f, d.rules[i])
		p.fp.addRule(pr.exprs, pr.c.anon, pr.c.udata)
		out = append(out, pr)
	}
	return out, p.fp.sum()
}

// compileRule compiles r and marshals its expressions once, for both the fingerprint
// and the netlink message.
func compileRule(f *family, r rule) *plannedRule {
	pr := &plannedRule{r: r, c: &compiled{}, anonLookup: -1}
	n := 4 * len(r.terms)
	pr.c.exprs = make([]expr.Any, 0, n)
	pr.exprs = make([][]byte, 0, n)
	for _, t := range r.terms {
		if ct, ok := t.(constantTerm); ok {
			ce := cachedTerm(f, ct)
			if ce.anonLookup >= 0 {
				pr.anonLookup = len(pr.exprs) + ce.anonLookup
			}
			pr.c.exprs = append(pr.c.exprs, ce.exprs...)
			pr.exprs = append(pr.exprs, ce.bytes...)
			if at, ok := t.(anonTerm); ok {
				pr.c.anon = at.anon(f)
			}
			continue
		}
		start := len(pr.c.exprs)
		t.compile(f, pr.c)
		for _, e := range pr.c.exprs[start:] {
			if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
				pr.anonLookup = len(pr.exprs)
			}
			pr.exprs = append(pr.exprs, marshalExpr(f, e))
		}
	}
	if r.comment != "" {
		pr.c.udata = userdata.AppendString(nil, userdata.TypeComment, truncateComment(r.comment))
	}
	return pr
}

func marshalExpr(f *family, e expr.Any) []byte {
	b, err := expr.Marshal(byte(f.nf), e)
	if err != nil {
		// Our own expressions always marshal; a failure is a programming error.
		panic(fmt.Sprintf("nftables: marshal %T: %v", e, err))
	}
	return b
}

// constantTerm is a term whose expressions depend only on the family and its key; they
// are compiled and marshalled once per process (most rules of a large table share them).
type constantTerm interface {
	term
	constKey() string
}

// anonTerm is a term with an anonymous set whose expressions are constant but whose set
// content is not.
type anonTerm interface {
	anon(f *family) *anonSet
}

type cachedExprs struct {
	exprs      []expr.Any
	bytes      [][]byte
	anonLookup int
}

var exprCache sync.Map // family name + "/" + constKey -> *cachedExprs

func cachedTerm(f *family, t constantTerm) *cachedExprs {
	key := f.name + "/" + t.constKey()
	if v, ok := exprCache.Load(key); ok {
		return v.(*cachedExprs)
	}
	c := &compiled{}
	t.compile(f, c)
	ce := &cachedExprs{exprs: c.exprs, anonLookup: -1}
	for i, e := range c.exprs {
		if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
			ce.anonLookup = i
		}
		ce.bytes = append(ce.bytes, marshalExpr(f, e))
	}
	v, _ := exprCache.LoadOrStore(key, ce)
	return v.(*cachedExprs)
}

// Endpoint map blocks.

func (p *planner) block(chain string) *slotBlock {
	if b, ok := p.blocks[chain]; ok {
		return b
	}
	if b, ok := p.base.slots.blocks[chain]; ok {
		return &b
	}
	return nil
}

// blockFor returns the first value of chain's block in endpoint map m: its block if it
// has one there, else a new one (an old one elsewhere is freed). false when the map has
// no room left (4 096 chains hash to it).
func (p *planner) blockFor(chain string, m uint8) (uint32, bool) {
	if cur := p.block(chain); cur != nil && cur.set == m {
		return cur.base, true
	}
	p.freeBlock(chain)
	var b slotBlock
	if free := p.free[m]; len(free) > 0 {
		b = slotBlock{base: free[len(free)-1], set: m}
		p.free[m] = free[:len(free)-1]
		p.fx().takeFree = append(p.fx().takeFree, b)
	} else {
		if p.next[m]+endpointBlockSize > 1<<32 {
			return 0, false
		}
		b = slotBlock{base: uint32(p.next[m]), set: m}
		p.next[m] += endpointBlockSize
		p.fx().next = append(p.fx().next, nextFx{set: m, next: p.next[m]})
	}
	p.blocks[chain] = &b
	p.fx().blocks = append(p.fx().blocks, blockFx{chain: chain, b: &b})
	return b.base, true
}

// freeBlock frees chain's block, if it has one.
func (p *planner) freeBlock(chain string) {
	cur := p.block(chain)
	if cur == nil {
		return
	}
	p.blocks[chain] = nil
	p.fx().blocks = append(p.fx().blocks, blockFx{chain: chain, freed: *cur})
}

// assignSlots gives each chain of objs that uses an endpoint map its block.
func (p *planner) assignSlots(objs *serviceObjects) error {
	for i := range objs.slots {
		u := &objs.slots[i]
		base, ok := p.blockFor(u.chain, uint8(endpointMapIndex(u.term.set)))
		if !ok {
			return fmt.Errorf("endpoint map %s is full", u.term.set)
		}
		u.term.base = base
	}
	return nil
}

// wantBlock records that the block at base of set is in use with n endpoints (full
// plans: the other elements of the endpoint maps are leftovers).
func (p *planner) wantBlock(set string, base uint32, n int) {
	p.wantedBlocks[slotBlock{base: base, set: uint8(endpointMapIndex(set))}] = n
}

// inWantedBlock reports whether an element of an endpoint map (a start key of 4 bytes or
// an end key of 5, as the kernel read gives them) lies in a block in use: a start inside
// it, or an end after its first value up to its last value + 1. planBlockAgainstKernel
// owns those elements.
func (p *planner) inWantedBlock(set string, key string) bool {
	if len(key) != 4 && len(key) != 5 {
		return false
	}
	v := binary.BigEndian.Uint32([]byte(key[:4]))
	base := v &^ (endpointBlockSize - 1)
	if len(key) == 5 {
		if v == 0 {
			return false
		}
		base = (v - 1) &^ (endpointBlockSize - 1)
	}
	_, ok := p.wantedBlocks[slotBlock{base: base, set: uint8(endpointMapIndex(set))}]
	return ok
}

// planSlots writes the endpoint map elements of a Service's chains: each chain's
// endpoints as ranges of its block. The kernel holds, as far as we know, what the read
// found (a full plan) or what the old record says (a partial one). A moved endpoint
// rewrites its range; a changed count rewrites the block's ranges (each endpoint's share
// changes); never a rule.
func (p *planner) planSlots(objs *serviceObjects, old *serviceRecord, rec *serviceRecord, sc *svcScratch) {
	oldSlots := func(chain string) *slotRecord {
		if old == nil {
			return nil
		}
		for i := range old.slots {
			if old.slots[i].chain == chain {
				return &old.slots[i]
			}
		}
		return nil
	}
	f := p.f
	for i := range objs.slots {
		u := &objs.slots[i]
		set, base, n := u.term.set, u.term.base, len(u.eps)
		rec.slots = append(rec.slots, slotRecord{chain: u.chain, set: set, base: base, eps: u.eps})
		if p.in.full {
			p.wantBlock(set, base, n)
			p.planBlockAgainstKernel(set, base, u.eps, sc)
			continue
		}
		o := oldSlots(u.chain)
		if o != nil && o.set == set && o.base == base && len(o.eps) == n {
			for j := range u.eps {
				if ap := u.eps[j].AddrPort(); o.eps[j].AddrPort() != ap {
					lo, hi := blockRange(base, j, n)
					sc.delElems = append(sc.delElems, elemDef{set: set, key: rangeKey(lo, hi)})
					sc.addElems = append(sc.addElems, elemDef{set: set, key: rangeKey(lo, hi), value: endpointValue(f, ap)})
				}
			}
			continue
		}
		if o != nil {
			sc.delElems = appendRanges(f, sc.delElems, o.set, o.base, o.eps, false)
		}
		sc.addElems = appendRanges(f, sc.addElems, set, base, u.eps, true)
	}
	if p.in.full || old == nil {
		return
	}
	// Chains that used a block and no longer exist.
	for i := range old.slots {
		o := &old.slots[i]
		if !sc.slotChains.Has(o.chain) {
			sc.delElems = appendRanges(f, sc.delElems, o.set, o.base, o.eps, false)
		}
	}
}

// appendRanges appends the ranges of a block holding eps (with their endpoints when
// withValues, for adding).
func appendRanges(f *family, out []elemDef, set string, base uint32, eps []model.Endpoint, withValues bool) []elemDef {
	for j := range eps {
		lo, hi := blockRange(base, j, len(eps))
		e := elemDef{set: set, key: rangeKey(lo, hi)}
		if withValues {
			e.value = endpointValue(f, eps[j].AddrPort())
		}
		out = append(out, e)
	}
	return out
}

// planBlockAgainstKernel makes a block what a full read found wrong. A block whose
// elements are not exactly its wanted ranges is rewritten: every element the read found
// in it (starts in [base, base+S), ends in (base, base+S]) is deleted, in the read's
// order, then the wanted ranges are added. Deleting only the wrong boundaries (the outer
// start and end here, the inner ones in the leftovers) made the kernel answer ENOENT
// (6.18): in one transaction it deletes interval elements in the tree's order, each start
// followed by its own end, and misses them otherwise. planLeftovers leaves the elements
// of wanted blocks alone: they are this function's.
func (p *planner) planBlockAgainstKernel(set string, base uint32, eps []model.Endpoint, sc *svcScratch) {
	var kernel intervalElems
	if s := p.base.sets[set]; s != nil {
		kernel = s.intervals
	}
	in := kernel.inBlock(base)
	if len(in) == 2*len(eps) {
		exact := true
		for j := range eps {
			lo, hi := blockRange(base, j, len(eps))
			start, end := &in[2*j], &in[2*j+1]
			if start.end || start.v != lo || !end.end || end.v != hi ||
				start.value() != endpointValue(p.f, eps[j].AddrPort()) {
				exact = false
				break
			}
		}
		if exact {
			return
		}
	}
	for i := range in {
		sc.delElems = append(sc.delElems, elemDef{set: set, key: in[i].key()})
	}
	sc.addElems = appendRanges(p.f, sc.addElems, set, base, eps, true)
}

// One Service.

// build computes the objects of one Service, or the reason it cannot be programmed.
func (p *planner) build(svc types.NamespacedName) (*serviceObjects, error) {
	ports := p.in.desired.PortsOf(svc)
	if len(ports) == 0 {
		return &serviceObjects{}, nil
	}
	if p.in.skipValidation {
		objs := &serviceObjects{}
		for _, sp := range ports {
			buildServicePort(p.in.cfg, p.in.nodeIP, sp, objs)
		}
		return objs, nil
	}
	return buildService(p.in.cfg, p.in.nodeIP, ports)
}

// preclaim builds every Service of a full plan and decides, for each element, who owns
// it: in name order, except that whoever's value the kernel holds keeps it, so that a
// full plan agrees with the partial plans before it.
func (p *planner) preclaim(names []types.NamespacedName) {
	// The objects are built here for their elements, then dropped, and built again when
	// the Service is planned: holding 10 000 Services' objects costs more than
	// building them twice.
	elems := make(map[types.NamespacedName][]elemDef, len(names))
	total := 0
	for _, svc := range names {
		objs, err := p.build(svc)
		if err != nil {
			p.invalid[svc] = err
			if rec := p.in.prevRecords[svc]; rec != nil {
				total += len(rec.elems)
			}
			continue
		}
		if len(objs.slots) > 0 {
			// No group exists yet; the allocation's effects wait for the Service's.
			p.cur = &group{service: svc}
			err := p.assignSlots(objs)
			if p.cur.fx != nil && err == nil {
				p.pendingFx[svc] = p.cur.fx
			}
			p.cur = nil
			if err != nil {
				p.invalid[svc] = err
				if rec := p.in.prevRecords[svc]; rec != nil {
					total += len(rec.elems)
				}
				continue
			}
		}
		total += len(objs.elems)
		elems[svc] = objs.elems
	}
	// Most elements have one claimant: their claim lists are carved out of one array.
	p.claims = make(map[elemRef][]claim, total)
	slab := make([]claim, total)
	add := func(ref elemRef, c claim) {
		cl, ok := p.claims[ref]
		switch {
		case !ok && len(slab) > 0:
			slab[0] = c
			p.claims[ref] = slab[:1:1]
			slab = slab[1:]
			return
		case slices.ContainsFunc(cl, func(x claim) bool { return x.svc == c.svc }):
			return
		case len(cl) > 0 && p.baseHolds(ref, c.value) && !p.baseHolds(ref, cl[0].value):
			cl = slices.Insert(cl, 0, c)
		default:
			cl = append(cl, c)
		}
		p.claims[ref] = cl
	}
	for _, svc := range names {
		if el, ok := elems[svc]; ok {
			for _, e := range el {
				add(elemRef{e.set, e.key}, claim{svc: svc, value: e.value, comment: e.comment})
			}
		} else if rec := p.in.prevRecords[svc]; rec != nil {
			for _, e := range rec.elems {
				add(elemRef{e.set, e.key}, claim{svc: svc, value: e.value, comment: e.comment})
			}
		}
	}
}

// baseHolds reports whether the kernel, before this plan, held element ref with value v.
func (p *planner) baseHolds(ref elemRef, v string) bool {
	if s := p.base.sets[ref.set]; s != nil && s.elems != nil {
		cur, ok := s.elems[ref.key]
		return ok && cur == v
	}
	return false
}

func (p *planner) planService(svc types.NamespacedName) {
	ports := p.in.desired.PortsOf(svc)
	old := p.record(svc)
	objs, ok := p.buildService(svc, old)
	if !ok {
		return
	}
	sc := &p.scratch
	sc.reset()
	rec := &serviceRecord{
		chains: make([]string, 0, len(objs.chains)),
		elems:  make([]elemDef, 0, len(objs.elems)),
	}
	rewriteAll := p.planServiceSets(objs, old, rec, sc)
	p.planServiceChains(objs, rec, sc, rewriteAll)
	p.planServiceElements(svc, objs, old, rec, sc)
	p.retireServiceChains(old, sc)
	p.emitService(sc)

	if len(ports) == 0 {
		if old != nil || p.records[svc] != nil {
			p.putRecord(svc, nil)
		}
	} else {
		p.putRecord(svc, rec)
	}
}

// buildService builds a Service's objects and assigns their endpoint slots. A Service
// that cannot be built is left as it is in the kernel (false), its record kept so that a
// full plan does not take its objects for leftovers.
func (p *planner) buildService(svc types.NamespacedName, old *serviceRecord) (*serviceObjects, bool) {
	var objs *serviceObjects
	var err error
	if p.in.full {
		err = p.invalid[svc]
		if err == nil {
			// Built again (see preclaim); the slots it gets are the ones preclaim
			// allocated, whose effects wait in pendingFx.
			objs, err = p.build(svc)
			if err == nil {
				if fx := p.pendingFx[svc]; fx != nil {
					p.cur.fx = fx
					delete(p.pendingFx, svc)
				}
				err = p.assignSlots(objs)
			}
		}
	} else {
		objs, err = p.build(svc)
		if err == nil {
			err = p.assignSlots(objs)
		}
		if err != nil {
			p.invalid[svc] = err
		}
	}
	if err != nil {
		// Leave the Service as it is in the kernel; keep its record so that a full plan
		// does not take its objects for leftovers.
		if old == nil && p.in.full {
			old = p.in.prevRecords[svc]
		}
		if old != nil {
			p.keepRecord(svc, old)
		}
		return nil, false
	}
	return objs, true
}

// planServiceSets plans the Service's sets; true when a set changed kind, which rewrites
// every chain of the Service.
func (p *planner) planServiceSets(objs *serviceObjects, old *serviceRecord, rec *serviceRecord, sc *svcScratch) bool {
	// Sets first: a set whose type or timeout changed is deleted and added again, and
	// every chain of the Service is then rewritten (its rules reference the set).
	rewriteAll := false
	for i := range objs.sets {
		d := &objs.sets[i]
		sc.newSets.Insert(d.name)
		p.desiredSets.Insert(d.name)
		rec.sets = append(rec.sets, d.name)
		cur := p.set(d.name)
		switch {
		case cur == nil:
			sc.addSets = append(sc.addSets, op{kind: opAddSet, name: d.name, set: d})
			p.putSet(d.name, d)
		case !cur.sameKind(d):
			rewriteAll = true
			sc.delSets = append(sc.delSets, op{kind: opDeleteSet, name: d.name})
			sc.addSets = append(sc.addSets, op{kind: opAddSet, name: d.name, set: d})
			p.cleared.Insert(d.name)
			p.putSet(d.name, d)
		}
	}
	// Sets the Service no longer wants go once no rule references them (their chains
	// are flushed or rewritten in this group), and their elements with them.
	if old != nil {
		for _, name := range old.sets {
			if sc.newSets.Has(name) || p.set(name) == nil {
				continue
			}
			sc.delSets = append(sc.delSets, op{kind: opDeleteSet, name: name})
			p.cleared.Insert(name)
			p.putSet(name, nil)
		}
	}
	return rewriteAll
}

// planServiceChains adds the Service's new chains and rewrites those whose rules changed.
func (p *planner) planServiceChains(objs *serviceObjects, rec *serviceRecord, sc *svcScratch, rewriteAll bool) {
	for i := range objs.slots {
		sc.slotChains.Insert(objs.slots[i].chain)
	}
	for i := range objs.chains {
		d := &objs.chains[i]
		if sc.newChains.Has(d.name) {
			continue
		}
		if !sc.slotChains.Has(d.name) {
			p.freeBlock(d.name) // down to one endpoint: no slots any more
		}
		sc.newChains.Insert(d.name)
		p.desiredChains.Insert(d.name)
		p.unmarkStale(d.name)
		rec.chains = append(rec.chains, d.name)
		planned, fp := p.planChainRules(d)
		cur := p.chain(d.name)
		switch {
		case cur == nil:
			sc.addChains = append(sc.addChains, op{kind: opAddChain, name: d.name, comment: d.comment})
		case cur.fp != fp || rewriteAll:
			sc.flushChains = append(sc.flushChains, op{kind: opFlushChain, name: d.name})
		default:
			continue
		}
		p.putChain(d.name, &chainState{fp: fp})
		for _, r := range planned {
			sc.addRules = append(sc.addRules, op{kind: opAddRule, name: d.name, rule: r})
		}
	}
}

// planServiceElements plans the Service's elements and endpoint slots.
func (p *planner) planServiceElements(svc types.NamespacedName, objs *serviceObjects, old *serviceRecord, rec *serviceRecord, sc *svcScratch) {
	// Elements: update this Service's claims, then make the kernel hold each touched
	// element's first claim.
	for _, e := range objs.elems {
		ref := elemRef{e.set, e.key}
		if _, dup := sc.newElems[ref]; dup {
			continue
		}
		sc.newElems[ref] = e
		rec.elems = append(rec.elems, e)
	}
	p.planSlots(objs, old, rec, sc)
	touched := sc.touched
	if p.in.full {
		// Ownership was decided by preclaim; this group writes the elements it owns.
		fx := p.fx()
		if fx.claims == nil {
			fx.claims = make([]claimsFx, 0, len(rec.elems))
		}
		for _, e := range rec.elems {
			ref := elemRef{e.set, e.key}
			cl := p.claims[ref]
			fx.claims = append(fx.claims, claimsFx{ref, cl})
			if len(cl) > 0 && cl[0].svc == svc {
				touched = append(touched, ref)
			}
		}
	} else {
		touched = p.updateClaims(svc, old, sc.newElems, rec.elems, touched)
	}
	sc.touched = touched
	for _, ref := range touched {
		cl := p.claimsOf(ref)
		cur, present := p.elem(ref)
		switch {
		case len(cl) == 0 && present:
			sc.delElems = append(sc.delElems, elemDef{set: ref.set, key: ref.key})
			p.putElem(ref, "", false)
		case len(cl) > 0 && !present:
			v := cl[0].value
			sc.addElems = append(sc.addElems, elemDef{set: ref.set, key: ref.key, value: v, comment: cl[0].comment})
			p.putElem(ref, v, true)
		case len(cl) > 0 && cur != cl[0].value:
			v := cl[0].value
			sc.delElems = append(sc.delElems, elemDef{set: ref.set, key: ref.key})
			sc.addElems = append(sc.addElems, elemDef{set: ref.set, key: ref.key, value: v, comment: cl[0].comment})
			p.putElem(ref, v, true)
		}
	}
}

// retireServiceChains flushes (and deletes) the chains the Service had and no longer wants.
func (p *planner) retireServiceChains(old *serviceRecord, sc *svcScratch) {
	// What the Service had and no longer wants: chains are flushed (and deleted), sets
	// deleted once no rule references them.
	if old != nil {
		for _, name := range old.chains {
			if sc.newChains.Has(name) || p.chain(name) == nil {
				continue
			}
			sc.flushChains = append(sc.flushChains, op{kind: opFlushChain, name: name})
			sc.delChains = append(sc.delChains, p.retireChain(name)...)
			p.freeBlock(name)
		}
	}
}

// emitService puts the Service's operations into its group, in the order the kernel
// needs: chains added and flushed, then sets deleted (no rule uses them any more) and added,
// rules, elements, and chains deleted last.
func (p *planner) emitService(sc *svcScratch) {
	delOps, addOps := elementOps(opDeleteElements, sc.delElems), elementOps(opAddElements, sc.addElems)
	n := len(sc.addChains) + len(sc.flushChains) + len(sc.delSets) + len(sc.addSets) + len(sc.addRules) +
		len(delOps) + len(addOps) + len(sc.delChains)
	if p.cur.ops == nil {
		p.cur.ops = make([]op, 0, n)
	}
	p.cur.ops = append(p.cur.ops, sc.addChains...)
	p.cur.ops = append(p.cur.ops, sc.flushChains...)
	p.cur.ops = append(p.cur.ops, sc.delSets...)
	p.cur.ops = append(p.cur.ops, sc.addSets...)
	p.cur.ops = append(p.cur.ops, sc.addRules...)
	p.cur.ops = append(p.cur.ops, delOps...)
	p.cur.ops = append(p.cur.ops, addOps...)
	p.cur.ops = append(p.cur.ops, sc.delChains...)
}

// updateClaims replaces the claims of svc (a partial plan) and returns the elements
// whose owner or value may have changed.
func (p *planner) updateClaims(svc types.NamespacedName, old *serviceRecord, newElems map[elemRef]elemDef, elems []elemDef, touched []elemRef) []elemRef {
	if old != nil {
		for _, e := range old.elems {
			ref := elemRef{e.set, e.key}
			if _, keep := newElems[ref]; keep {
				continue
			}
			cl := p.claimsOf(ref)
			if i := slices.IndexFunc(cl, func(c claim) bool { return c.svc == svc }); i >= 0 {
				p.putClaims(ref, slices.Delete(slices.Clone(cl), i, i+1))
				touched = append(touched, ref)
			}
		}
	}
	for _, e := range elems {
		ref := elemRef{e.set, e.key}
		cl := slices.Clone(p.claimsOf(ref))
		c := claim{svc: svc, value: e.value, comment: e.comment}
		switch i := slices.IndexFunc(cl, func(c claim) bool { return c.svc == svc }); {
		case i >= 0:
			cl[i] = c
		case len(cl) > 0 && p.holds(ref, c.value) && !p.holds(ref, cl[0].value):
			cl = slices.Insert(cl, 0, c)
		default:
			cl = append(cl, c)
		}
		p.putClaims(ref, cl)
		touched = append(touched, ref)
	}
	return touched
}

// holds reports whether the kernel's element ref has value v.
func (p *planner) holds(ref elemRef, v string) bool {
	cur, ok := p.elem(ref)
	return ok && cur == v
}

// keepRecord carries a record over unchanged (a Service that failed validation).
func (p *planner) keepRecord(svc types.NamespacedName, r *serviceRecord) {
	p.putRecord(svc, r)
	for _, sl := range r.slots {
		if p.in.full {
			p.wantBlock(sl.set, sl.base, len(sl.eps))
		}
	}
	for _, name := range r.chains {
		p.desiredChains.Insert(name)
	}
	for _, name := range r.sets {
		p.desiredSets.Insert(name)
	}
	for _, e := range r.elems {
		ref := elemRef{e.set, e.key}
		cl := slices.Clone(p.claimsOf(ref))
		if !slices.ContainsFunc(cl, func(c claim) bool { return c.svc == svc }) {
			cl = append(cl, claim{svc: svc, value: e.value, comment: e.comment})
		}
		p.putClaims(ref, cl)
	}
}

// retireChain returns the ops deleting a chain that was just flushed and unreferenced,
// or records it for deletion by a later sync when the kernel needs the delay.
func (p *planner) retireChain(name string) []op {
	if p.in.deleteChainsNow {
		p.putChain(name, nil)
		return []op{{kind: opDeleteChain, name: name}}
	}
	p.putChain(name, &chainState{fp: emptyChainFP})
	p.markStale(name)
	return nil
}

// emptyChainFP is the fingerprint of a chain without rules or comment.
var emptyChainFP = func() fingerprint {
	var f fingerprinter
	f.reset()
	f.addChainComment("")
	return f.sum()
}()

// elementOps groups elements by set, in set order, into one op per set. The elements
// are copied out of the caller's (reused) slice.
func elementOps(kind opKind, elems []elemDef) []op {
	if len(elems) == 0 {
		return nil
	}
	own := slices.Clone(elems)
	slices.SortStableFunc(own, func(a, b elemDef) int { return cmp.Compare(a.set, b.set) })
	var out []op
	for start := 0; start < len(own); {
		end := start + 1
		for end < len(own) && own[end].set == own[start].set {
			end++
		}
		out = append(out, op{kind: kind, name: own[start].set, elems: own[start:end:end]})
		start = end
	}
	return out
}

// Leftovers (full plans): whatever the kernel holds that no Service and no fixed part
// wants anymore.

func (p *planner) planLeftovers() {
	// Elements nobody claims.
	for _, set := range sortedKeys(p.base.sets) {
		s := p.base.sets[set]
		if !p.desiredSets.Has(set) {
			continue
		}
		if isEndpointMap(set) {
			// In the order of s.intervals, nft's: the kernel finds interval elements to
			// delete by walking its tree, and deleting the shared-value elements of two
			// adjacent ranges out of that order fails (ENOENT).
			var del []elemDef
			for i := range s.intervals {
				if k := s.intervals[i].key(); !p.inWantedBlock(set, k) {
					del = append(del, elemDef{set: set, key: k})
				}
			}
			if len(del) > 0 {
				p.emit(op{kind: opDeleteElements, name: set, elems: del})
			}
			continue
		}
		if s.elems == nil || set == nodePortIPsSet {
			continue
		}
		var del []elemDef
		for _, k := range sortedKeys(s.elems) {
			ref := elemRef{set, k}
			if len(p.claimsOf(ref)) > 0 {
				continue
			}
			if _, present := p.elem(ref); !present {
				continue
			}
			del = append(del, elemDef{set: set, key: k})
			p.putElem(ref, "", false)
		}
		if len(del) > 0 {
			p.emit(op{kind: opDeleteElements, name: set, elems: del})
		}
	}
	// Chains nobody wants: flush them all first (they may jump to each other), then
	// drop the sets only they used, then delete them.
	var retire []string
	for _, name := range sortedKeys(p.base.chains) {
		if p.desiredChains.Has(name) || p.chain(name) == nil {
			continue
		}
		if _, waiting := p.stale[name]; waiting && !p.in.deleteChainsNow {
			continue
		}
		if c := p.chain(name); c.base == nil {
			p.emit(op{kind: opFlushChain, name: name})
		}
		retire = append(retire, name)
	}
	for _, name := range sortedKeys(p.base.sets) {
		if !p.desiredSets.Has(name) && p.set(name) != nil {
			p.emit(op{kind: opDeleteSet, name: name})
			p.putSet(name, nil)
		}
	}
	for _, name := range retire {
		p.freeBlock(name)
		if c := p.chain(name); c != nil && c.base != nil {
			// A base chain nothing can reference; it goes at once, rules and all.
			p.emit(op{kind: opDeleteChain, name: name})
			p.putChain(name, nil)
			continue
		}
		p.cur.ops = append(p.cur.ops, p.retireChain(name)...)
	}
}

// deleteStaleChains deletes chains flushed by an earlier sync, once the kernel had time
// to notice they are unreferenced. Chains wanted again are kept.
func (p *planner) deleteStaleChains() {
	for _, name := range sortedKeys(p.stale) {
		since := p.stale[name]
		if p.desiredChains.Has(name) {
			p.unmarkStale(name)
			continue
		}
		if since.Equal(p.in.now) || p.in.now.Sub(since) < staleChainDelay {
			continue
		}
		if p.chain(name) != nil {
			p.emit(op{kind: opDeleteChain, name: name})
			p.putChain(name, nil)
		}
		p.unmarkStale(name)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Effects: changes to the model, applied for the groups the kernel accepted.

type elemValue struct {
	value   string
	present bool
}

type (
	chainFx struct {
		name string
		c    *chainState // nil: deleted
	}
	setFx struct {
		name string
		d    *setDef // nil: deleted
	}
	elemFx struct {
		ref elemRef
		v   elemValue
	}
	claimsFx struct {
		ref    elemRef
		claims []claim
	}
	recordFx struct {
		svc types.NamespacedName
		r   *serviceRecord // nil: the Service is gone
	}
	staleFx struct {
		name  string
		stale bool
	}
	blockFx struct {
		chain string
		b     *slotBlock // the chain's new block, or nil when freed
		freed slotBlock
	}
	nextFx struct {
		set  uint8
		next uint64
	}
)

// groupEffects are what one group changes in the model.
type groupEffects struct {
	table   *bool
	sets    []setFx
	chains  []chainFx
	elems   []elemFx
	claims  []claimsFx
	records []recordFx
	stale   []staleFx
	blocks  []blockFx
	// takeFree lists free blocks now in use; next the new first unused value of maps.
	takeFree []slotBlock
	next     []nextFx
}

// commit applies the effects of a group to the model.
func (s *tableState) commit(g *group, now time.Time) {
	fx := g.fx
	if fx == nil {
		return
	}
	if fx.table != nil {
		s.exists = *fx.table
	}
	for _, e := range fx.sets {
		if e.d == nil {
			delete(s.sets, e.name)
			continue
		}
		st := &setState{def: *e.d}
		if e.d.flags&unix.NFT_SET_EVAL == 0 && !isEndpointMap(e.name) {
			st.elems = map[string]string{}
		}
		s.sets[e.name] = st
	}
	for _, e := range fx.chains {
		if e.c == nil {
			delete(s.chains, e.name)
		} else {
			s.chains[e.name] = e.c
		}
	}
	for _, e := range fx.elems {
		st := s.sets[e.ref.set]
		if st == nil || st.elems == nil {
			continue
		}
		if e.v.present {
			st.elems[e.ref.key] = e.v.value
		} else {
			delete(st.elems, e.ref.key)
		}
	}
	for _, e := range fx.claims {
		if len(e.claims) == 0 {
			delete(s.claims, e.ref)
		} else {
			s.claims[e.ref] = e.claims
		}
	}
	for _, e := range fx.records {
		if e.r == nil {
			delete(s.services, e.svc)
		} else {
			s.services[e.svc] = e.r
		}
	}
	for _, e := range fx.stale {
		if e.stale {
			s.staleChains[e.name] = now
		} else {
			delete(s.staleChains, e.name)
		}
	}
	for _, b := range fx.takeFree {
		free := s.slots.free[b.set]
		if i := slices.Index(free, b.base); i >= 0 {
			s.slots.free[b.set] = slices.Delete(free, i, i+1)
		}
	}
	for _, n := range fx.next {
		s.slots.next[n.set] = max(s.slots.next[n.set], n.next)
	}
	for _, e := range fx.blocks {
		if e.b != nil {
			s.slots.blocks[e.chain] = *e.b
			continue
		}
		if cur, ok := s.slots.blocks[e.chain]; ok && cur == e.freed {
			delete(s.slots.blocks, e.chain)
		}
		s.slots.free[e.freed.set] = append(s.slots.free[e.freed.set], e.freed.base)
	}
}
