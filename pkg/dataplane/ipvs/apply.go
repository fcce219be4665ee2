package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// The applier: runs a plan's operations in order, keeps the kernel view current with every
// one that succeeds, and sorts failures into the Service's and the sync's.

// execute runs p and returns the sync's result (Full is set by the caller). A Service
// whose operations the kernel rejects is put back as good says it was (see rollback.go).
func (b *Backend) execute(ctx context.Context, p *plan, full bool, good *lastGood) dataplane.Result {
	failed := map[types.NamespacedName]error{}
	fail := func(name types.NamespacedName, err error) {
		if prev, ok := failed[name]; ok {
			err = fmt.Errorf("%w; %w", prev, err)
		}
		failed[name] = err
	}
	var syncErrs []error

	for _, o := range p.setup {
		if err := b.run(ctx, o); err != nil {
			return dataplane.Result{Err: fmt.Errorf("%s: %w", o, err)}
		}
	}

	rejected := sets.New[types.NamespacedName]()
	for _, so := range p.services {
		if err := ctx.Err(); err != nil {
			return dataplane.Result{Err: err}
		}
		if err, undone := b.runServiceOps(ctx, so); err != nil {
			fail(so.name, err)
			rejected.Insert(so.name)
			if !undone {
				syncErrs = append(syncErrs, fmt.Errorf("undoing the rejected update of Service %s failed", so.name))
			}
		}
		if len(so.errs) > 0 {
			fail(so.name, describeFailures(so.errs))
		}
	}
	if rejected.Len() > 0 {
		r, err := b.revert(ctx, rejected, good)
		if err != nil {
			syncErrs = append(syncErrs, fmt.Errorf("putting back the last good version of %v: %w", sortedNames(rejected), err))
		}
		b.idx.mergeReverted(p, r)
		for key, owner := range b.draining {
			if rejected.Has(owner) {
				delete(b.draining, key)
			}
		}
		for key, owner := range r.draining {
			b.draining[key] = owner
		}
	}

	for _, o := range p.adds {
		if err := b.run(ctx, o); err != nil {
			err = fmt.Errorf("%s: %w", o, err)
			if o.owner != (types.NamespacedName{}) {
				fail(o.owner, err)
			} else {
				syncErrs = append(syncErrs, err)
			}
		}
	}

	if err := b.writeRules(ctx, p, full); err != nil {
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(b.cfg.Family.String()).Inc()
		syncErrs = append(syncErrs, err)
	}

	for _, o := range p.deletes {
		if err := b.run(ctx, o); err != nil {
			syncErrs = append(syncErrs, fmt.Errorf("%s: %w", o, err))
		}
	}

	res := dataplane.Result{Err: errors.Join(syncErrs...)}
	if len(failed) > 0 {
		res.Failed = failed
	}
	return res
}

// writeRules writes the iptables rules: on a full sync always, with the jump rules and the
// removal of other modes' chains; otherwise only when the rules changed.
func (b *Backend) writeRules(ctx context.Context, p *plan, full bool) error {
	rs := renderRules(ruleConfig{
		family: b.cfg.Family, markBit: b.cfg.MasqueradeBit, masqueradeAll: b.cfg.MasqueradeAll, detector: b.cfg.LocalDetector,
	}, b.idx.outFilterRules())
	text := rs.text()
	var fixes map[string]*tableFixes
	if full {
		parsed, err := xtables.ReadSaved(ctx, b.ipt)
		if err != nil {
			return fmt.Errorf("read iptables rules: %w", err)
		}
		fixes = planFixes(parsed)
		if b.drift != nil && b.rules != "" {
			ruleDrift(b.drift, parsed, b.ruleCounts, fixes)
		}
	} else if text == b.rules {
		return nil
	}
	b.rules = ""
	if err := b.ipt.Restore(ctx, restoreInput(rs, fixes)); err != nil {
		return fmt.Errorf("write iptables rules: %w", err)
	}
	b.stats.Restores++
	b.rules, b.ruleCounts = text, ruleCounts(rs)
	return nil
}

