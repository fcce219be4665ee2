package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// The planner: desired records and the kernel view in, operations out. It is pure; the
// applier (apply.go) runs the operations and the tests run them against a fake kernel.

// opKind is what one operation does.
type opKind int

const (
	opCreateLink opKind = iota
	opCreateSet
	opRecreateSet
	opAddVS
	opUpdateVS
	opDeleteVS
	opAddRS
	opUpdateRS
	opDeleteRS
	opBindAddr
	opUnbindAddr
	opAddEntry
	opDelEntry
)

var opNames = map[opKind]string{
	opCreateLink: "create-link", opCreateSet: "create-set", opRecreateSet: "recreate-set",
	opAddVS: "add-vs", opUpdateVS: "update-vs", opDeleteVS: "delete-vs",
	opAddRS: "add-rs", opUpdateRS: "update-rs", opDeleteRS: "delete-rs",
	opBindAddr: "bind", opUnbindAddr: "unbind", opAddEntry: "add-entry", opDelEntry: "del-entry",
}

// op is one kernel operation.
type op struct {
	kind   opKind
	vs     vsKey
	params vsParams
	rs     netip.AddrPort
	weight int
	set    ipsetID
	entry  setEntry
	addr   netip.Addr
	// owner is the Service an operation is done for; its failure is that Service's. A zero
	// owner makes a failure the whole sync's.
	owner types.NamespacedName
}

// String renders an operation for logs, errors and tests, e.g.
// "add-rs TCP/10.96.0.10:80 10.244.1.2:8080 weight 1".
func (o op) String() string {
	name := opNames[o.kind]
	switch o.kind {
	case opCreateLink:
		return name + " " + dummyDevice
	case opCreateSet, opRecreateSet:
		return fmt.Sprintf("%s %s %s", name, ipsets[o.set].name, ipsets[o.set].typ)
	case opAddVS, opUpdateVS:
		return fmt.Sprintf("%s %s %s", name, o.vs, o.params)
	case opDeleteVS:
		return name + " " + o.vs.String()
	case opAddRS, opUpdateRS:
		return fmt.Sprintf("%s %s %s weight %d", name, o.vs, o.rs, o.weight)
	case opDeleteRS:
		return fmt.Sprintf("%s %s %s", name, o.vs, o.rs)
	case opBindAddr, opUnbindAddr:
		return fmt.Sprintf("%s %s %s", name, dummyDevice, o.addr)
	case opAddEntry, opDelEntry:
		return fmt.Sprintf("%s %s %s", name, ipsets[o.set].name, o.entry)
	}
	return name
}

// serviceOps are the operations of one Service, run in order; the first failure stops them
// and fails the Service (and only it).
type serviceOps struct {
	name types.NamespacedName
	ops  []op
	// errs are problems found while planning (a frontend another Service holds): the
	// Service is reported failed even when its operations succeed.
	errs []error
}

// planInput is what the planner reads.
type planInput struct {
	family model.IPFamily
	full   bool
	// records hold every Service's record after this sync (unchanged Services keep theirs).
	records map[types.NamespacedName]*serviceRecord
	// scope are the Services to converge (every Service on a full sync).
	scope sets.Set[types.NamespacedName]
	// owners say which Service each virtual server in the kernel belongs to, from the last
	// sync. A full sync of a restarted process starts with none.
	owners map[vsKey]types.NamespacedName
	// kernel is the kernel view; it holds the real servers of every virtual server that a
	// Service in scope wants and the kernel has.
	kernel *kernelView
	// exclude are ipvs.excludeCIDRs of this family: virtual servers there are never deleted.
	exclude []netip.Prefix
}

// plan is the planner's output, run in field order.
type plan struct {
	// setup creates the dummy device and the ipsets; a failure fails the sync.
	setup []op
	// services converge each Service in scope (sorted by name).
	services []serviceOps
	// adds bind addresses and add set entries before the iptables rules are written.
	adds []op
	// deletes run last: stale set entries, addresses and (full syncs) leftover virtual servers.
	deletes []op
	// owners is the ownership after this sync.
	owners map[vsKey]types.NamespacedName
	// bound are the addresses the dummy device must hold.
	bound map[netip.Addr]bool
	// outFilter are the KUBE-IPVS-OUT-FILTER rules, sorted.
	outFilter []outFilterRule
	// draining are the virtual servers (and their owners) still holding a real server at
	// weight 0 after this plan, waiting for its connections to end.
	draining map[vsKey]types.NamespacedName
}

// numOps counts every operation of the plan.
func (p *plan) numOps() int {
	n := len(p.setup) + len(p.adds) + len(p.deletes)
	for _, s := range p.services {
		n += len(s.ops)
	}
	return n
}

