package nftables

import (
	"fmt"

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
	slots := slotContents(prev)
	for _, name := range sortedKeys(prev.sets) {
		rs, ok := read.sets[name]
		if !ok {
			d.Add("set", name+" deleted")
			continue
		}
		want := prev.sets[name].elems
		if isEndpointMap(name) {
			want = slots[name]
		} else if want == nil {
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

// slotContents is what the endpoint maps hold according to the Services' slot records.
func slotContents(st *tableState) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, rec := range st.services {
		for _, sl := range rec.slots {
			m := out[sl.set]
			if m == nil {
				m = map[string]string{}
				out[sl.set] = m
			}
			for j, v := range sl.values {
				m[slotKey(sl.base+uint32(j))] = v
			}
		}
	}
	return out
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