// run performs one operation, idempotently: adding what exists updates it, deleting what
// is gone succeeds. On success the kernel view follows.
func (b *Backend) run(ctx context.Context, o op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.opts.fault != nil && b.opts.fault(o) {
		o = rejectedByKernel(o)
	}
	b.logger.V(4).Info("IPVS operation", "op", o.String())
	var err error
	switch o.kind {
	case opCreateLink, opBindAddr, opUnbindAddr:
		err = b.runLinkOp(o)
	case opAddVS, opUpdateVS, opDeleteVS:
		err = b.runServiceOp(o)
	case opAddRS, opUpdateRS, opDeleteRS:
		err = b.runDestinationOp(o)
	case opCreateSet, opRecreateSet, opAddEntry, opDelEntry:
		err = b.runSetOp(ctx, o)
	default:
		err = fmt.Errorf("unknown operation %d", o.kind)
	}
	if err == nil {
		b.stats.Operations[opNames[o.kind]]++
	}
	return err
}

// runLinkOp runs an operation on the dummy device and the addresses bound to it and keeps the view in step.
func (b *Backend) runLinkOp(o op) error {
	v := b.view
	var err error
	switch o.kind {
	case opCreateLink:
		err = ignore(b.links.CreateDummy(dummyDevice), errExist)
		if err == nil {
			v.linkExists = true
		}
	case opBindAddr:
		err = ignore(b.links.AddAddr(dummyDevice, o.addr), errExist)
		if err == nil {
			v.bound[o.addr] = true
		}
	case opUnbindAddr:
		err = ignore(b.links.DelAddr(dummyDevice, o.addr), errNotExist)
		if err == nil {
			delete(v.bound, o.addr)
		}
	}
	return err
}

// runServiceOp runs an operation on IPVS virtual servers and keeps the view in step.
func (b *Backend) runServiceOp(o op) error {
	v := b.view
	var err error
	switch o.kind {
	case opAddVS:
		err = orElse(b.ipvs.AddService(o.vs, o.params), errExist, func() error { return b.ipvs.UpdateService(o.vs, o.params) })
		err = schedulerError(err, o.params.Scheduler)
		if err == nil {
			v.services[o.vs] = o.params
			v.dests[o.vs] = nil
		}
	case opUpdateVS:
		err = orElse(b.ipvs.UpdateService(o.vs, o.params), errNotExist, func() error { return b.ipvs.AddService(o.vs, o.params) })
		err = schedulerError(err, o.params.Scheduler)
		if err == nil {
			v.services[o.vs] = o.params
		}
	case opDeleteVS:
		err = ignore(b.ipvs.DeleteService(o.vs), errNotExist)
		if err == nil {
			delete(v.services, o.vs)
			delete(v.dests, o.vs)
			delete(b.draining, o.vs)
		}
	}
	return err
}

// runDestinationOp runs an operation on IPVS real servers and keeps the view in step.
func (b *Backend) runDestinationOp(o op) error {
	v := b.view
	var err error
	switch o.kind {
	case opAddRS:
		err = orElse(b.ipvs.AddDestination(o.vs, o.rs, o.weight), errExist, func() error { return b.ipvs.UpdateDestination(o.vs, o.rs, o.weight) })
		if err == nil {
			v.setDest(o.vs, o.rs, o.weight)
		}
	case opUpdateRS:
		err = b.ipvs.UpdateDestination(o.vs, o.rs, o.weight)
		if errors.Is(err, errNotExist) && o.weight > 0 {
			err = b.ipvs.AddDestination(o.vs, o.rs, o.weight)
		} else if errors.Is(err, errNotExist) {
			err = nil // nothing left to drain
			v.deleteDest(o.vs, o.rs)
			break
		}
		if err == nil {
			v.setDest(o.vs, o.rs, o.weight)
		}
	case opDeleteRS:
		err = ignore(b.ipvs.DeleteDestination(o.vs, o.rs), errNotExist)
		if err == nil {
			v.deleteDest(o.vs, o.rs)
		}
	}
	return err
}

