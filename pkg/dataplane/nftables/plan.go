package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

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
func plan(in *planInput) *Plan {
	p := newPlanner(in, in.state)
	if in.full {
		if p.incompatible() {
			// The table cannot be converged in place (a set or map of ours exists with
			// another type, a chain we need as a base chain is a regular one, ...):
			// rebuild it in one transaction, so that there is no moment without rules.
			p = newPlanner(in, newTableState())
			p.plan()
			out := p.result()
			out.replace = true
			out.groups = append([]group{{ops: []op{{kind: opDeleteTable, name: kubeProxyTable}}}}, out.groups...)
			return out
		}
	}
	p.plan()
	return p.result()
}

// planner plans against a view: the starting state plus what earlier groups of the
// same plan changed. Every change is also recorded as an effect of the current group,
// so that the model can be updated with exactly the groups the kernel accepted.
type planner struct {
	in   *planInput
	f    *family
	base *tableState

	exists  *bool
	chains  map[string]*chainState // nil value: deleted
	sets    map[string]*setDef     // nil value: deleted
	elems   map[elemRef]*string    // nil value: deleted
	records map[types.NamespacedName]*serviceRecord
	claims  map[elemRef][]claim
	stale   map[string]time.Time

	// desiredChains and desiredSets are the chains and sets this plan wants (full plans:
	// all of them; partial plans: those of the changed Services).
	desiredChains sets.Set[string]
	desiredSets   sets.Set[string]

	groups  []group
	cur     *group
	invalid map[types.NamespacedName]error
	fp      fingerprinter
}

func newPlanner(in *planInput, base *tableState) *planner {
	p := &planner{
		in: in, f: in.cfg.f, base: base,
		chains:        map[string]*chainState{},
		sets:          map[string]*setDef{},
		elems:         map[elemRef]*string{},
		records:       map[types.NamespacedName]*serviceRecord{},
		claims:        map[elemRef][]claim{},
		stale:         map[string]time.Time{},
		desiredChains: sets.New[string](),
		desiredSets:   sets.New[string](),
		invalid:       map[types.NamespacedName]error{},
	}
	for k, v := range base.staleChains {
		p.stale[k] = v
	}
	return p
}

