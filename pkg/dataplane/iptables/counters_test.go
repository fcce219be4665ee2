package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestParseSavedCounter(t *testing.T) {
	saved := []struct {
		line  string
		chain string
		want  ruleCount
		ok    bool
	}{
		{`[7:420] -A SLUICE-NEWE-X -m comment --comment "ns/web:http traffic counter"`, "SLUICE-NEWE-X", ruleCount{7, 420}, true},
		{`[18446744073709551615:1] -A SLUICE-PKTC-X -m comment --comment "ns/web:http traffic counter"`, "SLUICE-PKTC-X", ruleCount{1<<64 - 1, 1}, true},
		{`[7:420] -A KUBE-EXT-X -m comment --comment "ns/web:http traffic counter" -j SLUICE-NEWE-X`, "", ruleCount{}, false},
		{`[0:0] -A KUBE-SVC-X -j KUBE-SEP-Y`, "", ruleCount{}, false},
		{`:SLUICE-NEWC-X - [0:0]`, "", ruleCount{}, false},
		{`[x:1] -A SLUICE-NEWE-X -m comment --comment "ns/web:http traffic counter"`, "SLUICE-NEWE-X", ruleCount{0, 1}, false},
	}
	for _, tc := range saved {
		chain, got, ok := parseSavedCounter(tc.line)
		if ok != tc.ok || (ok && (chain != tc.chain || got != tc.want)) {
			t.Errorf("parseSavedCounter(%q) = %q, %v, %v; want %q, %v, %v", tc.line, chain, got, ok, tc.chain, tc.want, tc.ok)
		}
	}
}

// TestSyncsNeitherReadNorRewriteCounters: a counted Service's path chains jump to its
// new-connection counter chains; an endpoint change (a partial sync) rewrites KUBE-SVC
// and runs no iptables-save (no sync reads counters), and neither it nor a full sync
// writes the counter chains again (they keep their counts); uncounting the Service
// deletes them.
func TestSyncsNeitherReadNorRewriteCounters(t *testing.T) {
	for _, f := range []Flavour{FlavourLegacy, FlavourNFT} {
		t.Run(string(f), func(t *testing.T) {
			b, k, _ := newTestBackend(t, testConfig(model.IPv4), f)
			w := featureWorld()
			counted := func() *model.NodeState { return countertest.Counted(w.state(model.IPv4), "ns3/svc3") }
			mustApply(t, b, counted(), full())
			hash := portHash("ns3/svc3:p80", "tcp")
			svc, ext := prefixClusterPolicy+hash, prefixExternal+hash
			cluster, external := prefixNewConnCluster+hash, prefixNewConnExternal+hash
			for chain, counter := range map[string]string{svc: cluster, ext: external} {
				rules := k.rules(tableNAT, chain)
				if len(rules) == 0 || !strings.HasSuffix(rules[0], `-m comment --comment "ns3/svc3:p80 traffic counter" -j `+counter) {
					t.Errorf("%s does not jump to %s first: %q", chain, counter, rules)
				}
				if got := k.rules(tableNAT, counter); !slices.Equal(got, []string{`-m comment --comment "ns3/svc3:p80 traffic counter"`}) {
					t.Errorf("%s: %q", counter, got)
				}
			}
			counterLines := func() bool {
				in := strings.Join(k.restores, "")
				return strings.Contains(in, ":"+xtables.NewConnCounterChainPrefix) || strings.Contains(in, "-A "+xtables.NewConnCounterChainPrefix)
			}

			w.set(fixture.APIService("ns3/svc3", "p80", model.TCP, "172.30.0.43", 80).NodePort(3003).Endpoints("10.180.2.3:80", "10.180.2.4:80").Build())
			k.restores, k.calls = nil, map[string]int{}
			if res := mustApply(t, b, counted(), changed("ns3/svc3")); res.Full {
				t.Fatal("the endpoint change was a full sync")
			}
			if !strings.Contains(strings.Join(k.restores, ""), ":"+svc+" - [0:0]") {
				t.Errorf("the endpoint change did not rewrite %s:\n%s", svc, strings.Join(k.restores, ""))
			}
			for prog, n := range k.calls {
				if strings.HasSuffix(prog, "-save") {
					t.Errorf("the partial sync ran %s %d times", prog, n)
				}
			}
			if counterLines() {
				t.Errorf("the partial sync wrote a counter chain:\n%s", strings.Join(k.restores, ""))
			}

			k.restores = nil
			mustApply(t, b, counted(), full())
			if in := strings.Join(k.restores, ""); strings.Contains(in, ":"+cluster) || strings.Contains(in, "-A "+cluster) ||
				!strings.Contains(in, "-j "+cluster) {
				t.Errorf("the full sync rewrote the counter chain, or lost the jump to it:\n%s", in)
			}

			// A counter chain emptied behind sluice's back is written again by a full sync.
			k.mu.Lock()
			k.tables[tableNAT].chains[external].rules = nil
			k.mu.Unlock()
			mustApply(t, b, counted(), full())
			if got := k.rules(tableNAT, external); len(got) != 1 {
				t.Errorf("%s after a full sync: %q", external, got)
			}

			mustApply(t, b, countertest.Counted(w.state(model.IPv4), "none/none"), changed("ns3/svc3"))
			if got := k.chainNames(tableNAT, xtables.NewConnCounterChainPrefix); len(got) != 0 {
				t.Errorf("uncounted, yet nat holds %v", got)
			}
			assertConsistent(t, k)
		})
	}
}

