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

// desiredIndex is every Service's record and their union over Services (who holds each
// frontend, which set entries and addresses are needed, and by how many), kept up to date
// incrementally: a partial sync costs what its Services touch, not what the node holds. It
// belongs to the Backend; makePlan updates it for the Services in scope.
type desiredIndex struct {
	records map[types.NamespacedName]*serviceRecord
	// owners says which Service holds each frontend (virtual server); ownedBy is its reverse.
	owners  map[vsKey]types.NamespacedName
	ownedBy map[types.NamespacedName]map[vsKey]bool
	// entries counts, per set entry, the Services that need it.
	entries map[setMember]int
	// bound counts, per address, the held frontends that bind it to the dummy device.
	bound map[netip.Addr]int
	// outFilter counts the Services needing each KUBE-IPVS-OUT-FILTER rule.
	outFilter map[outFilterRule]int
}

func newDesiredIndex() *desiredIndex {
	return &desiredIndex{
		records:   map[types.NamespacedName]*serviceRecord{},
		owners:    map[vsKey]types.NamespacedName{},
		ownedBy:   map[types.NamespacedName]map[vsKey]bool{},
		entries:   map[setMember]int{},
		bound:     map[netip.Addr]int{},
		outFilter: map[outFilterRule]int{},
	}
}

// own records that name holds key.
func (x *desiredIndex) own(key vsKey, name types.NamespacedName) {
	x.owners[key] = name
	if x.ownedBy[name] == nil {
		x.ownedBy[name] = map[vsKey]bool{}
	}
	x.ownedBy[name][key] = true
}

// outFilterRules returns the KUBE-IPVS-OUT-FILTER rules, sorted.
func (x *desiredIndex) outFilterRules() []outFilterRule {
	out := make([]outFilterRule, 0, len(x.outFilter))
	for f := range x.outFilter {
		out = append(out, f)
	}
	slices.SortFunc(out, compareOutFilter)
	return out
}

// planInput is what the planner reads.
type planInput struct {
	family model.IPFamily
	full   bool
	// records are the new records of the Services in scope; a Service in scope without one
	// has nothing left to program.
	records map[types.NamespacedName]*serviceRecord
	// scope are the Services to converge (every Service on a full sync).
	scope sets.Set[types.NamespacedName]
	// kernel is the kernel view. It holds the real servers of every virtual server that a
	// Service in scope wants and the kernel has.
	kernel *kernelView
	// exclude are ipvs.excludeCIDRs of this family: virtual servers there are never deleted.
	exclude []netip.Prefix
	// previousOwners are the holders of frontends before a full sync (which starts from an
	// empty index), so that a frontend two Services want stays with the one holding it.
	previousOwners map[vsKey]types.NamespacedName
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
	// draining are the virtual servers of Services in scope (with their owner) that still
	// hold a real server at weight 0 after this plan, waiting for its connections to end.
	draining map[vsKey]types.NamespacedName
}

// makePlan computes the operations that take the kernel to the desired state of the
// Services in scope, updating idx with their new records on the way. Its phases: the
// device and the sets; release what the Services in scope held; claim the frontends;
// each Service's virtual and real servers; addresses; set entries; leftover virtual
// servers.
func makePlan(in *planInput, idx *desiredIndex) *plan {
	pl := &planner{
		in:             in,
		idx:            idx,
		k:              in.kernel,
		p:              &plan{draining: map[vsKey]types.NamespacedName{}},
		names:          sortedNames(in.scope),
		recreated:      map[ipsetID]bool{},
		touchedEntries: map[setMember]bool{},
		touchedAddrs:   map[netip.Addr]bool{},
		released:       map[vsKey]types.NamespacedName{},
		addrClaimer:    map[netip.Addr]types.NamespacedName{},
		conflicts:      map[types.NamespacedName][]error{},
		deletedVS:      map[vsKey]bool{},
	}
	pl.planSetup()
	pl.release()
	pl.claimFrontends()
	pl.planServices()
	// Addresses leave the device last, after their set entries and virtual servers, so
	// that KUBE-IPVS-IPS always covers every address the device holds.
	unbinds := pl.planAddresses()
	pl.planEntries()
	pl.planLeftoverVSs()
	pl.p.deletes = append(pl.p.deletes, unbinds...)
	return pl.p
}

// planner is makePlan's working state.
type planner struct {
	in  *planInput
	idx *desiredIndex
	k   *kernelView
	p   *plan
	// names are the Services in scope, sorted.
	names []types.NamespacedName
	// recreated are the sets recreated (of the wrong type): every entry is added again.
	recreated map[ipsetID]bool
	// touchedEntries and touchedAddrs are what a partial sync looks at.
	touchedEntries map[setMember]bool
	touchedAddrs   map[netip.Addr]bool
	// released are the frontends the Services in scope held and no longer claim.
	released map[vsKey]types.NamespacedName
	// addrClaimer is the first Service that claimed each bound address.
	addrClaimer map[netip.Addr]types.NamespacedName
	// conflicts are the frontends a Service wants that another holds.
	conflicts map[types.NamespacedName][]error
	// deletedVS are the virtual servers the Services' operations delete.
	deletedVS map[vsKey]bool
}

