package nftables

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The applier sends a plan as a sequence of transactions. Each transaction holds whole
// groups, so that it is a consistent step: a Service's chains, sets and map elements
// arrive together, and Services not in the batch are untouched. That keeps forwarding
// working for everything already programmed while a large table is loaded, and bounds
// the size of any one netlink message and transaction.
//
// When the kernel rejects a batch it says which messages it did not like; the groups of
// those messages are left out and the rest is sent again. If an error cannot be traced
// to a group, the batch is split in two and each half retried, until the culprit is
// alone.

// batchLimits bound one transaction.
type batchLimits struct {
	bytes    int
	messages int
}

// defaultBatchLimits were chosen by measurement (docs/benchmarks-nftables.md). Every
// commit that adds a rule makes the kernel validate the whole table, so fewer, larger
// batches load faster (a cold 10 000 x 10 table: 162 batches of 64 KiB take 2.4 times as
// long as one); 4 MiB (3 batches for that table) was within a few percent of one batch.
// 2 MiB (6 batches) took the same CPU time in the same run (BenchmarkColdSync, 1.93 s of
// user and system time either way, means of 3), and halves what a batch holds while it is
// built and sent: its groups' operations and its encoded messages, about 14 MB of the
// cold start's live heap at 4 MiB (heap profile at a send). It still lets other
// nf_tables users in between, and keeps the answer buffers small.
var defaultBatchLimits = batchLimits{bytes: 2 << 20, messages: 32768}

// applyResult tells what happened to a plan's groups (each group's applied field says
// whether the kernel took it).
type applyResult struct {
	// failed holds the kernel's reason for each Service group it rejected.
	failed map[types.NamespacedName]error
	// err is a failure that is not a Service's: the fixed part was rejected, or the
	// outcome of a batch is unknown. Groups after it were not sent.
	err error
	// cleanupFailed tells that err is the rejection of the leftovers' cleanup.
	cleanupFailed bool
	// cleanupErr is the rejection of the leftovers' cleanup until the batch's other
	// groups are sent; finish makes it err.
	cleanupErr error
	// batches counts transactions committed.
	batches int
}

// batchSender sends one transaction (conn.sendBatch; a fake in unit tests).
type batchSender interface {
	sendBatch(msgs []byte, count int) ([]batchError, error)
}

type applier struct {
	c      batchSender
	f      *family
	limits batchLimits
	// fault, in tests, adds a bad message to the groups of some Services.
	fault func(svc types.NamespacedName) faultKind
}

// faultKind is a bad message tests inject into a Service's group.
type faultKind int

const (
	noFault faultKind = iota
	// faultMissingChain adds a rule to a chain that does not exist: the kernel rejects
	// that message.
	faultMissingChain
	// faultLoop makes a chain jump to itself: the kernel accepts every message and
	// rejects the batch as a whole when it validates the table at commit.
	faultLoop
)

// batcher receives a plan's groups in order, and sends them as batches fill. The kernel
// took a group: its effects are committed to the model at once (the planner reads its
// own view first, so it does not mind), and its ops dropped unless keepOps.
type batcher struct {
	a       *applier
	replace bool
	keepOps bool
	// state is the model groups are committed to (nil: none, tests); now stamps them.
	state   *tableState
	now     time.Time
	pending []*group
	size    int
	msgs    int
	res     applyResult
}

func newBatcher(a *applier, keepOps bool) *batcher {
	return &batcher{a: a, keepOps: keepOps, res: applyResult{failed: map[types.NamespacedName]error{}}}
}

func (b *batcher) begin(replace bool, state *tableState) {
	b.replace = replace
	if b.state != nil || replace {
		b.state = state
	}
}

// add takes the next group of the plan.
func (b *batcher) add(g *group) {
	if b.res.err != nil {
		return // the sync failed as a whole: nothing after it is sent
	}
	if len(g.ops) == 0 && len(b.pending) == 0 && !b.replace {
		// Effects only, and no group before it waits for the kernel: committed now,
		// rather than held until the next batch goes (a full resync that changes
		// nothing would hold every Service's effects to its end).
		b.pending = append(b.pending, g)
		b.flush()
		return
	}
	gs, gm := groupSize(g)
	if !b.replace && len(b.pending) > 0 && (b.size+gs > b.a.limits.bytes || b.msgs+gm > b.a.limits.messages) {
		b.flush()
		if b.res.err != nil {
			return
		}
	}
	b.pending = append(b.pending, g)
	b.size += gs
	b.msgs += gm
}