func (p *planner) result() *Plan {
	return &Plan{fam: p.f, groups: p.groups, invalid: p.invalid, full: p.in.full, staleChains: p.stale}
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
		if v == nil {
			return "", false
		}
		return *v, true
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

func (p *planner) setTableExists(v bool) {
	p.exists = &v
	p.cur.effects = append(p.cur.effects, effect{kind: effTable, exists: v})
}

func (p *planner) putChain(name string, c *chainState) {
	p.chains[name] = c
	p.cur.effects = append(p.cur.effects, effect{kind: effChain, name: name, chain: c})
}

func (p *planner) putSet(name string, d *setDef) {
	p.sets[name] = d
	p.cur.effects = append(p.cur.effects, effect{kind: effSet, name: name, set: d})
}

func (p *planner) putElem(ref elemRef, value *string) {
	p.elems[ref] = value
	p.cur.effects = append(p.cur.effects, effect{kind: effElem, ref: ref, value: value})
}

func (p *planner) putRecord(svc types.NamespacedName, r *serviceRecord) {
	p.records[svc] = r
	p.cur.effects = append(p.cur.effects, effect{kind: effRecord, svc: svc, record: r})
}

func (p *planner) putClaims(ref elemRef, c []claim) {
	p.claims[ref] = c
	p.cur.effects = append(p.cur.effects, effect{kind: effClaims, ref: ref, claims: c})
}

func (p *planner) markStale(name string) {
	p.stale[name] = p.in.now
	p.cur.effects = append(p.cur.effects, effect{kind: effStale, name: name, stale: true})
}

func (p *planner) unmarkStale(name string) {
	if _, ok := p.stale[name]; ok {
		delete(p.stale, name)
		p.cur.effects = append(p.cur.effects, effect{kind: effStale, name: name})
	}
}

func (p *planner) startGroup(svc types.NamespacedName) {
	p.groups = append(p.groups, group{service: svc})
	p.cur = &p.groups[len(p.groups)-1]
}

// endGroup drops a group that turned out empty.
func (p *planner) endGroup() {
	if len(p.cur.ops) == 0 && len(p.cur.effects) == 0 {
		p.groups = p.groups[:len(p.groups)-1]
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
	for _, svc := range names {
		p.startGroup(svc)
		p.planService(svc)
		p.endGroup()
	}

	p.startGroup(types.NamespacedName{})
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
			v := e.value
			p.putElem(elemRef{set, e.key}, &v)
		}
	}
	var del []elemDef
	if s := p.base.sets[set]; s != nil {
		for _, k := range sortedKeys(s.elems) {
			if !wantKeys.Has(k) {
				del = append(del, elemDef{set: set, key: k})
				p.putElem(elemRef{set, k}, nil)
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
		p.fp.addRule(pr.canon)
		pr.canon = nil
		out = append(out, pr)
	}
	return out, p.fp.sum()
}

// compileRule compiles r and marshals its expressions once, for both the fingerprint
// and the netlink message.
func compileRule(f *family, r rule) *plannedRule {
	c := r.compile(f)
	pr := &plannedRule{r: r, c: c, anonLookup: -1}
	pr.exprs = make([][]byte, len(c.exprs))
	for i, e := range c.exprs {
		b, err := expr.Marshal(byte(f.nf), e)
		if err != nil {
			// Our own expressions always marshal; a failure is a programming error.
			panic(fmt.Sprintf("nftables: marshal %T: %v", e, err))
		}
		pr.exprs[i] = b
		if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
			pr.anonLookup = i
		}
	}
	pr.canon = canonicalRule(pr.exprs, c.anon, c.udata)
	return pr
}

// canonicalRule is the byte form two equal rules share, whether compiled by us or read
// from the kernel.
func canonicalRule(exprs [][]byte, anon *anonSet, udata []byte) []byte {
	var out []byte
	for _, e := range exprs {
		out = appendLV(out, e)
	}
	out = append(out, 0xfe)
	if anon != nil {
		out = anon.canonical(out)
	}
	out = append(out, 0xfd)
	return appendLV(out, udata)
}

// One Service.

func (p *planner) planService(svc types.NamespacedName) {
	ports := p.in.desired.PortsOf(svc)
	old := p.record(svc)
	var objs *serviceObjects
	if len(ports) > 0 {
		var err error
		if p.in.skipValidation {
			objs = &serviceObjects{}
			for _, sp := range ports {
				buildServicePort(p.in.cfg, p.in.nodeIP, sp, objs)
			}
		} else {
			objs, err = buildService(p.in.cfg, p.in.nodeIP, ports)
		}
		if err != nil {
			p.invalid[svc] = err
			// Leave the Service as it is in the kernel; keep its record so that a
			// full plan does not take its objects for leftovers.
			if old == nil && p.in.full {
				old = p.in.prevRecords[svc]
			}
			if old != nil {
				p.keepRecord(svc, old)
			}
			return
		}
	}
	if objs == nil {
		objs = &serviceObjects{}
	}

	var (
		addChains, flushChains, delSets, addSets, addRules, delChains []op
		delElems, addElems                                            = map[string][]elemDef{}, map[string][]elemDef{}
	)
	rec := &serviceRecord{}

	// Sets first: a set whose type or timeout changed is deleted and added again, and
	// every chain of the Service is then rewritten (its rules reference the set).
	rewriteAll := false
	newSets := sets.New[string]()
	for i := range objs.sets {
		d := &objs.sets[i]
		newSets.Insert(d.name)
		p.desiredSets.Insert(d.name)
		rec.sets = append(rec.sets, d.name)
		cur := p.set(d.name)
		switch {
		case cur == nil:
			addSets = append(addSets, op{kind: opAddSet, name: d.name, set: d})
			p.putSet(d.name, d)
		case !cur.sameKind(d):
			rewriteAll = true
			delSets = append(delSets, op{kind: opDeleteSet, name: d.name})
			addSets = append(addSets, op{kind: opAddSet, name: d.name, set: d})
			p.putSet(d.name, d)
		}
	}

	newChains := sets.New[string]()
	for i := range objs.chains {
		d := &objs.chains[i]
		if newChains.Has(d.name) {
			continue
		}
		newChains.Insert(d.name)
		p.desiredChains.Insert(d.name)
		p.unmarkStale(d.name)
		rec.chains = append(rec.chains, d.name)
		planned, fp := p.planChainRules(d)
		cur := p.chain(d.name)
		switch {
		case cur == nil:
			addChains = append(addChains, op{kind: opAddChain, name: d.name, comment: d.comment})
		case cur.fp != fp || rewriteAll:
			flushChains = append(flushChains, op{kind: opFlushChain, name: d.name})
		default:
			continue
		}
		p.putChain(d.name, &chainState{fp: fp})
		for _, r := range planned {
			addRules = append(addRules, op{kind: opAddRule, name: d.name, rule: r})
		}
	}

	// Elements: update this Service's claims, then make the kernel hold each touched
	// element's first claim.
	newElems := map[elemRef]elemDef{}
	for _, e := range objs.elems {
		ref := elemRef{e.set, e.key}
		if _, dup := newElems[ref]; dup {
			continue
		}
		newElems[ref] = e
		rec.elems = append(rec.elems, e)
	}
	var touched []elemRef
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
	for _, e := range rec.elems {
		ref := elemRef{e.set, e.key}
		cl := slices.Clone(p.claimsOf(ref))
		c := claim{svc: svc, value: e.value, comment: e.comment}
		if i := slices.IndexFunc(cl, func(c claim) bool { return c.svc == svc }); i >= 0 {
			cl[i] = c
		} else {
			cl = append(cl, c)
		}
		p.putClaims(ref, cl)
		touched = append(touched, ref)
	}
	for _, ref := range touched {
		cl := p.claimsOf(ref)
		cur, present := p.elem(ref)
		switch {
		case len(cl) == 0 && present:
			delElems[ref.set] = append(delElems[ref.set], elemDef{set: ref.set, key: ref.key})
			p.putElem(ref, nil)
		case len(cl) > 0 && !present:
			v := cl[0].value
			addElems[ref.set] = append(addElems[ref.set], elemDef{set: ref.set, key: ref.key, value: v, comment: cl[0].comment})
			p.putElem(ref, &v)
		case len(cl) > 0 && cur != cl[0].value:
			v := cl[0].value
			delElems[ref.set] = append(delElems[ref.set], elemDef{set: ref.set, key: ref.key})
			addElems[ref.set] = append(addElems[ref.set], elemDef{set: ref.set, key: ref.key, value: v, comment: cl[0].comment})
			p.putElem(ref, &v)
		}
	}

	// What the Service had and no longer wants: chains are flushed (and deleted), sets
	// deleted once no rule references them.
	if old != nil {
		for _, name := range old.chains {
			if newChains.Has(name) || p.chain(name) == nil {
				continue
			}
			flushChains = append(flushChains, op{kind: opFlushChain, name: name})
			delChains = append(delChains, p.retireChain(name)...)
		}
		for _, name := range old.sets {
			if newSets.Has(name) || p.set(name) == nil {
				continue
			}
			delSets = append(delSets, op{kind: opDeleteSet, name: name})
			p.putSet(name, nil)
		}
	}

	ops := slices.Concat(addChains, flushChains, delSets, addSets, addRules)
	ops = append(ops, elementOps(opDeleteElements, delElems)...)
	ops = append(ops, elementOps(opAddElements, addElems)...)
	ops = append(ops, delChains...)
	p.cur.ops = append(p.cur.ops, ops...)

	if len(ports) == 0 {
		if old != nil || p.records[svc] != nil {
			p.putRecord(svc, nil)
		}
	} else {
		p.putRecord(svc, rec)
	}
}

// keepRecord carries a record over unchanged (a Service that failed validation).
func (p *planner) keepRecord(svc types.NamespacedName, r *serviceRecord) {
	p.putRecord(svc, r)
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
			p.putClaims(ref, append(cl, claim{svc: svc, value: e.value, comment: e.comment}))
		}
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
	f.addChainComment("")
	return f.sum()
}()