// planSetup: the device, then the sets (only when absent, or of the wrong type).
func (pl *planner) planSetup() {
	k, p := pl.k, pl.p
	if !k.linkExists {
		p.setup = append(p.setup, op{kind: opCreateLink})
	}
	for id := ipsetID(0); id < numIPSets; id++ {
		ks, ok := k.sets[id]
		switch {
		case !ok:
			p.setup = append(p.setup, op{kind: opCreateSet, set: id})
		case ks.Type != ipsets[id].typ || (ks.Family != 0 && ks.Family != afOf(pl.in.family) && ipsets[id].typ != typeBitmapPort):
			p.setup = append(p.setup, op{kind: opRecreateSet, set: id})
			pl.recreated[id] = true
		}
	}
}

// release forgets what the Services in scope needed, lets go of their frontends, and
// stores their new records in the index.
func (pl *planner) release() {
	idx := pl.idx
	for _, name := range pl.names {
		old := idx.records[name]
		if old != nil {
			for _, m := range old.members {
				pl.touchedEntries[m] = true
				if idx.entries[m]--; idx.entries[m] <= 0 {
					delete(idx.entries, m)
				}
			}
			for _, f := range old.outFilter {
				if idx.outFilter[f]--; idx.outFilter[f] <= 0 {
					delete(idx.outFilter, f)
				}
			}
		}
		for key := range idx.ownedBy[name] {
			if d := old.vs(key); d != nil && d.bind {
				pl.touchedAddrs[key.Addr] = true
				if idx.bound[key.Addr]--; idx.bound[key.Addr] <= 0 {
					delete(idx.bound, key.Addr)
				}
			}
			delete(idx.owners, key)
			pl.released[key] = name
		}
		delete(idx.ownedBy, name)
		if r := pl.in.records[name]; r != nil {
			idx.records[name] = r
		} else {
			delete(idx.records, name)
		}
	}
}

// claim makes name the holder of d's frontend.
func (pl *planner) claim(name types.NamespacedName, d *desiredVS) {
	pl.idx.own(d.key, name)
	delete(pl.released, d.key)
	if d.bind {
		pl.idx.bound[d.key.Addr]++
		pl.touchedAddrs[d.key.Addr] = true
		if _, ok := pl.addrClaimer[d.key.Addr]; !ok {
			pl.addrClaimer[d.key.Addr] = name
		}
	}
}

// claimFrontends gives each frontend one holder. Previous holders claim first, so that a
// frontend two Services want stays where it is; the other Service fails for that
// frontend. The Services' set entries and filter rules are counted in.
func (pl *planner) claimFrontends() {
	idx := pl.idx
	for _, name := range pl.names {
		for i, d := range idx.records[name].vssOrNil() {
			if _, held := idx.owners[d.key]; !held && (pl.released[d.key] == name || pl.in.previousOwners[d.key] == name) {
				pl.claim(name, &idx.records[name].vss[i])
			}
		}
	}
	for _, name := range pl.names {
		r := idx.records[name]
		for i, d := range r.vssOrNil() {
			switch holder, held := idx.owners[d.key]; {
			case !held:
				pl.claim(name, &r.vss[i])
			case holder != name:
				pl.conflicts[name] = append(pl.conflicts[name], fmt.Errorf("%s (port %s) is already used by Service %s", d.key, d.port, holder.String()))
			}
		}
		if r == nil {
			continue
		}
		for _, m := range r.members {
			pl.touchedEntries[m] = true
			idx.entries[m]++
		}
		for _, f := range r.outFilter {
			idx.outFilter[f]++
		}
	}
}

// planServices: per Service, its virtual servers, real servers, and the frontends it
// gave up.
func (pl *planner) planServices() {
	idx, k := pl.idx, pl.k
	releasedBy := map[types.NamespacedName][]vsKey{}
	for key, owner := range pl.released {
		releasedBy[owner] = append(releasedBy[owner], key)
	}
	for _, name := range pl.names {
		so := serviceOps{name: name, errs: pl.conflicts[name]}
		r := idx.records[name]
		for i := range r.vssOrNil() {
			d := &r.vss[i]
			if idx.owners[d.key] != name {
				continue
			}
			ops, err := planVS(name, d, k, pl.p.draining)
			if err != nil {
				so.errs = append(so.errs, err)
				continue
			}
			so.ops = append(so.ops, ops...)
		}
		gone := releasedBy[name]
		slices.SortFunc(gone, compareVSKeys)
		for _, key := range gone {
			if _, ok := k.services[key]; ok && !excluded(key.Addr, pl.in.exclude) {
				so.ops = append(so.ops, op{kind: opDeleteVS, vs: key, owner: name})
				pl.deletedVS[key] = true
			}
		}
		if len(so.ops) > 0 || len(so.errs) > 0 {
			pl.p.services = append(pl.p.services, so)
		}
	}
}

