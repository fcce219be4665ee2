package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Ruleset generations: a periodic full resync that reads nothing when nothing changed.
//
// nf_tables numbers the rulesets of a network namespace: every committed transaction,
// whoever sends it (sluice, nft, iptables-nft, a CNI plugin), adds one to the
// namespace's generation (NFT_MSG_GETGEN), and nothing else changes it. So when the
// generation is still the one our own last commit produced, and every commit since our
// last full read was ours, the kernel holds exactly what the backend's model says: the
// periodic full resync has no drift to find and skips reading the table back, which
// at 10 000 Services takes hundreds of milliseconds during which no endpoint change can
// be programmed (the p99 of network programming under churn, issue 14).
//
// The watch is shared by every conn of a network namespace (the IPv4 and IPv6 backends
// commit to the same generation counter) and errs one way only: any doubt (a commit it
// did not see, a lost answer, an unknown namespace) counts as a foreign change, after
// which the next periodic resync reads the table as before.

// genWatch is what sluice knows of one network namespace's ruleset generations.
type genWatch struct {
	mu sync.Mutex
	// last is the generation after the last commit or check this process made, when known.
	last  uint32
	known bool
	// foreign counts the times a generation moved without a commit of ours: a backend
	// whose last full read saw the same count has seen every foreign change.
	foreign uint64
}

var (
	genWatchesMu sync.Mutex
	genWatches   = map[uint64]*genWatch{}
)

// genWatchFor returns the watch of the network namespace with inode ns, or a private one
// (never shared, so never trusted across conns) when ns is 0 (unknown).
func genWatchFor(ns uint64) *genWatch {
	if ns == 0 {
		return &genWatch{}
	}
	genWatchesMu.Lock()
	defer genWatchesMu.Unlock()
	w := genWatches[ns]
	if w == nil {
		w = &genWatch{}
		genWatches[ns] = w
	}
	return w
}

// currentNetns returns the inode of the calling thread's network namespace, 0 if unknown.
func currentNetns() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0
	}
	return st.Ino
}

// observe records a generation read outside a commit of ours and returns the foreign
// count: a generation other than the last known one means someone else committed.
func (w *genWatch) observe(gen uint32) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.known || gen != w.last {
		w.foreign++
	}
	w.last, w.known = gen, true
	return w.foreign
}

// committed records one transaction of ours: the generation just before it was sent and
// just after its answers were read. committed says whether the kernel took it (one
// generation more) or rejected it (the same generation).
func (w *genWatch) committed(before, after uint32, committed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	want := before
	if committed {
		want++
		if want == 0 {
			want = 1 // the kernel skips generation 0
		}
	}
	if !w.known || before != w.last || after != want {
		w.foreign++
	}
	w.last, w.known = after, true
}

// doubt records that a change of ours may or may not have been committed (an answer
// lost): the next check cannot trust the generation.
func (w *genWatch) doubt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.foreign++
	w.known = false
}

// errNoGeneration is an answer to NFT_MSG_GETGEN without a generation.
var errNoGeneration = errors.New("no generation in the kernel's answer")

// generationLocked asks the kernel for the namespace's ruleset generation (c.mu held).
func (c *conn) generationLocked() (uint32, error) {
	m, err := c.requestLocked(unix.NFT_MSG_GETGEN, unix.AF_UNSPEC, nil)
	if err != nil {
		return 0, fmt.Errorf("read the ruleset generation: %w", err)
	}
	if m == nil || len(m.data) < nfgenHdrLen {
		return 0, errNoGeneration
	}
	for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
		if it.typ == unix.NFTA_GEN_ID && len(it.val) == 4 {
			return binary.BigEndian.Uint32(it.val), nil
		}
	}
	return 0, errNoGeneration
}

// unchangedSince reports whether no foreign commit happened in this namespace since the
// watch's foreign count was seen (a full read's), asking the kernel now.
func (c *conn) unchangedSince(foreign uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	gen, err := c.generationLocked()
	if err != nil {
		return false
	}
	return c.gens.observe(gen) == foreign
}

// readMark records the generation before a full read and returns the foreign count the
// read stands for: every foreign change up to now is in what the read will see.
func (c *conn) readMark() (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gen, err := c.generationLocked()
	if err != nil {
		return 0, false
	}
	return c.gens.observe(gen), true
}
