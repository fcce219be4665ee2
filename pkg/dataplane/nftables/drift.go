package nftables

import (
	"fmt"
	"net/netip"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// driftOf compares the model of what the backend last wrote (prev) with what a full read
// found (read): chains deleted or added, chains whose rules changed, sets deleted or
// added, and elements missing, changed or added in the sets whose content the backend
// owns. The endpoint maps are compared with the Services' slot records, which stand for
// their content between full reads. Sets whose content the datapath owns (affinity) are
// not compared.
func driftOf(prev, read *tableState) *dataplane.Drift {
	d := &dataplane.Drift{}
	for _, name := range sortedKeys(prev.chains) {
		rc, ok := read.chains[name]
		pc := prev.chains[name]
		switch {
		case !ok:
			d.Add("chain", name+" deleted")
		case !pc.fp.isZero() && !rc.fp.isZero() && pc.fp != rc.fp:
			d.Add("rule", "in chain "+name+" changed")
		}
	}
	for _, name := range sortedKeys(read.chains) {
		if _, ok := prev.chains[name]; !ok {
			d.Add("chain", name+" added")
		}
	}
	slots := slotsBySet(prev)
	var want intervalElems // one endpoint map's at a time, the array reused
	for _, name := range sortedKeys(prev.sets) {
		rs, ok := read.sets[name]
		if !ok {
			d.Add("set", name+" deleted")
			continue
		}
		if isEndpointMap(name) {
			want.reset()
			slotContents(&want, slots[name])
			diffIntervals(d, name, want, rs.intervals)
			continue
		}
		want := prev.sets[name].elems
		if want == nil {
			continue
		}
		diffElements(d, name, want, rs.elems)
	}
	for _, name := range sortedKeys(read.sets) {
		if _, ok := prev.sets[name]; !ok {
			d.Add("set", name+" added")
		}
	}
	return d
}

// slotsBySet groups the Services' slot records by endpoint map.
func slotsBySet(st *tableState) map[string][]*slotRecord {
	out := map[string][]*slotRecord{}
	for _, rec := range st.services {
		for i := range rec.slots {
			sl := &rec.slots[i]
			out[sl.set] = append(out[sl.set], sl)
		}
	}
	return out
}

// slotContents appends to buf what one endpoint map holds according to its slot records,
// in the form and order a full read gives them (fixed-size elements, not a map: they are
// two per endpoint). Drift builds one map's at a time: all of them together are as large
// as the read they are compared with, and would be held beside it.
func slotContents(buf *intervalElems, slots []*slotRecord) {
	var data [20]byte
	for _, sl := range slots {
		for j, ep := range sl.eps {
			lo, hi := blockRange(sl.base, j, len(sl.eps))
			buf.add(lo, false, intervalData(data[:0], ep.AddrPort()))
			buf.add(hi, true, nil)
		}
	}
	buf.sort()
}

// intervalData appends the data of a range's start holding endpoint ap to b, as the
// kernel stores it (address . port, each padded to 4 bytes).
func intervalData(b []byte, ap netip.AddrPort) []byte {
	b = append(b, ap.Addr().Unmap().AsSlice()...)
	return append(b, byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
}

// diffIntervals adds the elements of an endpoint map that differ between want and got
// (both sorted by compareIntervalElems).
func diffIntervals(d *dataplane.Drift, set string, want, got intervalElems) {
	i, j := 0, 0
	for i < len(want.elems) || j < len(got.elems) {
		var c int
		switch {
		case i == len(want.elems):
			c = 1
		case j == len(got.elems):
			c = -1
		default:
			c = compareIntervalElems(want.elems[i], got.elems[j])
		}
		switch {
		case c < 0:
			d.Add("element", fmt.Sprintf("%x of %s deleted", want.elems[i].key(), set))
			i++
		case c > 0:
			d.Add("element", fmt.Sprintf("%x of %s added", got.elems[j].key(), set))
			j++
		default:
			if want.value(i) != got.value(j) {
				d.Add("element", fmt.Sprintf("%x of %s changed", want.elems[i].key(), set))
			}
			i++
			j++
		}
	}
}

// diffElements adds the elements of set that differ between want and got.
func diffElements(d *dataplane.Drift, set string, want, got map[string]string) {
	for _, k := range sortedKeys(want) {
		switch v, ok := got[k]; {
		case !ok:
			d.Add("element", fmt.Sprintf("%x of %s deleted", k, set))
		case v != want[k]:
			d.Add("element", fmt.Sprintf("%x of %s changed", k, set))
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			d.Add("element", fmt.Sprintf("%x of %s added", k, set))
		}
	}
}