// makePlan computes the operations that take the kernel from in.kernel to in.records.
func makePlan(in *planInput) *plan {
	p := &plan{
		owners:   make(map[vsKey]types.NamespacedName, len(in.owners)),
		bound:    map[netip.Addr]bool{},
		draining: map[vsKey]types.NamespacedName{},
	}
	k := in.kernel

	// Setup: the device, then the sets (only when absent, or of the wrong type).
	if !k.linkExists {
		p.setup = append(p.setup, op{kind: opCreateLink})
	}
	for id := ipsetID(0); id < numIPSets; id++ {
		ks, ok := k.sets[id]
		switch {
		case !ok:
			p.setup = append(p.setup, op{kind: opCreateSet, set: id})
		case ks.Type != ipsets[id].typ || (ks.Family != 0 && ks.Family != afOf(in.family) && ipsets[id].typ != typeBitmapPort):
			p.setup = append(p.setup, op{kind: opRecreateSet, set: id})
		}
	}

	// Ownership. A Service in scope gives up the frontends it no longer wants; then every
	// Service in scope claims its frontends. A frontend held by a Service that still wants
	// it stays with that Service; the other one fails for that frontend.
	released := map[vsKey]types.NamespacedName{}
	for key, owner := range in.owners {
		if in.scope.Has(owner) && in.records[owner].vs(key) == nil {
			released[key] = owner
			continue
		}
		if !in.scope.Has(owner) && in.records[owner].vs(key) == nil {
			// The owner's record no longer has it, yet the owner is not in scope (it was
			// deleted outside a sync, or its record was replaced): the frontend is free.
			released[key] = owner
			continue
		}
		p.owners[key] = owner
	}
	names := sortedNames(in.scope)
	conflicts := map[types.NamespacedName][]error{}
	for _, name := range names {
		r := in.records[name]
		if r == nil {
			continue
		}
		for _, d := range r.vss {
			if holder, ok := p.owners[d.key]; ok && holder != name {
				conflicts[name] = append(conflicts[name], fmt.Errorf("%s (port %s) is already used by Service %s", d.key, d.port, holder.String()))
				continue
			}
			p.owners[d.key] = name
			delete(released, d.key)
		}
	}

	// Per Service: virtual servers, real servers, and the frontends given up.
	releasedBy := map[types.NamespacedName][]vsKey{}
	for key, owner := range released {
		releasedBy[owner] = append(releasedBy[owner], key)
	}
	deletedVS := map[vsKey]bool{}
	for _, name := range names {
		so := serviceOps{name: name, errs: conflicts[name]}
		if r := in.records[name]; r != nil {
			for i := range r.vss {
				d := &r.vss[i]
				if p.owners[d.key] != name {
					continue
				}
				ops, err := planVS(name, d, k, p.draining)
				if err != nil {
					so.errs = append(so.errs, err)
					continue
				}
				so.ops = append(so.ops, ops...)
			}
		}
		gone := releasedBy[name]
		slices.SortFunc(gone, compareVSKeys)
		for _, key := range gone {
			if _, ok := k.services[key]; ok && !excluded(key.Addr, in.exclude) {
				so.ops = append(so.ops, op{kind: opDeleteVS, vs: key, owner: name})
				deletedVS[key] = true
			}
		}
		if len(so.ops) > 0 || len(so.errs) > 0 {
			p.services = append(p.services, so)
		}
	}
	// Frontends released by Services outside scope (their record lost them without a sync
	// in scope) are deleted as leftovers below.

	// Addresses on the dummy device: every owned frontend that binds.
	addrOwner := map[netip.Addr]types.NamespacedName{}
	for key, owner := range p.owners {
		if d := in.records[owner].vs(key); d != nil && d.bind {
			p.bound[key.Addr] = true
			if cur, ok := addrOwner[key.Addr]; !ok || owner.String() < cur.String() {
				addrOwner[key.Addr] = owner
			}
		}
	}
	for _, a := range sortedAddrs(p.bound) {
		if !k.bound[a] {
			p.adds = append(p.adds, op{kind: opBindAddr, addr: a, owner: addrOwner[a]})
		}
	}

	// Set entries: the union of every record's, plus the bound addresses in KUBE-IPVS-IPS.
	want := make([]map[setEntry]types.NamespacedName, numIPSets)
	for id := range want {
		want[id] = map[setEntry]types.NamespacedName{}
	}
	outFilter := map[outFilterRule]bool{}
	for name, r := range in.records {
		if r == nil {
			continue
		}
		for _, m := range r.members {
			if cur, ok := want[m.set][m.entry]; !ok || name.String() < cur.String() {
				want[m.set][m.entry] = name
			}
		}
		for _, f := range r.outFilter {
			outFilter[f] = true
		}
	}
	for a, owner := range addrOwner {
		want[setIPVSIPs][setEntry{IP: a}] = owner
	}
	for id := ipsetID(0); id < numIPSets; id++ {
		var have map[setEntry]bool
		if ks, ok := k.sets[id]; ok && !setNeedsRecreate(p.setup, id) {
			have = ks.Entries
		}
		for _, e := range sortedEntries(want[id]) {
			if !have[e] {
				p.adds = append(p.adds, op{kind: opAddEntry, set: id, entry: e, owner: want[id][e]})
			}
		}
		for _, e := range sortedEntrySet(have) {
			if _, ok := want[id][e]; !ok {
				p.deletes = append(p.deletes, op{kind: opDelEntry, set: id, entry: e})
			}
		}
	}
	for f := range outFilter {
		p.outFilter = append(p.outFilter, f)
	}
	slices.SortFunc(p.outFilter, compareOutFilter)

	for _, a := range sortedAddrs(k.bound) {
		if !p.bound[a] {
			p.deletes = append(p.deletes, op{kind: opUnbindAddr, addr: a})
		}
	}

	// Leftover virtual servers: on full syncs, every virtual server of this family that no
	// Service owns, outside excludeCIDRs. Also, on any sync, those released by Services out
	// of scope.
	var leftovers []vsKey
	for key := range k.services {
		if _, owned := p.owners[key]; owned || deletedVS[key] || excluded(key.Addr, in.exclude) {
			continue
		}
		if _, rel := released[key]; in.full || rel {
			leftovers = append(leftovers, key)
		}
	}
	slices.SortFunc(leftovers, compareVSKeys)
	for _, key := range leftovers {
		p.deletes = append(p.deletes, op{kind: opDeleteVS, vs: key})
	}
	return p
}

