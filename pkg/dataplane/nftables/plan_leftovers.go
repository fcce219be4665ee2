package nftables

import (
	"maps"
	"slices"
)

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
			for i := range s.intervals.elems {
				if k := s.intervals.elems[i].key(); !p.inWantedBlock(set, k) {
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
	return slices.Sorted(maps.Keys(m))
}