// flush sends the pending groups.
func (b *batcher) flush() {
	var withOps []*group
	for _, g := range b.pending {
		if len(g.ops) > 0 {
			withOps = append(withOps, g)
		} else {
			g.applied = true // effects only
		}
	}
	b.a.sendIsolating(withOps, b.replace, &b.res)
	for _, g := range b.pending {
		if g.applied && b.state != nil {
			b.state.commit(g, b.now)
		}
		if !b.keepOps {
			g.ops = nil
			g.fx = nil
		}
	}
	b.pending, b.size, b.msgs = b.pending[:0], 0, 0
}

// finish sends what is left and returns the outcome.
func (b *batcher) finish() *applyResult {
	if b.res.err == nil && len(b.pending) > 0 {
		b.flush()
	}
	if b.res.err == nil && b.res.cleanupErr != nil {
		b.res.err, b.res.cleanupFailed = b.res.cleanupErr, true
	}
	return &b.res
}

// apply sends a collected plan (tests); it commits nothing.
func (a *applier) apply(p *Plan) *applyResult {
	bt := newBatcher(a, true)
	bt.begin(p.replace, nil)
	for _, g := range p.groups {
		bt.add(g)
	}
	return bt.finish()
}

// groupSize estimates the bytes and messages of a group (rule sizes are known; the rest
// is small).
func groupSize(g *group) (int, int) {
	size, msgs := 0, 0
	for i := range g.ops {
		o := &g.ops[i]
		switch o.kind {
		case opAddRule:
			msgs++
			size += 64 + len(o.name)
			for _, x := range o.rule.exprs {
				size += len(x) + 4
			}
			if a := o.rule.c.anon; a != nil {
				msgs += 2
				size += 128
				for _, e := range a.elems {
					size += 48 + len(e.key) + len(e.data) + len(e.verdict)
				}
			}
		case opAddElements, opDeleteElements:
			msgs += 1 + len(o.elems)/500
			for _, e := range o.elems {
				size += 32 + len(e.key) + len(e.value) + len(e.comment)
			}
		default:
			msgs++
			size += 64 + len(o.name)
		}
	}
	return size, msgs
}

// sendIsolating sends groups as one batch, leaving out the groups the kernel rejects,
// and splitting the batch when a rejection cannot be attributed. It marks the groups
// the kernel took as applied.
func (a *applier) sendIsolating(groups []*group, replace bool, res *applyResult) {
	// The first try of a batch puts its endpoint map additions last (deferredOp). When the
	// kernel rejects it, the batch is sent again in plan order before anyone is blamed: a
	// rejection at commit is replayed message by message, and a message validating the
	// table after the culprit's would be blamed too.
	defer1 := true
	for len(groups) > 0 && res.err == nil {
		deferElems := defer1
		defer1 = false
		enc, where := a.encodeBatch(groups, deferElems)
		errs, err := a.c.sendBatch(enc.b.buf, enc.count)
		putBatchBuffer(enc.b.buf)
		if err != nil {
			res.err = err
			return
		}
		if len(errs) == 0 {
			res.batches++
			for _, g := range groups {
				g.applied = true
			}
			return
		}
		if deferElems {
			continue // again, in plan order, to find the culprits
		}
		bad, unattributed := blame(errs, where)
		for gi, e := range bad {
			if g := groups[gi]; !g.isService() && !g.cleanup {
				res.err = fmt.Errorf("fixed part of the table rejected: %w", e)
				return
			}
		}
		if len(bad) == 0 && unattributed {
			a.splitUnattributed(groups, replace, errs[0], res)
			return
		}
		groups = leaveOut(groups, bad, res)
	}
}

// encodeBatch encodes groups as one batch, with the endpoint map additions last when
// deferElems, and says which group and operation each message comes from.
func (a *applier) encodeBatch(groups []*group, deferElems bool) (*encoder, []opRef) {
	enc := newEncoder(a.f)
	enc.b.buf = getBatchBuffer(64 << 10)
	var where []opRef
	encode := func(gi int, o *op) {
		before := enc.count
		enc.encodeOp(o, gi)
		for m := before; m < enc.count; m++ {
			where = append(where, opRef{group: gi, op: o})
		}
	}
	for gi, g := range groups {
		for oi := range g.ops {
			if !deferElems || !deferredOp(&g.ops[oi]) {
				encode(gi, &g.ops[oi])
			}
		}
		if a.fault != nil && g.isService() {
			if bad := faultOp(a.f, a.fault(g.service), g); bad != nil {
				encode(gi, bad)
			}
		}
	}
	for gi, g := range groups {
		for oi := range g.ops {
			if deferElems && deferredOp(&g.ops[oi]) {
				encode(gi, &g.ops[oi])
			}
		}
	}
	return enc, where
}

