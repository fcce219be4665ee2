package nftables

import (
	"encoding/binary"
	"hash/fnv"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
}

func newTableState() *tableState {
	return &tableState{
		chains:      map[string]*chainState{},
		sets:        map[string]*setState{},
		services:    map[types.NamespacedName]*serviceRecord{},
		claims:      map[elemRef][]claim{},
		staleChains: map[string]time.Time{},
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
	// whose content the datapath owns (affinity sets).
	elems map[string]string
	// comments of elements, kept only for rendering; not compared.
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
}

// fingerprint identifies the content of a chain: a 128-bit FNV-1a of the canonical bytes
// of its rules. Collisions would only make us skip a needed rewrite; at 2^-128 that is
// not a concern.
type fingerprint [16]byte

func (f fingerprint) isZero() bool { return f == fingerprint{} }

// fingerprinter accumulates canonical rule bytes.
type fingerprinter struct {
	buf []byte
}

func (p *fingerprinter) reset() { p.buf = p.buf[:0] }

func (p *fingerprinter) addChainComment(comment string) {
	p.buf = appendLV(p.buf, []byte(comment))
}

func (p *fingerprinter) addRule(canonical []byte) {
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(canonical)))
	p.buf = append(p.buf, canonical...)
}

func (p *fingerprinter) sum() fingerprint {
	h := fnv.New128a()
	h.Write(p.buf)
	var out fingerprint
	copy(out[:], h.Sum(nil))
	if out.isZero() {
		out[0] = 1
	}
	return out
}
