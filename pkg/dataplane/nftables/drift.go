package nftables

import (
	"fmt"
	"net/netip"
	"slices"

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
			want = slotContents(want[:0], slots[name])
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
func slotContents(buf intervalElems, slots []*slotRecord) intervalElems {
	for _, sl := range slots {
		for j, ep := range sl.eps {
			lo, hi := blockRange(sl.base, j, len(sl.eps))
			buf = append(buf, intervalStart(lo, ep.AddrPort()), intervalElem{v: hi, end: true})
		}
	}
	slices.SortFunc(buf, compareIntervalElems)
	return buf
}

// intervalStart is the start element of a range at v holding endpoint ap, as the kernel
// stores it (address . port, each padded to 4 bytes).
func intervalStart(v uint32, ap netip.AddrPort) intervalElem {
	e := intervalElem{v: v}
	a := ap.Addr().Unmap()
	n := copy(e.data[:], a.AsSlice())
	e.data[n], e.data[n+1] = byte(ap.Port()>>8), byte(ap.Port())
	e.dlen = uint8(n + 4)
	return e
}

// diffIntervals adds the elements of an endpoint map that differ between want and got
// (both sorted by compareIntervalElems).
func diffIntervals(d *dataplane.Drift, set string, want, got intervalElems) {
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		var c int
		switch {
		case i == len(want):
			c = 1
		case j == len(got):
			c = -1
		default:
			c = compareIntervalElems(want[i], got[j])
		}
		switch {
		case c < 0:
			d.Add("element", fmt.Sprintf("%x of %s deleted", want[i].key(), set))
			i++
		case c > 0:
			d.Add("element", fmt.Sprintf("%x of %s added", got[j].key(), set))
			j++
		default:
			if want[i].value() != got[j].value() {
				d.Add("element", fmt.Sprintf("%x of %s changed", want[i].key(), set))
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
