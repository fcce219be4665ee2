//go:build kernel

package nftables

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// BenchmarkCommitCost measures what the kernel charges, at commit, for each kind of
// change to a table of N Services x 10 endpoints: which changes make nf_tables validate
// the whole table (walk every chain reachable from the base chains, and every jump in
// their verdict maps) and which do not. Each iteration is one transaction, alternately
// adding and removing the same object. This is why endpoints live in data map elements
// and no endpoint change adds a rule or a jump/goto element (README, "Endpoint
// selection"); the data-element case is also the floor of any transaction: every commit
// walks the list of all the table's chains (nf_tables_commit, "make rules_gen_X visible")
// once. SLUICE_BENCH_SIZES=100,1000 picks the sizes (default 100,10000).
func BenchmarkCommitCost(b *testing.B) {
	f := ipv4
	for _, n := range commitCostSizes(100, 10000) {
		resetTable(b)
		be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
		ns := scaleState(model.IPv4, n, 10)
		mustApply(b, be, ns, model.Changes{Full: true})
		svcChain := chainNamesFor(ns.PortsOf(ns.ServiceNames().UnsortedList()[0])[0].Name).cluster
		send := func(b *testing.B, ops ...op) {
			enc := newEncoder(f)
			for i := range ops {
				enc.encodeOp(&ops[i], 0)
			}
			errs, err := be.c.sendBatch(enc.b.buf, enc.count)
			if err != nil || len(errs) > 0 {
				b.Fatalf("batch: %v %v", err, errs)
			}
		}
		key := keyAddrProtoPort(f, testNodeIP, 6, 1)
		cases := []struct {
			name     string
			add, del []op
		}{
			{"data-element", []op{{kind: opAddElements, name: "endpoints-00", elems: []elemDef{{set: "endpoints-00", key: "\x40\x00\x00\x00", value: endpointValue(f, ap("10.1.1.1", 80))}}}},
				[]op{{kind: opDeleteElements, name: "endpoints-00", elems: []elemDef{{set: "endpoints-00", key: "\x40\x00\x00\x00"}}}}},
			{"drop-element", []op{{kind: opAddElements, name: noEndpointServicesMap, elems: []elemDef{{set: noEndpointServicesMap, key: key, value: "drop"}}}},
				[]op{{kind: opDeleteElements, name: noEndpointServicesMap, elems: []elemDef{{set: noEndpointServicesMap, key: key}}}}},
			{"goto-reject-element", []op{{kind: opAddElements, name: noEndpointServicesMap, elems: []elemDef{{set: noEndpointServicesMap, key: key, value: "goto " + rejectChain}}}},
				[]op{{kind: opDeleteElements, name: noEndpointServicesMap, elems: []elemDef{{set: noEndpointServicesMap, key: key}}}}},
			{"goto-service-element", []op{{kind: opAddElements, name: serviceIPsMap, elems: []elemDef{{set: serviceIPsMap, key: key, value: "goto " + svcChain}}}},
				[]op{{kind: opDeleteElements, name: serviceIPsMap, elems: []elemDef{{set: serviceIPsMap, key: key}}}}},
			{"nat-rule-unreferenced-chain", []op{{kind: opAddChain, name: "probe"}, {kind: opAddRule, name: "probe", rule: compileRule(f, rule{terms: []term{l4proto{6}, dnatTo{ap("10.1.1.1", 80)}}})}},
				[]op{{kind: opFlushChain, name: "probe"}, {kind: opDeleteChain, name: "probe"}}},
			{"cmp-rule-unreferenced-chain", []op{{kind: opAddChain, name: "probe"}, {kind: opAddRule, name: "probe", rule: compileRule(f, rule{terms: []term{l4proto{6}}})}},
				[]op{{kind: opFlushChain, name: "probe"}, {kind: opDeleteChain, name: "probe"}}},
			{"empty-chain", []op{{kind: opAddChain, name: "probe"}}, []op{{kind: opDeleteChain, name: "probe"}}},
			{"nat-rule-service-chain", []op{{kind: opAddRule, name: svcChain, rule: compileRule(f, rule{terms: []term{l4proto{17}, dnatTo{ap("10.1.1.1", 80)}}})}},
				nil},
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("services=%d/%s", n, c.name), func(b *testing.B) {
				i := 0
				u0, s0 := cpuTimes()
				for b.Loop() {
					if c.del == nil {
						send(b, c.add...)
						continue
					}
					if i%2 == 0 {
						send(b, c.add...)
					} else {
						send(b, c.del...)
					}
					i++
				}
				if c.del != nil && i%2 == 1 {
					send(b, c.del...)
				}
				u1, s1 := cpuTimes()
				b.ReportMetric(float64((u1-u0).Microseconds())/float64(b.N), "user-µs/op")
				b.ReportMetric(float64((s1-s0).Microseconds())/float64(b.N), "sys-µs/op")
			})
		}
	}
}

// commitCostSizes returns the sizes in SLUICE_BENCH_SIZES ("100,1000"), or def.
func commitCostSizes(def ...int) []int {
	if v := os.Getenv("SLUICE_BENCH_SIZES"); v != "" {
		var out []int
		for _, f := range strings.Split(v, ",") {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	return def
}
