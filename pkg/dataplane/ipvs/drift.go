package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
)

// driftOf compares what the backend programmed (its index, trusted after a sync that did
// not fail as a whole) with a fresh read of the kernel, v: the dummy device, the virtual
// servers Services hold and their real servers, virtual servers nobody holds, addresses
// and ipsets. Real servers at weight 0 that nobody wants are draining, not drift.
// hadLink says whether the device existed before.
func (b *Backend) driftOf(v *kernelView, hadLink bool) *dataplane.Drift {
	d := &dataplane.Drift{}
	x := b.idx
	if hadLink && !v.linkExists {
		d.Add("interface", dummyDevice+" deleted")
	}
	keys := make([]vsKey, 0, len(x.owners))
	for k := range x.owners {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareVSKeys)
	for _, key := range keys {
		owner := x.owners[key]
		want := x.records[owner].vs(key)
		if want == nil {
			continue
		}
		params, ok := v.services[key]
		if !ok {
			d.Add("virtual_server", fmt.Sprintf("%s of %s deleted", key, owner))
			continue
		}
		if params != want.params {
			d.Add("virtual_server", fmt.Sprintf("%s of %s changed (%s, want %s)", key, owner, params, want.params))
		}
		have := map[netip.AddrPort]realServer{}
		for _, rs := range v.dests[key] {
			have[rs.Addr] = rs
		}
		for _, rs := range want.realServers {
			switch h, ok := have[rs]; {
			case !ok:
				d.Add("real_server", fmt.Sprintf("%s of %s deleted", rs, key))
			case h.Weight != 1:
				d.Add("real_server", fmt.Sprintf("%s of %s has weight %d", rs, key, h.Weight))
			}
		}
		for _, rs := range v.dests[key] {
			if rs.Weight > 0 && !slices.Contains(want.realServers, rs.Addr) {
				d.Add("real_server", fmt.Sprintf("%s of %s added", rs.Addr, key))
			}
		}
	}
	var extra []vsKey
	for key := range v.services {
		if _, held := x.owners[key]; !held && !excluded(key.Addr, b.settings.ExcludeCIDRs) {
			extra = append(extra, key)
		}
	}
	slices.SortFunc(extra, compareVSKeys)
	for _, key := range extra {
		d.Add("virtual_server", key.String()+" added")
	}
	for _, a := range sortedAddrs(x.boundSet()) {
		if !v.bound[a] {
			d.Add("address", a.String()+" deleted from "+dummyDevice)
		}
	}
	for _, a := range sortedAddrs(v.bound) {
		if x.bound[a] <= 0 {
			d.Add("address", a.String()+" added to "+dummyDevice)
		}
	}
	for id := ipsetID(0); id < numIPSets; id++ {
		ks := v.sets[id]
		if ks == nil {
			d.Add("set", ipsets[id].name+" deleted")
			continue
		}
		want := map[setEntry]bool{}
		if id == setIPVSIPs {
			for a, n := range x.bound {
				if n > 0 {
					want[setEntry{IP: a}] = true
				}
			}
		}
		for m, n := range x.entries {
			if m.set == id && n > 0 {
				want[m.entry] = true
			}
		}
		for _, m := range sortedMembers(setMembers(id, want)) {
			if !ks.Entries[m.entry] {
				d.Add("element", fmt.Sprintf("%s of %s deleted", m.entry, ipsets[id].name))
			}
		}
		for _, m := range sortedMembers(setMembers(id, ks.Entries)) {
			if !want[m.entry] {
				d.Add("element", fmt.Sprintf("%s of %s added", m.entry, ipsets[id].name))
			}
		}
	}
	return d
}

func setMembers(id ipsetID, entries map[setEntry]bool) map[setMember]bool {
	out := make(map[setMember]bool, len(entries))
	for e := range entries {
		out[setMember{set: id, entry: e}] = true
	}
	return out
}

func (x *desiredIndex) boundSet() map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(x.bound))
	for a, n := range x.bound {
		if n > 0 {
			out[a] = true
		}
	}
	return out
}

// ruleDrift compares the rules of the backend's own chains in saved (iptables-save, read
// by a full sync) with the rule counts it last wrote, and counts the jump rules the full
// sync must insert or delete.
func ruleDrift(d *dataplane.Drift, saved xtables.Saved, written map[string]int, fixes map[string]*tableFixes) {
	for _, table := range []string{tableNAT, tableFilter} {
		got := map[string]int{}
		if st := saved[table]; st != nil {
			for _, r := range st.Rules {
				got[r.Chain]++
			}
		}
		for _, c := range ownChains[table] {
			if n, w := got[c], written[table+" "+c]; n != w {
				d.Add("rule", fmt.Sprintf("%s %s holds %d rules, sluice wrote %d", table, c, n, w))
			}
		}
	}
	for _, table := range []string{tableNAT, tableFilter, tableMangle} {
		f := fixes[table]
		if f == nil {
			continue
		}
		for _, l := range f.insertJumps {
			d.Add("rule", table+" "+strings.Replace(l, "-I ", "missing: ", 1))
		}
		for _, l := range f.deleteRules {
			d.Add("rule", table+" "+strings.Replace(l, "-D ", "added: ", 1))
		}
		for _, c := range f.removeChains {
			d.Add("rule", table+" chain "+c+" added")
		}
	}
}

// ruleCounts counts the rules of rs per "table chain".
func ruleCounts(rs *ruleset) map[string]int {
	out := map[string]int{}
	for table, lines := range map[string][]string{tableNAT: rs.nat, tableFilter: rs.filter} {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" {
				out[table+" "+f[1]]++
			}
		}
	}
	return out
}
