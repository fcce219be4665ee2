//go:build kernel

package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestFullReadComparesChainsAsItReads: a full resync parses the chains whose rules it does
// not know (the first after sluice's own writes), and after that only compares rule
// handles; a rule put by hand in a known chain, before its rules or after them, is found
// (one rule repair each) and removed, and traffic follows.
func TestFullReadComparesChainsAsItReads(t *testing.T) {
	tp, b, ns := trafficSetup(t, model.IPv4)
	sp := svc("t", "web", "http", model.TCP, "172.30.0.50", 80).Endpoints("10.180.0.1:80").Build()
	ns.SetService(sp.Name.NamespacedName, []*model.ServicePort{sp}, nil)
	mustApply(t, b, ns, changed("t/web"))
	web := ap("172.30.0.50", 80)
	if msg := tp.reaches(web, "pod-a")(); msg != "" {
		t.Fatalf("t/web: %s", msg)
	}

	mustApply(t, b, ns, model.Changes{Full: true})
	if st := b.LastStats().Read; st.parsedChains == 0 || st.chains == 0 {
		t.Fatalf("the first full resync after sluice's writes parsed %d of %d chains, want all", st.parsedChains, st.chains)
	}
	mustApply(t, b, ns, model.Changes{Full: true})
	if st := b.LastStats().Read; st.parsedChains != 0 || st.rules == 0 {
		t.Fatalf("a full resync of the table as last read parsed %d chains (of %d rules), want none", st.parsedChains, st.rules)
	}

	chain := chainNamesFor(sp.Name).cluster
	for _, tc := range []struct {
		name string
		nft  []string
	}{
		{"a drop before the chain's rules", []string{"insert", "rule", "ip", kubeProxyTable, chain, "drop"}},
		{"a counter after them", []string{"add", "rule", "ip", kubeProxyTable, chain, "counter"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := driftCount("rule")
			nft(t, tc.nft...)
			if tc.nft[0] == "insert" {
				if _, err := tp.tcp(tp.client, netip.Addr{}, web, slow); err == nil {
					t.Fatal("t/web answers through a drop rule; the test is broken")
				}
			}
			mustApply(t, b, ns, model.Changes{Full: true})
			if st := b.LastStats().Read; st.parsedChains != 1 {
				t.Errorf("the full resync parsed %d chains, want the changed one", st.parsedChains)
			}
			if d := driftCount("rule") - before; d != 1 {
				t.Errorf("sluice_drift_repairs_total{kind=rule} grew by %v, want 1", d)
			}
			if out := nft(t, "list", "chain", "ip", kubeProxyTable, chain); strings.Contains(out, "drop") || strings.Contains(out, "counter") {
				t.Errorf("the rule put by hand is still there:\n%s", out)
			}
			if msg := tp.reaches(web, "pod-a")(); msg != "" {
				t.Errorf("t/web after the repair: %s", msg)
			}
		})
	}
}