// planAddresses converges the addresses on the dummy device and KUBE-IPVS-IPS, which
// lists them. It returns the unbinds, which the caller runs last.
func (pl *planner) planAddresses() (unbinds []op) {
	idx, k, p := pl.idx, pl.k, pl.p
	addrs := pl.touchedAddrs
	if pl.in.full {
		addrs = map[netip.Addr]bool{}
		for a := range idx.bound {
			addrs[a] = true
		}
		for a := range k.bound {
			addrs[a] = true
		}
		if ks := k.sets[setIPVSIPs]; ks != nil {
			for e := range ks.Entries {
				addrs[e.IP] = true
			}
		}
	}
	ipvsIPs := k.sets[setIPVSIPs]
	for _, a := range sortedAddrs(addrs) {
		want := idx.bound[a] > 0
		owner := pl.addrClaimer[a]
		if want && !k.bound[a] {
			p.adds = append(p.adds, op{kind: opBindAddr, addr: a, owner: owner})
		}
		if !want && k.bound[a] {
			unbinds = append(unbinds, op{kind: opUnbindAddr, addr: a})
		}
		e := setEntry{IP: a}
		have := ipvsIPs != nil && !pl.recreated[setIPVSIPs] && ipvsIPs.Entries[e]
		if want && !have {
			p.adds = append(p.adds, op{kind: opAddEntry, set: setIPVSIPs, entry: e, owner: owner})
		}
		if !want && have {
			p.deletes = append(p.deletes, op{kind: opDelEntry, set: setIPVSIPs, entry: e})
		}
	}
	return unbinds
}

// planEntries converges the set entries other than KUBE-IPVS-IPS.
func (pl *planner) planEntries() {
	idx, k, p := pl.idx, pl.k, pl.p
	entries := pl.touchedEntries
	if pl.in.full {
		entries = make(map[setMember]bool, len(idx.entries))
		for m := range idx.entries {
			entries[m] = true
		}
		for id, ks := range k.sets {
			if id == setIPVSIPs {
				continue
			}
			for e := range ks.Entries {
				entries[setMember{set: id, entry: e}] = true
			}
		}
	}
	entryOwner := map[setMember]types.NamespacedName{}
	for _, name := range pl.names {
		for _, m := range idx.records[name].membersOrNil() {
			if _, ok := entryOwner[m]; !ok {
				entryOwner[m] = name
			}
		}
	}
	for _, m := range sortedMembers(entries) {
		want := idx.entries[m] > 0
		ks := k.sets[m.set]
		have := ks != nil && !pl.recreated[m.set] && ks.Entries[m.entry]
		switch {
		case want && !have:
			p.adds = append(p.adds, op{kind: opAddEntry, set: m.set, entry: m.entry, owner: entryOwner[m]})
		case !want && have:
			p.deletes = append(p.deletes, op{kind: opDelEntry, set: m.set, entry: m.entry})
		}
	}
}

// planLeftoverVSs (full syncs): every virtual server of this family that no Service
// holds, outside excludeCIDRs, is deleted.
func (pl *planner) planLeftoverVSs() {
	if !pl.in.full {
		return
	}
	var leftovers []vsKey
	for key := range pl.k.services {
		if _, held := pl.idx.owners[key]; !held && !pl.deletedVS[key] && !excluded(key.Addr, pl.in.exclude) {
			leftovers = append(leftovers, key)
		}
	}
	slices.SortFunc(leftovers, compareVSKeys)
	for _, key := range leftovers {
		pl.p.deletes = append(pl.p.deletes, op{kind: opDeleteVS, vs: key})
	}
}

func (r *serviceRecord) membersOrNil() []setMember {
	if r == nil {
		return nil
	}
	return r.members
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

// sortedMembers returns the members in set order, then entry order.
func sortedMembers(m map[setMember]bool) []setMember {
	out := make([]setMember, 0, len(m))
	for e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b setMember) int {
		if a.set != b.set {
			return int(a.set) - int(b.set)
		}
		return compareEntries(a.entry, b.entry)
	})
	return out
}

func compareOutFilter(a, b outFilterRule) int {
	return compareVSKeys(vsKey{Proto: a.proto, Addr: a.addr, Port: a.port}, vsKey{Proto: b.proto, Addr: b.addr, Port: b.port})
}
