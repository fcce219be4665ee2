package nftables

import (
	"encoding/binary"
	"fmt"

	"github.com/sluiceproxy/sluice/pkg/model"
)

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
	if len(in.elems) == 2*len(eps) {
		exact := true
		for j := range eps {
			lo, hi := blockRange(base, j, len(eps))
			start, end := &in.elems[2*j], &in.elems[2*j+1]
			if start.end || start.v != lo || !end.end || end.v != hi ||
				in.value(2*j) != endpointValue(p.f, eps[j].AddrPort()) {
				exact = false
				break
			}
		}
		if exact {
			return
		}
	}
	for i := range in.elems {
		sc.delElems = append(sc.delElems, elemDef{set: set, key: in.elems[i].key()})
	}
	sc.addElems = appendRanges(p.f, sc.addElems, set, base, eps, true)
}
