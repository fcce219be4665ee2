package nftables

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

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

// putOrDelete sets m[k] to v when present, and removes k from m otherwise.
func putOrDelete[K comparable, V any](m map[K]V, k K, v V, present bool) {
	if present {
		m[k] = v
	} else {
		delete(m, k)
	}
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
		putOrDelete(s.chains, e.name, e.c, e.c != nil)
	}
	for _, e := range fx.elems {
		st := s.sets[e.ref.set]
		if st == nil || st.elems == nil {
			continue
		}
		putOrDelete(st.elems, e.ref.key, e.v.value, e.v.present)
	}
	for _, e := range fx.claims {
		putOrDelete(s.claims, e.ref, e.claims, len(e.claims) != 0)
	}
	for _, e := range fx.records {
		putOrDelete(s.services, e.svc, e.r, e.r != nil)
	}
	for _, e := range fx.stale {
		putOrDelete(s.staleChains, e.name, now, e.stale)
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
