package ipvs

import (
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	fixture.Golden(t, name, got, *update)
}

func TestRulesetGolden(t *testing.T) {
	clusterCIDR := dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{fixture.ClusterCIDRv4}}
	rs := renderRules(ruleConfig{family: model.IPv4, markBit: 14, detector: clusterCIDR},
		[]outFilterRule{{addr: addr("5.6.7.7"), proto: model.TCP, port: 443}})
	golden(t, "rules-ipv4.golden", string(restoreInput(rs, nil)))

	rs = renderRules(ruleConfig{family: model.IPv6, markBit: 12,
		detector: dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}}, nil)
	golden(t, "rules-ipv6.golden", string(restoreInput(rs, nil)))
}

func TestRulesFollowTheLocalDetectorAndMasqueradeAll(t *testing.T) {
	tests := []struct {
		name string
		cfg  ruleConfig
		// want are rules that must be there, absent rules that must not.
		want, absent []string
	}{{
		name: "cluster CIDR masquerades ClusterIP traffic from outside it",
		cfg:  ruleConfig{family: model.IPv4, markBit: 14, detector: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{fixture.ClusterCIDRv4}}},
		want: []string{`-m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-m set --match-set KUBE-SLUICE-NO-LOCAL-EPS dst,dst -s 10.0.0.0/8 -j RETURN`},
	}, {
		name: "bridge interface",
		cfg:  ruleConfig{family: model.IPv4, markBit: 14, detector: dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}},
		want: []string{`dst,dst ! -i cbr0 -j KUBE-MARK-MASQ`, `dst,dst -i cbr0 -j RETURN`},
	}, {
		name: "masqueradeAll masquerades every ClusterIP packet",
		cfg: ruleConfig{family: model.IPv4, markBit: 14, masqueradeAll: true,
			detector: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{fixture.ClusterCIDRv4}}},
		want:   []string{`-m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`},
		absent: []string{`! -s 10.0.0.0/8`},
	}, {
		name: "without a detector, masquerade traffic the node sends from a Service address",
		cfg:  ruleConfig{family: model.IPv4, markBit: 0},
		want: []string{`-m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ`, `MARK --or-mark 0x00000001`,
			`-m set --match-set KUBE-SLUICE-NO-LOCAL-EPS dst,dst -m addrtype ! --src-type LOCAL -j DROP`},
		absent: []string{`KUBE-SLUICE-NO-LOCAL-EPS dst,dst -s`, `-j RETURN -s`},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			all := strings.Join(append(renderRules(tc.cfg, nil).nat, renderRules(tc.cfg, nil).filter...), "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("missing %q in:\n%s", w, all)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(all, a) {
					t.Errorf("unexpected %q in:\n%s", a, all)
				}
			}
		})
	}
}

func TestPlanFixesKeepsOwnJumpsAndRemovesTheRest(t *testing.T) {
	saved, err := xtables.ParseSave([]byte(`*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
:CNI-HOSTPORT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j CNI-HOSTPORT
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SVC-ABC
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -j KUBE-FIREWALL
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	fixes := planFixes(saved)
	if diff := cmp.Diff([]string{"KUBE-SVC-ABC"}, fixes[tableNAT].removeChains); diff != "" {
		t.Errorf("nat chains removed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SVC-ABC`,
	}, fixes[tableNAT].deleteRules); diff != "" {
		t.Errorf("nat rules deleted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
	}, fixes[tableNAT].insertJumps); diff != "" {
		t.Errorf("nat jumps inserted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"KUBE-NODEPORTS"}, fixes[tableFilter].removeChains); diff != "" {
		t.Errorf("filter chains removed (-want +got):\n%s", diff)
	}
	if len(fixes[tableFilter].insertJumps) != 6 {
		t.Errorf("filter jumps inserted: %v", fixes[tableFilter].insertJumps)
	}
}

func TestRuleLinesRoundTripThroughSaveQuoting(t *testing.T) {
	want := []string{"-A", "KUBE-X", "-m", "comment", "--comment", `a "quoted" comment`, "-s", "10.0.0.0/8", "-j", "RETURN"}
	if l := line("KUBE-X", want[2:]); !slices.Equal(xtables.SplitArgs(l), want) {
		t.Errorf("line does not round-trip: %s", l)
	}
}

// The chains this backend writes are the ipvs mode's by xtables' ownership rule, which
// leftover removal and Cleanup go by.
func TestOwnChainsAreTheIPVSModes(t *testing.T) {
	for table, chains := range ownChains {
		for _, c := range chains {
			if !xtables.IPVSModeChain(table, c) {
				t.Errorf("%s %s is not the ipvs mode's", table, c)
			}
		}
	}
}

func TestIPSetNamesPerFamily(t *testing.T) {
	for id := ipsetID(0); id < numIPSets; id++ {
		v4, v6 := ipsetName(id, model.IPv4), ipsetName(id, model.IPv6)
		if v4 == v6 || len(v6) > maxIPSetNameLength || !strings.HasPrefix(v6, "KUBE-6-") {
			t.Errorf("set %s: IPv6 name %q", v4, v6)
		}
	}
	if got := ipsetName(setNodePortLocalSCTP, model.IPv6); got != "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS" {
		t.Errorf("IPv6 name of KUBE-NODE-PORT-LOCAL-SCTP-HASH = %q, want upstream's truncation", got)
	}
}

func TestConnReuseModeThresholds(t *testing.T) {
	if connReuseMode(hostnet.KernelVersion{Major: 5, Minor: 8, Patch: 18}) != 0 || connReuseMode(hostnet.KernelVersion{Major: 5, Minor: 9, Patch: 0}) != 1 || connReuseMode(hostnet.KernelVersion{Major: 3, Minor: 10, Patch: 0}) != -1 {
		t.Errorf("connReuseMode thresholds wrong")
	}
}