// TestPacketCountersComeAndGoWithTheFirstAndLastCountedService: with nothing counted
// mangle holds nothing of the packet counters; the first counted Service brings them
// with a full sync, a counted Service's endpoint change writes nothing to mangle, a
// second counted Service is a partial sync adding its rules and chains, and the last one
// uncounted removes them all with a full sync.
func TestPacketCountersComeAndGoWithTheFirstAndLastCountedService(t *testing.T) {
	for _, f := range []Flavour{FlavourLegacy, FlavourNFT} {
		t.Run(string(f), func(t *testing.T) {
			b, k, _ := newTestBackend(t, testConfig(model.IPv4), f)
			w := featureWorld()
			mustApply(t, b, w.state(model.IPv4), full())
			if m := k.save(tableMangle); strings.Contains(m, "SLUICE-") {
				t.Fatalf("nothing counted, yet mangle holds:\n%s", m)
			}
			writes := func(what string, st *model.NodeState, ch model.Changes, wantFull bool, wantMangle bool) {
				t.Helper()
				k.restores = nil
				res := mustApply(t, b, st, ch)
				if res.Full != wantFull {
					t.Errorf("%s: full sync %v (%q), want %v", what, res.Full, b.LastStats().Reason, wantFull)
				}
				in := strings.Join(k.restores, "")
				wrote := strings.Contains(in, xtables.PacketCounterChainPrefix) || strings.Contains(in, xtables.PacketCounterChain)
				if wrote != wantMangle {
					t.Errorf("%s: packet counter lines written: %v, want %v:\n%s", what, wrote, wantMangle, strings.Join(k.restores, ""))
				}
			}
			writes("the first counted Service", countertest.Counted(w.state(model.IPv4), "ns3/svc3"), changed("ns3/svc3"), true, true)
			if got := b.LastStats().Reason; got != "packet counters switched" {
				t.Errorf("reason %q", got)
			}
			m := k.save(tableMangle)
			for _, want := range []string{"-A PREROUTING ! -i lo -m conntrack --ctdir ORIGINAL", "-A OUTPUT -m conntrack --ctdir ORIGINAL",
				`"ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -g SLUICE-PKTC-`,
				`"ns3/svc3:p80 node port" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3003 -g SLUICE-PKTE-`} {
				if !strings.Contains(m, want) {
					t.Errorf("mangle lacks %q:\n%s", want, m)
				}
			}
			w.set(fixture.APIService("ns3/svc3", "p80", model.TCP, "172.30.0.43", 80).NodePort(3003).Endpoints("10.180.2.3:80", "10.180.2.4:80").Build())
			writes("an endpoint change of the counted Service", countertest.Counted(w.state(model.IPv4), "ns3/svc3"), changed("ns3/svc3"), false, false)
			both := countertest.Counted(w.state(model.IPv4), "ns3/svc3", "ns1/svc1")
			writes("a second counted Service", both, changed("ns1/svc1"), false, true)
			if m := k.save(tableMangle); !strings.Contains(m, `"ns1/svc1:p80 cluster IP"`) {
				t.Errorf("ns1/svc1's rule missing:\n%s", m)
			}
			writes("a full resync", both, full(), true, true)
			writes("one uncounted", countertest.Counted(w.state(model.IPv4), "ns3/svc3"), changed("ns1/svc1"), false, true)
			if m := k.save(tableMangle); strings.Contains(m, "ns1/svc1") || !strings.Contains(m, "ns3/svc3") {
				t.Errorf("after uncounting ns1/svc1:\n%s", m)
			}
			writes("the last uncounted", countertest.Counted(w.state(model.IPv4), "none/none"), changed("ns3/svc3"), true, true)
			if m := k.save(tableMangle); strings.Contains(m, "SLUICE-") {
				t.Errorf("nothing counted any more, yet mangle holds:\n%s", m)
			}
			writes("a full resync with nothing counted", countertest.Counted(w.state(model.IPv4), "none/none"), full(), true, false)
			assertConsistent(t, k)
		})
	}
}

// tracedFeatureWorld returns a backend over a fake kernel, a tracer of its rules, and the
// feature world's state, not yet applied.
func tracedFeatureWorld(t *testing.T) (*Backend, *traceEnv, *model.NodeState) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	return b, &traceEnv{k: k, localAddrs: testLocalAddrs, t: t}, featureWorld().state(model.IPv4)
}

// pkt is a packet arriving on eth0.
func pkt(src netip.Addr, dst string, proto string, port int) packet {
	return packet{src: src, dst: netip.MustParseAddr(dst), proto: proto, dport: port, iif: "eth0"}
}

