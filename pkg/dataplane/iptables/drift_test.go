package iptables

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// driftCounts reads sluice_drift_repairs_total of the iptables mode, IPv4, by kind.
func driftCounts() map[string]float64 {
	return dataplane.DriftRepairs(dataplane.ModeIPTables, model.IPv4)
}

func driftDelta(before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range driftCounts() {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// TestDriftRepairsAreCounted: full syncs over the rules as sluice wrote them count
// nothing; a rule deleted inside a chain (seen by the legacy flavour's iptables-save), a
// deleted chain and a missing jump are counted when the next full sync repairs them.
func TestDriftRepairsAreCounted(t *testing.T) {
	cfg := testConfig(model.IPv4)
	w := featureWorld()
	b, k, _ := newTestBackend(t, cfg, FlavourLegacy)
	mustApply(t, b, w.state(model.IPv4), full())
	before := driftCounts()
	w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.2.9:80").Build())
	mustApply(t, b, w.state(model.IPv4), changed("ns1/svc1"))
	mustApply(t, b, w.state(model.IPv4), full())
	if d := driftDelta(before); len(d) != 0 {
		t.Fatalf("syncs of sluice's own changes counted repairs: %v", d)
	}

	k.mu.Lock()
	var sep string
	for name, c := range k.tables[tableNAT].chains {
		if strings.HasPrefix(name, "KUBE-SEP-") && len(c.rules) > 1 {
			sep = name
			c.rules = c.rules[1:] // a rule deleted inside a chain
			break
		}
	}
	delete(k.tables[tableNAT].chains, chainMarkMasq) // a chain deleted (and with it its rule)
	pre := k.tables[tableNAT].chains["PREROUTING"]
	pre.rules = pre.rules[:0] // the jump to KUBE-SERVICES
	k.mu.Unlock()
	if sep == "" {
		t.Fatal("no KUBE-SEP chain with two rules; the test is broken")
	}
	mustApply(t, b, w.state(model.IPv4), full())
	got := driftDelta(before)
	if got["chain"] != 1 || got["rule"] < 2 {
		t.Errorf("repairs counted %v, want chain 1 and rule 2 or more (the rule in %s, the PREROUTING jump)", got, sep)
	}
	if want := fromScratch(t, cfg, FlavourLegacy, w.state(model.IPv4)); !maps.EqualFunc(want, ruleSet(k), slices.Equal) {
		t.Errorf("not repaired:\n%s", diffRuleSets(want, ruleSet(k)))
	}
}
