package nftables

import (
	"cmp"
	"encoding/binary"
	"hash"
	"hash/fnv"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// tableState is the backend's model of its table in the kernel: what it wrote, or what a
// full resync read back. Partial syncs trust it; every full resync replaces the kernel
// part with a fresh read, which is how drift (an element deleted or a chain flushed by
// hand) is found and repaired.
type tableState struct {
	exists bool
	// flags are the table's flags; a dormant or process-owned table is not one we can
	// work with in place.
	flags  uint32
	chains map[string]*chainState
	sets   map[string]*setState

	// Who wants what, from the last plans: partial syncs diff a changed Service against
	// its record instead of against the whole table.
	services map[types.NamespacedName]*serviceRecord
	// claims lists, per element, the Services that want it, in the order they asked; the
	// first one's value is in the kernel. Two Services may want the same element (two
	// Services selecting the same pod port share a hairpin element); it stays until the
	// last one lets go.
	claims map[elemRef][]claim

	// staleChains are flushed chains waiting to be deleted (kernels before 6.2 notice
	// only some time after a map element goes that its chain is unreferenced).
	staleChains map[string]time.Time

	slots slotState
}

// slotState allocates the blocks of the endpoint maps: a chain that keeps its endpoints
// in a map owns one block of endpointBlockSize values of the map its name hashes to (see
// endpointRules). A freed block is used again by a later sync (never by the plan that
// freed it: a group of that plan may fail, and then the block is still in use).
type slotState struct {
	blocks map[string]slotBlock   // by chain
	free   [endpointMaps][]uint32 // by map: bases of free blocks
	next   [endpointMaps]uint64   // by map: first value never used
}

// slotBlock is a block of endpoint map set (its index) starting at base.
type slotBlock struct {
	base uint32
	set  uint8
}

func newSlotState() slotState {
	return slotState{blocks: map[string]slotBlock{}}
}

func newTableState() *tableState {
	return &tableState{
		chains:      map[string]*chainState{},
		sets:        map[string]*setState{},
		services:    map[types.NamespacedName]*serviceRecord{},
		claims:      map[elemRef][]claim{},
		staleChains: map[string]time.Time{},
		slots:       newSlotState(),
	}
}

// chainState is what we know of one chain in the kernel.
type chainState struct {
	base *baseSpec
	// fp fingerprints the rules (and the chain's comment). A zero fp never matches: the
	// content is unknown and the chain is rewritten when it is wanted.
	fp fingerprint
	// handles are the rule handles seen by the last full read, in order; nil when we
	// rewrote the chain since. Equal handles mean the rules (and their constant
	// anonymous sets) cannot have changed since that read.
	handles []uint64
}

// setState is what we know of one named set or map in the kernel.
type setState struct {
	def setDef
	// elems maps raw keys to values ("" in a set, the verdict in a map). nil for sets
	// whose content the datapath owns (affinity sets), and for the endpoint maps.
	elems map[string]string
	// intervals are an endpoint map's elements as a full read found them (nil otherwise:
	// between full resyncs the Services' records stand for them). A read of 10 000
	// Services x 10 endpoints holds 200 000 of them; as map entries with string keys and
	// values they cost five times as much, and a resync holds them while it plans.
	intervals intervalElems
}

// intervalElem is one element of an endpoint map: a range's start (with its endpoint:
// address . port, each padded to 4 bytes, dlen bytes at off in its intervalElems' data)
// or its end (no data).
type intervalElem struct {
	v    uint32
	off  uint32
	end  bool
	dlen uint8
}

// intervalElems are elements sorted as nft sends them: by value, an end before a start.
// The starts' data are kept apart in one array: in IPv4 an endpoint takes 8 bytes, and
// elements with room for IPv6's 20 were 28 bytes each, 5.6 MB at 10 000 x 10.
type intervalElems struct {
	elems []intervalElem
	data  []byte
}

func compareIntervalElems(a, b intervalElem) int {
	if a.v != b.v {
		return cmp.Compare(a.v, b.v)
	}
	switch {
	case a.end == b.end:
		return 0
	case a.end:
		return -1
	}
	return 1
}

// add appends an element (data nil for an end).
func (es *intervalElems) add(v uint32, end bool, data []byte) {
	es.elems = append(es.elems, intervalElem{v: v, off: uint32(len(es.data)), end: end, dlen: uint8(len(data))})
	es.data = append(es.data, data...)
}

// sort puts the elements in nft's order.
func (es intervalElems) sort() { slices.SortFunc(es.elems, compareIntervalElems) }

// reset empties es, keeping its arrays.
func (es *intervalElems) reset() { es.elems, es.data = es.elems[:0], es.data[:0] }

// clone returns a copy of es at its exact size (nil arrays when it is empty).
func (es intervalElems) clone() intervalElems {
	if len(es.elems) == 0 {
		return intervalElems{}
	}
	return intervalElems{elems: slices.Clone(es.elems), data: slices.Clone(es.data)}
}

// inBlock returns the elements of the block at base, in order: starts in [base, base+S),
// ends in (base, base+S].
func (es intervalElems) inBlock(base uint32) intervalElems {
	el := es.elems
	i, _ := slices.BinarySearchFunc(el, intervalElem{v: base, end: false}, compareIntervalElems)
	j := i
	last := uint64(base) + endpointBlockSize
	for j < len(el) && (uint64(el[j].v) < last || uint64(el[j].v) == last && el[j].end) {
		j++
	}
	return intervalElems{elems: el[i:j], data: es.data}
}

// value returns the value of start element i as endpointValue spells it.
func (es intervalElems) value(i int) string {
	e := &es.elems[i]
	return "=" + string(es.data[e.off:e.off+uint32(e.dlen)])
}

// key returns the element's key as the planner names it (startKey or endKey).
func (e *intervalElem) key() string {
	if e.end {
		return endKey(e.v)
	}
	return startKey(e.v)
}

type elemRef struct {
	set string
	key string
}

type claim struct {
	svc     types.NamespacedName
	value   string
	comment string
}

// serviceRecord is what one Service was given by the last plan that covered it.
type serviceRecord struct {
	chains []string
	sets   []string
	elems  []elemDef
	// slots are the endpoint map elements of its chains. They belong to one chain
	// only, so they need no claims, and the model keeps them nowhere else: between full
	// resyncs the records are the model of the endpoint maps.
	slots []slotRecord
}

// equal reports whether r and o give a Service the same objects, with the same endpoint
// lists (the model's slices themselves, not equal copies: a record keeps its list alive).
func (r *serviceRecord) equal(o *serviceRecord) bool {
	return slices.Equal(r.chains, o.chains) && slices.Equal(r.sets, o.sets) && slices.Equal(r.elems, o.elems) &&
		slices.EqualFunc(r.slots, o.slots, func(a, b slotRecord) bool {
			return a.chain == b.chain && a.set == b.set && a.base == b.base && len(a.eps) == len(b.eps) &&
				(len(a.eps) == 0 || &a.eps[0] == &b.eps[0])
		})
}

// slotRecord is one chain's endpoints in an endpoint map: the block at base holds
// len(eps) ranges, range i (blockRange) endpoint i.
type slotRecord struct {
	chain string
	set   string
	base  uint32
	// eps are the model's endpoint list (shared, not copied: published model values are
	// immutable), range i holding eps[i].
	eps []model.Endpoint
}

// fingerprint identifies the content of a chain: a 128-bit FNV-1a of the canonical bytes
// of its rules. Collisions would only make us skip a needed rewrite; at 2^-128 that is
// not a concern.
type fingerprint [16]byte

func (f fingerprint) isZero() bool { return f == fingerprint{} }

// fingerprinter hashes the canonical form of a chain's rules as it goes, without
// building it in memory.
type fingerprinter struct {
	h   hash.Hash
	tmp [4]byte
}

func (p *fingerprinter) reset() {
	if p.h == nil {
		p.h = fnv.New128a()
	}
	p.h.Reset()
}

func (p *fingerprinter) writeLV(b []byte) {
	binary.BigEndian.PutUint32(p.tmp[:], uint32(len(b)))
	p.h.Write(p.tmp[:])
	p.h.Write(b)
}

func (p *fingerprinter) addChainComment(comment string) { p.writeLV([]byte(comment)) }

// addRule adds one rule: its marshalled expressions (anonymous-set lookups without set
// name or ID), the content of its anonymous set, and its userdata.
func (p *fingerprinter) addRule(exprs [][]byte, anon *anonSet, udata []byte) {
	binary.BigEndian.PutUint32(p.tmp[:], uint32(len(exprs)))
	p.h.Write(p.tmp[:])
	for _, e := range exprs {
		p.writeLV(e)
	}
	if anon != nil {
		p.h.Write([]byte{1})
		anon.hashInto(p)
	} else {
		p.h.Write([]byte{0})
	}
	p.writeLV(udata)
}

func (p *fingerprinter) sum() fingerprint {
	var out fingerprint
	p.h.Sum(out[:0])
	if out.isZero() {
		out[0] = 1
	}
	return out
}