// TestTracedPacketsCountOnThePathOfTheirAddress follows packets through mangle: each
// counts once, on the counter of the address it was sent to (ClusterIP: cluster, or local
// under internalTrafficPolicy Local; NodePort, external IP, LoadBalancer IP: external),
// LoadBalancer IPs only from the allowed source ranges, and a packet looped back through
// lo (already counted in OUTPUT) not again.
func TestTracedPacketsCountOnThePathOfTheirAddress(t *testing.T) {
	b, env, st := tracedFeatureWorld(t)
	webCluster := prefixPacketsCluster + portHash("ns1/svc1:p80", "tcp")
	mustApply(t, b, st, full())
	if got := env.counters(pkt(outside, "172.30.0.41", "tcp", 80)); len(got) != 0 {
		t.Fatalf("nothing counted, yet a packet went through %v", got)
	}
	mustApply(t, b, countertest.Counted(st), full())
	looped := pkt(nodeIP, nodeIP.String(), "tcp", 3003)
	looped.iif = "lo"
	local := pkt(nodeIP, "172.30.0.49", "tcp", 80)
	local.iif, local.local = "", true
	for _, tc := range []struct {
		name string
		pkt  packet
		want []string
	}{
		{"ClusterIP", pkt(outside, "172.30.0.41", "tcp", 80), []string{webCluster}},
		{"ClusterIP, another port", pkt(outside, "172.30.0.41", "tcp", 81), nil},
		{"ClusterIP, another protocol", pkt(outside, "172.30.0.41", "udp", 80), nil},
		{"UDP ClusterIP", pkt(outside, "172.30.0.53", "udp", 53), []string{prefixPacketsCluster + portHash("ns11/dns:p80", "udp")}},
		{"ClusterIP without endpoints", pkt(outside, "172.30.0.42", "tcp", 80), []string{prefixPacketsCluster + portHash("ns2/svc2:p80", "tcp")}},
		{"NodePort", pkt(outside, nodeIP.String(), "tcp", 3003), []string{prefixPacketsExternal + portHash("ns3/svc3:p80", "tcp")}},
		{"external IP", pkt(outside, "192.168.99.7", "tcp", 80), []string{prefixPacketsExternal + portHash("ns7/svc7:p80", "tcp")}},
		{"LoadBalancer IP from an allowed range", pkt(outside, "5.6.7.10", "tcp", 80), []string{prefixPacketsExternal + portHash("ns6/svc6:p80", "tcp")}},
		{"LoadBalancer IP from elsewhere (filter drops it)", pkt(netip.MustParseAddr("198.51.100.1"), "5.6.7.10", "tcp", 80), nil},
		{"from the node to a Local-policy ClusterIP", local, []string{prefixPacketsLocal + portHash("ns8/svc8:p80", "tcp")}},
		{"looped back through lo", looped, nil},
	} {
		if got := env.counters(tc.pkt); !slices.Equal(got, tc.want) {
			t.Errorf("%s: counted by %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestTracedConnectionsCountOnTheirPathChains follows first packets through nat: a
// connection counts once on the counter chain of each path chain it goes through (a
// ClusterIP: cluster, or local under internalTrafficPolicy Local; a NodePort: external,
// then the path its policy picks), and not at all without endpoints.
func TestTracedConnectionsCountOnTheirPathChains(t *testing.T) {
	b, env, st := tracedFeatureWorld(t)
	mustApply(t, b, st, full())
	if got := env.newConnections(pkt(outside, "172.30.0.41", "tcp", 80)); len(got) != 0 {
		t.Fatalf("nothing counted, yet a connection went through %v", got)
	}
	mustApply(t, b, countertest.Counted(st), full())
	local := pkt(nodeIP, "172.30.0.49", "tcp", 80)
	local.iif, local.local = "", true
	svc3 := portHash("ns3/svc3:p80", "tcp")
	for _, tc := range []struct {
		name string
		pkt  packet
		want []string
	}{
		{"ClusterIP", pkt(outside, "172.30.0.41", "tcp", 80), []string{prefixNewConnCluster + portHash("ns1/svc1:p80", "tcp")}},
		{"UDP ClusterIP", pkt(outside, "172.30.0.53", "udp", 53), []string{prefixNewConnCluster + portHash("ns11/dns:p80", "udp")}},
		{"ClusterIP without endpoints", pkt(outside, "172.30.0.42", "tcp", 80), nil},
		{"NodePort", pkt(outside, nodeIP.String(), "tcp", 3003), []string{prefixNewConnExternal + svc3, prefixNewConnCluster + svc3}},
		{"from the node to a Local-policy ClusterIP", local, []string{prefixNewConnLocal + portHash("ns8/svc8:p80", "tcp")}},
	} {
		if got := env.newConnections(tc.pkt); !slices.Equal(got, tc.want) {
			t.Errorf("%s: counted by %v, want %v", tc.name, got, tc.want)
		}
	}
}