// planVS converges one virtual server of one Service and records whether real servers are
// left draining.
func planVS(name types.NamespacedName, d *desiredVS, k *kernelView, draining map[vsKey]types.NamespacedName) ([]op, error) {
	var ops []op
	have, exists := k.services[d.key]
	if !exists {
		ops = append(ops, op{kind: opAddVS, vs: d.key, params: d.params, owner: name})
		for _, rs := range d.realServers {
			ops = append(ops, op{kind: opAddRS, vs: d.key, rs: rs, weight: 1, owner: name})
		}
		return ops, nil
	}
	dests, read := k.dests[d.key]
	if !read {
		// The backend reads the real servers of every virtual server it plans; without them
		// the plan could neither remove nor drain any.
		return nil, fmt.Errorf("internal error: real servers of %s were not read", d.key)
	}
	if have != d.params {
		ops = append(ops, op{kind: opUpdateVS, vs: d.key, params: d.params, owner: name})
	}
	byAddr := make(map[netip.AddrPort]realServer, len(dests))
	for _, rs := range dests {
		byAddr[rs.Addr] = rs
	}
	wanted := make(map[netip.AddrPort]bool, len(d.realServers))
	for _, rs := range d.realServers {
		wanted[rs] = true
		cur, ok := byAddr[rs]
		switch {
		case !ok:
			ops = append(ops, op{kind: opAddRS, vs: d.key, rs: rs, weight: 1, owner: name})
		case cur.Weight != 1:
			// Draining, or set by someone else: back in rotation, its connections untouched.
			ops = append(ops, op{kind: opUpdateRS, vs: d.key, rs: rs, weight: 1, owner: name})
		}
	}
	for _, rs := range dests {
		if wanted[rs.Addr] {
			continue
		}
		switch {
		case d.udpLike || rs.connections() == 0:
			// UDP and SCTP have no end of connection to wait for (their conntrack entries are
			// the conntrack reconciler's); TCP without connections has nothing to drain.
			ops = append(ops, op{kind: opDeleteRS, vs: d.key, rs: rs.Addr, owner: name})
		case rs.Weight != 0:
			ops = append(ops, op{kind: opUpdateRS, vs: d.key, rs: rs.Addr, weight: 0, owner: name})
			draining[d.key] = name
		default:
			draining[d.key] = name
		}
	}
	return ops, nil
}

func sortedNames(s sets.Set[types.NamespacedName]) []types.NamespacedName {
	out := s.UnsortedList()
	slices.SortFunc(out, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return out
}

func setNeedsRecreate(setup []op, id ipsetID) bool {
	for _, o := range setup {
		if o.kind == opRecreateSet && o.set == id {
			return true
		}
	}
	return false
}

func excluded(a netip.Addr, cidrs []netip.Prefix) bool {
	for _, c := range cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

func compareEntries(a, b setEntry) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	if a.Proto != b.Proto {
		return int(a.Proto) - int(b.Proto)
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	if c := a.IP2.Compare(b.IP2); c != 0 {
		return c
	}
	return strings.Compare(a.Net.String(), b.Net.String())
}

func sortedEntries[V any](m map[setEntry]V) []setEntry {
	out := make([]setEntry, 0, len(m))
	for e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, compareEntries)
	return out
}

func sortedEntrySet(m map[setEntry]bool) []setEntry { return sortedEntries(m) }

func compareOutFilter(a, b outFilterRule) int {
	return compareVSKeys(vsKey{Proto: a.proto, Addr: a.addr, Port: a.port}, vsKey{Proto: b.proto, Addr: b.addr, Port: b.port})
}
