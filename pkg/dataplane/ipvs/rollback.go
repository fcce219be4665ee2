package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

// The failure rule (see pkg/dataplane): a Service whose update the kernel rejects keeps
// its last good programming. IPVS has no transactions, so a Service's operations are
// undone when one of them fails: each operation that succeeded is answered, in reverse
// order, by one that puts back what the kernel view held before it. Then the desired
// index is given the Service's last good record again, so that the set entries, addresses
// and rules it needs stay, and those only its rejected version needed are not written.

// undoOf returns the operations that put back what v holds before o runs.
func undoOf(o op, v *kernelView) []op {
	switch o.kind {
	case opAddVS, opUpdateVS:
		if params, ok := v.services[o.vs]; ok {
			return []op{{kind: opUpdateVS, vs: o.vs, params: params, owner: o.owner}}
		}
		return []op{{kind: opDeleteVS, vs: o.vs, owner: o.owner}}
	case opDeleteVS:
		params, ok := v.services[o.vs]
		if !ok {
			return nil
		}
		out := []op{{kind: opAddVS, vs: o.vs, params: params, owner: o.owner}}
		for _, rs := range v.dests[o.vs] {
			out = append(out, op{kind: opAddRS, vs: o.vs, rs: rs.Addr, weight: rs.Weight, owner: o.owner})
		}
		return out
	case opAddRS, opUpdateRS, opDeleteRS:
		for _, rs := range v.dests[o.vs] {
			if rs.Addr == o.rs {
				return []op{{kind: opUpdateRS, vs: o.vs, rs: o.rs, weight: rs.Weight, owner: o.owner}}
			}
		}
		return []op{{kind: opDeleteRS, vs: o.vs, rs: o.rs, owner: o.owner}}
	}
	return nil
}

// runServiceOps runs one Service's operations in order. When one fails, those that
// succeeded are undone, so that the kernel holds what it held before; the error says
// what failed, and undone reports whether the undo succeeded.
func (b *Backend) runServiceOps(ctx context.Context, so serviceOps) (err error, undone bool) {
	var undo [][]op
	for _, o := range so.ops {
		u := undoOf(o, b.view)
		if err := b.run(ctx, o); err != nil {
			return fmt.Errorf("%s: %w", o, err), b.undo(ctx, so.name, undo)
		}
		undo = append(undo, u)
	}
	return nil, true
}

// undo runs the undo operations of a Service in reverse order. Undoing must not be cut
// short by a cancelled context: it is what leaves the kernel consistent.
func (b *Backend) undo(ctx context.Context, name types.NamespacedName, undo [][]op) bool {
	ctx = context.WithoutCancel(ctx)
	ok := true
	for i := len(undo) - 1; i >= 0; i-- {
		for _, o := range undo[i] {
			if err := b.run(ctx, o); err != nil {
				b.logger.Error(err, "Could not undo an IPVS operation of a rejected Service update; the next full sync repairs it",
					"service", klog.KRef(name.Namespace, name.Name), "op", o.String())
				ok = false
			}
		}
	}
	return ok
}

// lastGood is, for the Services in scope of a sync, their record before it: what the
// kernel holds for them as far as the backend knows.
type lastGood struct {
	records map[types.NamespacedName]*serviceRecord
	// known is false on a full sync without a trusted previous index (the first after a
	// start, or after a sync failed as a whole): then a Service's last good record is
	// what the kernel holds of the virtual servers its new version wants (adoptedRecord).
	known bool
}

// recordOf returns name's last good record (nil: the Service was absent).
func (g *lastGood) recordOf(name types.NamespacedName, rejected *serviceRecord, k *kernelView) *serviceRecord {
	if g.known {
		return g.records[name]
	}
	return adoptedRecord(rejected, k)
}

// adoptedRecord is the record of what k holds for the virtual servers of r: the
// scheduler and flags the kernel has, and its real servers in rotation. It stands for a
// Service's last good version when the backend does not know it (a full sync after a
// start), so that a Service whose new version the kernel rejects keeps what the kernel
// held for it rather than losing it. Set entries and rules are r's.
func adoptedRecord(r *serviceRecord, k *kernelView) *serviceRecord {
	if r == nil {
		return nil
	}
	out := &serviceRecord{members: r.members, outFilter: r.outFilter}
	for _, d := range r.vss {
		params, ok := k.services[d.key]
		if !ok {
			continue
		}
		a := d
		a.params, a.realServers = params, nil
		for _, rs := range k.dests[d.key] {
			if rs.Weight > 0 {
				a.realServers = append(a.realServers, rs.Addr)
			}
		}
		slices.SortFunc(a.realServers, func(x, y netip.AddrPort) int { return x.Compare(y) })
		out.vss = append(out.vss, a)
	}
	return out
}

// revert gives the rejected Services their last good record back in the index and
// converges them to it (after the undo there is normally nothing left to do). It
// returns the plan of that, whose adds, deletes and draining replace the rejected
// Services' share of the sync's plan.
func (b *Backend) revert(ctx context.Context, rejected sets.Set[types.NamespacedName], good *lastGood) (*plan, error) {
	records := make(map[types.NamespacedName]*serviceRecord, rejected.Len())
	for name := range rejected {
		records[name] = good.recordOf(name, b.idx.records[name], b.view)
	}
	p := makePlan(&planInput{
		family: b.cfg.Family, records: records, scope: rejected, kernel: b.view, exclude: b.settings.ExcludeCIDRs,
	}, b.idx)
	var errs []error
	for _, so := range p.services {
		for _, o := range so.ops {
			if err := b.run(context.WithoutCancel(ctx), o); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", o, err))
				break
			}
		}
	}
	return p, errors.Join(errs...)
}

// wants reports whether the index still needs what an add or delete operation is about:
// after a revert, the sync's adds and deletes are kept only where they still agree.
func (x *desiredIndex) wants(o op) bool {
	switch o.kind {
	case opBindAddr, opUnbindAddr:
		return x.bound[o.addr] > 0
	case opAddEntry, opDelEntry:
		if o.set == setIPVSIPs {
			return x.bound[o.entry.IP] > 0
		}
		return x.entries[setMember{set: o.set, entry: o.entry}] > 0
	case opDeleteVS:
		_, held := x.owners[o.vs]
		return held
	}
	return false
}

// mergeReverted replaces the rejected Services' share of p's adds and deletes with that of
// the revert plan r, keeping only what the index (now with their last good records) still
// agrees with.
func (x *desiredIndex) mergeReverted(p, r *plan) {
	var adds, deletes []op
	seen := map[string]bool{}
	for _, o := range slices.Concat(r.adds, p.adds) {
		if k := o.String(); !seen[k] && x.wants(o) {
			seen[k] = true
			adds = append(adds, o)
		}
	}
	for _, o := range slices.Concat(r.deletes, p.deletes) {
		if k := o.String(); !seen[k] && !x.wants(o) {
			seen[k] = true
			deletes = append(deletes, o)
		}
	}
	// Set entries go before the virtual servers, addresses last (as makePlan orders them).
	rank := map[opKind]int{opDelEntry: 0, opDeleteVS: 1, opUnbindAddr: 2}
	slices.SortStableFunc(deletes, func(a, b op) int { return rank[a.kind] - rank[b.kind] })
	p.adds, p.deletes = adds, deletes
}