// blame says which groups the kernel objected to (by index, with the first error of
// each), and whether some error named no message of the batch.
func blame(errs []batchError, where []opRef) (map[int]error, bool) {
	bad := map[int]error{}
	unattributed := false
	for _, e := range errs {
		if e.index < 0 || e.index >= len(where) {
			unattributed = true
			continue
		}
		ref := where[e.index]
		if _, seen := bad[ref.group]; !seen {
			bad[ref.group] = fmt.Errorf("%s: %w", ref.op.describe(), e)
		}
	}
	return bad, unattributed
}

// splitUnattributed handles a rejection no message was blamed for: a single group takes
// the blame, a replacement gives up, other batches are sent again in halves.
func (a *applier) splitUnattributed(groups []*group, replace bool, first batchError, res *applyResult) {
	if len(groups) == 1 {
		g := groups[0]
		e := fmt.Errorf("transaction rejected: %w", first)
		switch {
		case g.cleanup:
			res.cleanupErr = fmt.Errorf("removing leftovers rejected: %w", e)
		case !g.isService():
			res.err = e
		default:
			res.failed[g.service] = e
		}
		return
	}
	if replace {
		// Halves of a replacement are not valid transactions; give up.
		res.err = fmt.Errorf("table replacement rejected: %w", first)
		return
	}
	mid := len(groups) / 2
	a.sendIsolating(groups[:mid], false, res)
	a.sendIsolating(groups[mid:], false, res)
}

// leaveOut returns the groups the kernel did not object to, recording the others.
func leaveOut(groups []*group, bad map[int]error, res *applyResult) []*group {
	kept := make([]*group, 0, len(groups))
	for gi, g := range groups {
		if e, isBad := bad[gi]; isBad {
			if g.cleanup {
				// Left out like a rejected Service: the Services in its batch are
				// still programmed. The sync fails (the next one is full and plans
				// the cleanup again from a fresh read).
				res.cleanupErr = fmt.Errorf("removing leftovers rejected: %w", e)
				continue
			}
			res.failed[g.service] = e
			continue
		}
		kept = append(kept, g)
	}
	return kept
}

// deferredOp reports whether o goes at the end of its batch: additions to the endpoint
// maps. Binding a map from a new rule makes the kernel walk every element the map holds
// (nf_tables_bind_set), so a batch that adds rules and then elements Service after
// Service walks, for each rule, the elements of the Services before it in the same batch:
// a cold start of 10 000 Services costs twice the system time it does with the elements
// after all the rules. Nothing in a batch depends on those elements (they hold data, no
// chain), and the transaction is atomic either way.
func deferredOp(o *op) bool { return o.kind == opAddElements && isEndpointMap(o.name) }

// opRef says which op of which group a message of a batch came from.
type opRef struct {
	group int
	op    *op
}

// faultOp returns the bad op of an injected fault, or nil.
func faultOp(f *family, k faultKind, g *group) *op {
	switch k {
	case faultMissingChain:
		return &op{kind: opAddRule, name: "no-such-chain", rule: compileRule(f, rule{terms: []term{dropVerdict}})}
	case faultLoop:
		for _, o := range g.ops {
			if o.kind == opAddRule {
				return &op{kind: opAddRule, name: o.name, rule: compileRule(f, rule{terms: []term{jumpTo(o.name)}})}
			}
		}
	}
	return nil
}

// opVerbs say what each kind of op does, in error messages.
var opVerbs = [...]string{
	opAddTable:       "add table",
	opDeleteTable:    "delete table",
	opAddChain:       "add chain",
	opFlushChain:     "flush chain",
	opDeleteChain:    "delete chain",
	opAddRule:        "add rule to chain",
	opAddSet:         "add set",
	opDeleteSet:      "delete set",
	opAddElements:    "add elements to",
	opDeleteElements: "delete elements from",
}

// describe names an op for error messages: its verb and the chain or set it changes (the
// table is always kube-proxy's, so it is not named).
func (o *op) describe() string {
	switch {
	case int(o.kind) >= len(opVerbs):
		return "op"
	case o.kind == opAddTable || o.kind == opDeleteTable:
		return opVerbs[o.kind]
	}
	return opVerbs[o.kind] + " " + o.name
}
