package nftables

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// One Service.

// build computes the objects of one Service, or the reason it cannot be programmed.
func (p *planner) build(svc types.NamespacedName) (*serviceObjects, error) {
	ports := p.in.desired.PortsOf(svc)
	if len(ports) == 0 {
		return &serviceObjects{}, nil
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
		if prev := p.in.prevRecords[svc]; prev != nil && slices.Equal(prev.elems, objs.elems) {
			// The claims then share the record's strings (see planService).
			elems[svc] = prev.elems
		}
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
		if prev := p.in.prevRecords[svc]; p.in.full && prev != nil && prev.equal(rec) {
			// A full resync finds most Services as they were: their records stay, and
			// the ones just built are garbage at once rather than a second copy of
			// every record held until the resync ends.
			rec = prev
		}
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