func elementOps(kind opKind, bySet map[string][]elemDef) []op {
	var out []op
	for _, set := range sortedKeys(bySet) {
		out = append(out, op{kind: kind, name: set, elems: bySet[set]})
	}
	return out
}

// Leftovers (full plans): whatever the kernel holds that no Service and no fixed part
// wants anymore.

func (p *planner) planLeftovers() {
	// Elements nobody claims.
	for _, set := range sortedKeys(p.base.sets) {
		s := p.base.sets[set]
		if s.elems == nil || set == nodePortIPsSet || !p.desiredSets.Has(set) {
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
			p.putElem(ref, nil)
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

// Effects.

type effectKind uint8

const (
	effTable effectKind = iota
	effChain
	effSet
	effElem
	effRecord
	effClaims
	effStale
)

// effect is one change to the model, applied when the group that made it reached the
// kernel.
type effect struct {
	kind   effectKind
	name   string
	ref    elemRef
	svc    types.NamespacedName
	exists bool
	chain  *chainState
	set    *setDef
	value  *string
	record *serviceRecord
	claims []claim
	stale  bool
}

// commit applies the effects of a group to the model.
func (s *tableState) commit(g *group, now time.Time) {
	for i := range g.effects {
		e := &g.effects[i]
		switch e.kind {
		case effTable:
			s.exists = e.exists
		case effChain:
			if e.chain == nil {
				delete(s.chains, e.name)
			} else {
				s.chains[e.name] = e.chain
			}
		case effSet:
			if e.set == nil {
				delete(s.sets, e.name)
				continue
			}
			st := &setState{def: *e.set}
			if e.set.flags&unix.NFT_SET_EVAL == 0 {
				st.elems = map[string]string{}
			}
			s.sets[e.name] = st
		case effElem:
			st := s.sets[e.ref.set]
			if st == nil || st.elems == nil {
				continue
			}
			if e.value == nil {
				delete(st.elems, e.ref.key)
			} else {
				st.elems[e.ref.key] = *e.value
			}
		case effRecord:
			if e.record == nil {
				delete(s.services, e.svc)
			} else {
				s.services[e.svc] = e.record
			}
		case effClaims:
			if len(e.claims) == 0 {
				delete(s.claims, e.ref)
			} else {
				s.claims[e.ref] = e.claims
			}
		case effStale:
			if e.stale {
				s.staleChains[e.name] = now
			} else {
				delete(s.staleChains, e.name)
			}
		}
	}
}
