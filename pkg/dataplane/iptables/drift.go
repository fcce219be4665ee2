package iptables

import (
	"fmt"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// What a full sync can truthfully count as drift in iptables mode (see README "Drift"):
// the chains sluice last wrote that the kernel no longer has (a flush, a chain deleted by
// hand), the jump rules from the built-in chains it has to insert again, and, where the
// full sync reads iptables-save anyway (the legacy flavour), each of its chains holding
// another number of rules than it wrote. iptables-save prints rules in its own canonical
// form, not the one sluice writes, so counts are compared, not texts. The nft flavour
// lists chain names only (its iptables-nft-save is too slow at scale to run for this), so
// there only chains and jumps are counted.

// driftOf records in d how kv differs from what the backend last wrote, given the static
// rules it is about to write (compared only when they are the ones it wrote last).
func (b *Backend) driftOf(kv *kernelView, static *staticRules, d *dataplane.Drift) {
	chains := map[string][]string{
		tableNAT:    append(append([]string(nil), natTopChains...), chainCanary),
		tableFilter: append(append([]string(nil), filterTopChains...), chainCanary),
	}
	for _, a := range b.applied {
		chains[tableNAT] = append(chains[tableNAT], a.chainNames()...)
	}
	for _, table := range []string{tableNAT, tableFilter} {
		for _, c := range chains[table] {
			if !kv.chains[table][c] {
				d.Add("chain", table+" "+c+" deleted")
			}
		}
	}
	if kv.rules == nil || static.fingerprint() != b.static {
		return
	}
	for table, counts := range b.writtenRuleCounts(static) {
		for chain, want := range counts {
			if got := kv.rules[table][chain]; kv.chains[table][chain] && got != want {
				d.Add("rule", fmt.Sprintf("%s %s holds %d rules, sluice wrote %d", table, chain, got, want))
			}
		}
	}
}

// writtenRuleCounts counts, per table and chain, the rules the backend wrote: the static
// ones and every Service's.
func (b *Backend) writtenRuleCounts(static *staticRules) map[string]map[string]int {
	out := map[string]map[string]int{tableNAT: {}, tableFilter: {}}
	count := func(table string, lines []string) {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 1 {
				out[table][f[1]]++
			}
		}
	}
	count(tableNAT, static.natHead)
	count(tableNAT, static.natTail)
	count(tableFilter, static.filter)
	for _, a := range b.applied {
		for _, t := range dedupTop(a.natTop) {
			out[tableNAT][t.chain]++
		}
		for _, t := range dedupTop(a.filterTop) {
			out[tableFilter][t.chain]++
		}
		for _, c := range a.natChains {
			out[tableNAT][c.name] += c.rules
		}
	}
	return out
}