// runSetOp runs an operation on ipsets and their entries and keeps the view in step.
func (b *Backend) runSetOp(ctx context.Context, o op) error {
	v := b.view
	family := b.cfg.Family
	var err error
	switch o.kind {
	case opCreateSet:
		t := ipsets[o.set].typ
		err = ignore(b.sets.Create(ipsetName(o.set, family), t, family), errExist)
		if err == nil {
			if _, ok := v.sets[o.set]; !ok {
				v.sets[o.set] = &kernelSet{Type: t, Entries: map[setEntry]bool{}}
			}
		}
	case opRecreateSet:
		err = b.recreateSet(ctx, o.set)
	case opAddEntry:
		err = ignore(b.sets.Add(ipsetName(o.set, family), ipsets[o.set].typ, o.entry), errExist)
		if err == nil {
			if ks := v.sets[o.set]; ks != nil {
				ks.Entries[o.entry] = true
			}
		}
	case opDelEntry:
		err = ignore(b.sets.Del(ipsetName(o.set, family), ipsets[o.set].typ, o.entry), errNotExist)
		if err == nil {
			if ks := v.sets[o.set]; ks != nil {
				delete(ks.Entries, o.entry)
			}
		}
	}
	return err
}

// rejectedByKernel turns o into an operation the kernel refuses, for tests of a rejected
// update (withFault): a real server weight IPVS refuses (ERANGE), or a scheduler it does
// not have.
func rejectedByKernel(o op) op {
	switch o.kind {
	case opAddRS, opUpdateRS:
		o.weight = -1
	case opAddVS, opUpdateVS:
		o.params.Scheduler = "sluice-test-rejected"
	}
	return o
}

func schedulerError(err error, scheduler string) error {
	if errors.Is(err, errNoScheduler) {
		return fmt.Errorf("IPVS scheduler %q is not available in this kernel (load ip_vs_%s, or change the Service's ipvs.sluice.dev/scheduler annotation): %w", scheduler, scheduler, err)
	}
	return err
}

// recreateSet replaces a set of the wrong type or family (someone else's, or an old
// kube-proxy's) with the backend's own. ipset refuses to destroy a set that iptables rules
// still use, and only the backend's own chains use these sets: they are flushed first (the
// rules are rewritten later in this sync).
func (b *Backend) recreateSet(ctx context.Context, id ipsetID) error {
	name, t := ipsetName(id, b.cfg.Family), ipsets[id].typ
	err := b.sets.Destroy(name)
	if err != nil && !errors.Is(err, errNotExist) {
		if rerr := b.ipt.Restore(ctx, flushOwnChainsInput()); rerr != nil {
			return fmt.Errorf("flush rules using ipset %s: %w", name, rerr)
		}
		b.rules = ""
		err = b.sets.Destroy(name)
		if err != nil && !errors.Is(err, errNotExist) {
			return fmt.Errorf("destroy ipset %s of the wrong type: %w", name, err)
		}
	}
	if err := b.sets.Create(name, t, b.cfg.Family); err != nil && !errors.Is(err, errExist) {
		return err
	}
	b.view.sets[id] = &kernelSet{Type: t, Entries: map[setEntry]bool{}}
	return nil
}

// setDest records in the view that vs has real server rs at weight, when the view holds
// vs's real servers (those it read or created in this sync).
func (v *kernelView) setDest(vs vsKey, rs netip.AddrPort, weight int) {
	dests, read := v.dests[vs]
	if !read {
		return
	}
	for i := range dests {
		if dests[i].Addr == rs {
			dests[i].Weight = weight
			return
		}
	}
	v.dests[vs] = append(dests, realServer{Addr: rs, Weight: weight})
}

// deleteDest records in the view that vs no longer has real server rs.
func (v *kernelView) deleteDest(vs vsKey, rs netip.AddrPort) {
	if dests, read := v.dests[vs]; read {
		v.dests[vs] = slices.DeleteFunc(dests, func(d realServer) bool { return d.Addr == rs })
	}
}

// ignore is err, or nil when err is target: the kernel already is as the operation wants
// (an add of what exists, a delete of what is gone).
func ignore(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return err
}

// orElse is err, or what fallback returns when err is target: the kernel is not as the
// view said (an add of what exists is retried as an update, an update of what is gone as
// an add).
func orElse(err, target error, fallback func() error) error {
	if errors.Is(err, target) {
		return fallback()
	}
	return err
}
