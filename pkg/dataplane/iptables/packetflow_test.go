package iptables

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// featureWorld has one Service per feature (see the conventions in helpers_test.go).
func featureWorld() *world {
	w := &world{}
	w.add(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.1.1:80@local", "10.180.2.1:80").Build())
	w.add(fixture.APIService("ns2/svc2", "p80", model.TCP, "172.30.0.42", 80).NodePort(3002).Build())
	w.add(fixture.APIService("ns3/svc3", "p80", model.TCP, "172.30.0.43", 80).NodePort(3003).Endpoints("10.180.2.3:80").Build())
	w.add(fixture.APIService("ns4/svc4", "p80", model.TCP, "172.30.0.44", 80).NodePort(3004).LoadBalancer("5.6.7.8").ExternalLocal().HealthCheckNodePort(30004).Endpoints("10.180.1.4:80@local", "10.180.2.4:80").Build())
	w.add(fixture.APIService("ns5/svc5", "p80", model.TCP, "172.30.0.45", 80).NodePort(3005).LoadBalancer("5.6.7.9").ExternalLocal().HealthCheckNodePort(30005).Endpoints("10.180.2.5:80").Build())
	w.add(fixture.APIService("ns6/svc6", "p80", model.TCP, "172.30.0.46", 80).NodePort(3006).LoadBalancer("5.6.7.10").SourceRanges("203.0.113.0/25").Endpoints("10.180.2.6:80").Build())
	w.add(fixture.APIService("ns6/svc6b", "p80", model.TCP, "172.30.0.47", 80).NodePort(3007).LoadBalancer("5.6.7.11").SourceRanges("192.168.0.0/24").Endpoints("10.180.2.7:80").Build())
	w.add(fixture.APIService("ns7/svc7", "p80", model.TCP, "172.30.0.48", 80).ExternalIPs("192.168.99.7").Endpoints("10.180.2.8:80").Build())
	w.add(fixture.APIService("ns8/svc8", "p80", model.TCP, "172.30.0.49", 80).InternalLocal().Endpoints("10.180.1.9:80@local", "10.180.2.9:80").Build())
	w.add(fixture.APIService("ns9/svc9", "p80", model.TCP, "172.30.0.50", 80).InternalLocal().Endpoints("10.180.2.10:80").Build())
	w.add(fixture.APIService("ns10/svc10", "p80", model.TCP, "172.30.0.51", 80).Affinity(10800).Endpoints("10.180.1.11:80@local", "10.180.2.11:80").Build())
	w.add(fixture.APIService("ns11/dns", "p80", model.UDP, "172.30.0.53", 53).Endpoints("10.180.2.53:53").Build())
	w.add(fixture.APIService("ns12/sctp", "p80", model.SCTP, "172.30.0.54", 7777).Endpoints("10.180.2.54:7777").Build())
	w.add(fixture.APIService("ns13/draining", "p80", model.TCP, "172.30.0.55", 80).Endpoints("10.180.2.55:80@terminating", "10.180.2.56:80@notready").Build())
	w.add(fixture.APIService("ns14/extlocal-nodeport", "p80", model.TCP, "172.30.0.56", 80).NodePort(3014).ExternalLocal().Endpoints("10.180.2.57:80").Build())
	return w
}

var (
	podHere     = netip.MustParseAddr("10.180.1.99")
	outside     = netip.MustParseAddr("203.0.113.5")
	nodeIP      = testNodeIPv4
	localhostV4 = netip.MustParseAddr("127.0.0.1")
)

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestPacketFlowIPv4(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	assertConsistent(t, k)
	env := &traceEnv{k: k, localAddrs: testLocalAddrs}
	runPacketFlowTests(t, env, []packetFlowTest{
		{name: "pod to ClusterIP reaches every endpoint, source kept",
			pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1"}, output: "10.180.1.1:80, 10.180.2.1:80"},
		{name: "off-cluster source to ClusterIP is masqueraded",
			pkt: packet{src: outside, dst: a("172.30.0.41"), dport: 80, iif: "eth0"}, output: "10.180.1.1:80, 10.180.2.1:80", masq: true},
		{name: "node to ClusterIP is masqueraded",
			pkt: packet{src: nodeIP, dst: a("172.30.0.41"), dport: 80, local: true}, output: "10.180.1.1:80, 10.180.2.1:80", masq: true},
		{name: "hairpin: endpoint to its own Service is masqueraded",
			pkt: packet{src: a("10.180.1.1"), dst: a("172.30.0.41"), dport: 80, iif: "veth1"}, output: "10.180.1.1:80, 10.180.2.1:80", masq: true},
		{name: "ClusterIP on another port is not touched",
			pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 81, iif: "veth1"}, output: "local"},
		{name: "no endpoints: ClusterIP rejected",
			pkt: packet{src: podHere, dst: a("172.30.0.42"), dport: 80, iif: "veth1"}, output: "REJECT"},
		{name: "no endpoints: NodePort rejected",
			pkt: packet{src: outside, dst: nodeIP, dport: 3002, iif: "eth0"}, output: "REJECT"},
		{name: "no endpoints: from the node rejected",
			pkt: packet{src: nodeIP, dst: a("172.30.0.42"), dport: 80, local: true}, output: "REJECT"},
		{name: "NodePort, Cluster policy: masqueraded",
			pkt: packet{src: outside, dst: nodeIP, dport: 3003, iif: "eth0"}, output: "10.180.2.3:80", masq: true},
		{name: "localhost NodePort from the node",
			pkt: packet{src: localhostV4, dst: localhostV4, dport: 3003, local: true}, output: "10.180.2.3:80", masq: true},
		{name: "route_localnet: 127.0.0.0/8 from the network is dropped (KUBE-FIREWALL)",
			pkt: packet{src: outside, dst: localhostV4, dport: 9999, iif: "eth0"}, output: "DROP"},
		{name: "LoadBalancer IP, Local policy, from outside: local endpoint only, source kept",
			pkt: packet{src: outside, dst: a("5.6.7.8"), dport: 80, iif: "eth0"}, output: "10.180.1.4:80"},
		{name: "NodePort, Local policy, from outside: local endpoint only, source kept",
			pkt: packet{src: outside, dst: nodeIP, dport: 3004, iif: "eth0"}, output: "10.180.1.4:80"},
		{name: "LoadBalancer IP, Local policy, from a pod: short-circuit to every endpoint",
			pkt: packet{src: podHere, dst: a("5.6.7.8"), dport: 80, iif: "veth1"}, output: "10.180.1.4:80, 10.180.2.4:80"},
		{name: "LoadBalancer IP, Local policy, from the node: masqueraded, every endpoint",
			pkt: packet{src: nodeIP, dst: a("5.6.7.8"), dport: 80, local: true}, output: "10.180.1.4:80, 10.180.2.4:80", masq: true},
		{name: "healthCheckNodePort is accepted",
			pkt: packet{src: outside, dst: nodeIP, dport: 30004, iif: "eth0"}, output: "local"},
		{name: "Local policy without local endpoints: outside traffic dropped",
			pkt: packet{src: outside, dst: a("5.6.7.9"), dport: 80, iif: "eth0"}, output: "DROP"},
		{name: "Local policy without local endpoints: NodePort dropped",
			pkt: packet{src: outside, dst: nodeIP, dport: 3005, iif: "eth0"}, output: "DROP"},
		{name: "Local policy without local endpoints: pods still served",
			pkt: packet{src: podHere, dst: a("5.6.7.9"), dport: 80, iif: "veth1"}, output: "10.180.2.5:80"},
		{name: "Local policy without local endpoints: ClusterIP still served",
			pkt: packet{src: podHere, dst: a("172.30.0.45"), dport: 80, iif: "veth1"}, output: "10.180.2.5:80"},
		{name: "source range: allowed source",
			pkt: packet{src: a("203.0.113.1"), dst: a("5.6.7.10"), dport: 80, iif: "eth0"}, output: "10.180.2.6:80", masq: true},
		{name: "source range: other source dropped",
			pkt: packet{src: a("203.0.113.200"), dst: a("5.6.7.10"), dport: 80, iif: "eth0"}, output: "DROP"},
		{name: "source range: NodePort is not filtered",
			pkt: packet{src: a("203.0.113.200"), dst: nodeIP, dport: 3006, iif: "eth0"}, output: "10.180.2.6:80", masq: true},
		{name: "source range holding the node IP allows the LoadBalancer IP as source",
			pkt: packet{src: a("5.6.7.11"), dst: a("5.6.7.11"), dport: 80, iif: "eth0"}, output: "10.180.2.7:80", masq: true},
		{name: "externalIP from outside is masqueraded",
			pkt: packet{src: outside, dst: a("192.168.99.7"), dport: 80, iif: "eth0"}, output: "10.180.2.8:80", masq: true},
		{name: "internalTrafficPolicy Local: local endpoint only",
			pkt: packet{src: podHere, dst: a("172.30.0.49"), dport: 80, iif: "veth1"}, output: "10.180.1.9:80"},
		{name: "internalTrafficPolicy Local without local endpoints: dropped",
			pkt: packet{src: podHere, dst: a("172.30.0.50"), dport: 80, iif: "veth1"}, output: "DROP"},
		{name: "ClientIP affinity: a new client may reach every endpoint",
			pkt: packet{src: podHere, dst: a("172.30.0.51"), dport: 80, iif: "veth1"}, output: "10.180.1.11:80, 10.180.2.11:80"},
		{name: "UDP",
			pkt: packet{src: podHere, dst: a("172.30.0.53"), proto: "udp", dport: 53, iif: "veth1"}, output: "10.180.2.53:53"},
		{name: "UDP rule does not catch TCP",
			pkt: packet{src: podHere, dst: a("172.30.0.53"), proto: "tcp", dport: 53, iif: "veth1"}, output: "local"},
		{name: "SCTP",
			pkt: packet{src: podHere, dst: a("172.30.0.54"), proto: "sctp", dport: 7777, iif: "veth1"}, output: "10.180.2.54:7777"},
		{name: "only terminating endpoints: the serving one is used",
			pkt: packet{src: podHere, dst: a("172.30.0.55"), dport: 80, iif: "veth1"}, output: "10.180.2.55:80"},
		{name: "NodePort, Local policy, no local endpoints, from outside: dropped",
			pkt: packet{src: outside, dst: nodeIP, dport: 3014, iif: "eth0"}, output: "DROP"},
		{name: "NodePort, Local policy, no local endpoints, from the node: served",
			pkt: packet{src: nodeIP, dst: nodeIP, dport: 3014, local: true}, output: "10.180.2.57:80", masq: true},
	})
}

func TestPacketFlowIPv6(t *testing.T) {
	w := &world{}
	w.add(fixture.APIService("ns1/svc1", "p80", model.TCP, "fd00:172:30::41", 80).NodePort(3001).Endpoints("[fd00:10::1]:80@local", "[fd00:10:2::1]:80").Build())
	w.add(fixture.APIService("ns2/svc2", "p80", model.TCP, "fd00:172:30::42", 80).Build())
	b, k, _ := newTestBackend(t, testConfig(model.IPv6), FlavourNFT)
	mustApply(t, b, w.state(model.IPv6), full())
	assertConsistent(t, k)
	env := &traceEnv{k: k, localAddrs: testLocalAddrs}
	runPacketFlowTests(t, env, []packetFlowTest{
		{name: "pod to ClusterIP", pkt: packet{src: a("fd00:10::99"), dst: a("fd00:172:30::41"), dport: 80, iif: "veth1"},
			output: "[fd00:10:2::1]:80, [fd00:10::1]:80"},
		{name: "outside to ClusterIP is masqueraded", pkt: packet{src: a("2001:db8:77::7"), dst: a("fd00:172:30::41"), dport: 80, iif: "eth0"},
			output: "[fd00:10:2::1]:80, [fd00:10::1]:80", masq: true},
		{name: "NodePort", pkt: packet{src: a("2001:db8:77::7"), dst: testNodeIPv6, dport: 3001, iif: "eth0"},
			output: "[fd00:10:2::1]:80, [fd00:10::1]:80", masq: true},
		{name: "no localhost NodePorts on IPv6", pkt: packet{src: netip.IPv6Loopback(), dst: netip.IPv6Loopback(), dport: 3001, local: true},
			output: "local"},
		{name: "no endpoints: rejected", pkt: packet{src: a("fd00:10::99"), dst: a("fd00:172:30::42"), dport: 80, iif: "veth1"},
			output: "REJECT"},
	})
}

func TestPacketFlowOptions(t *testing.T) {
	w := &world{}
	w.add(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).NodePort(3001).Endpoints("10.180.1.1:80@local").Build())
	w.add(fixture.APIService("ns2/svc2", "p80", model.TCP, "172.30.0.42", 80).NodePort(3002).LoadBalancer("5.6.7.8").ExternalLocal().HealthCheckNodePort(30002).Endpoints("10.180.1.2:80@local", "10.180.2.2:80").Build())
	pod := packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1"}

	for _, tc := range []struct {
		name  string
		cfg   func(*dataplane.Config)
		tests []packetFlowTest
	}{
		{name: "masqueradeAll", cfg: func(c *dataplane.Config) { c.MasqueradeAll = true },
			tests: []packetFlowTest{{name: "pod to ClusterIP is masqueraded", pkt: pod, output: "10.180.1.1:80", masq: true}}},
		{name: "no local detector", cfg: func(c *dataplane.Config) { c.LocalDetector = dataplane.LocalDetector{} },
			tests: []packetFlowTest{
				{name: "off-cluster source keeps its address", pkt: packet{src: outside, dst: a("172.30.0.41"), dport: 80, iif: "eth0"}, output: "10.180.1.1:80"},
				{name: "pod to LoadBalancer IP with Local policy: local endpoint only", pkt: packet{src: podHere, dst: a("5.6.7.8"), dport: 80, iif: "veth1"}, output: "10.180.1.2:80"},
			}},
		{name: "detect local by bridge", cfg: func(c *dataplane.Config) {
			c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}
		}, tests: []packetFlowTest{
			{name: "pod behind the bridge keeps its address", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "cbr0"}, output: "10.180.1.1:80"},
			{name: "other interface is masqueraded", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "eth0"}, output: "10.180.1.1:80", masq: true},
			{name: "pod to LoadBalancer IP short-circuits", pkt: packet{src: podHere, dst: a("5.6.7.8"), dport: 80, iif: "cbr0"}, output: "10.180.1.2:80, 10.180.2.2:80"},
		}},
		{name: "detect local by interface prefix", cfg: func(c *dataplane.Config) {
			c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}
		}, tests: []packetFlowTest{
			{name: "pod veth keeps its address", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1234"}, output: "10.180.1.1:80"},
			{name: "other interface is masqueraded", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "eth0"}, output: "10.180.1.1:80", masq: true},
		}},
		{name: "detect local by node CIDR", cfg: func(c *dataplane.Config) {
			c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.180.1.0/24")}}
		}, tests: []packetFlowTest{
			{name: "pod on this node keeps its address", pkt: pod, output: "10.180.1.1:80"},
			{name: "pod on another node is masqueraded", pkt: packet{src: a("10.180.2.99"), dst: a("172.30.0.41"), dport: 80, iif: "eth0"}, output: "10.180.1.1:80", masq: true},
		}},
		{name: "nodePortAddresses primary", cfg: func(c *dataplane.Config) {
			c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.PrefixFrom(testNodeIPv4, 32)}}
		}, tests: []packetFlowTest{
			{name: "NodePort on the node IP", pkt: packet{src: outside, dst: nodeIP, dport: 3001, iif: "eth0"}, output: "10.180.1.1:80", masq: true},
			{name: "no NodePort on localhost", pkt: packet{src: localhostV4, dst: localhostV4, dport: 3001, local: true}, output: "local"},
		}},
		{name: "nodePortAddresses with localhost", cfg: func(c *dataplane.Config) {
			c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
		}, tests: []packetFlowTest{
			{name: "NodePort on localhost", pkt: packet{src: localhostV4, dst: localhostV4, dport: 3001, local: true}, output: "10.180.1.1:80", masq: true},
			{name: "no NodePort on the node IP", pkt: packet{src: outside, dst: nodeIP, dport: 3001, iif: "eth0"}, output: "local"},
		}},
		{name: "localhost NodePorts off", cfg: func(c *dataplane.Config) { c.LocalhostNodePorts = false },
			tests: []packetFlowTest{
				{name: "no NodePort on localhost", pkt: packet{src: localhostV4, dst: localhostV4, dport: 3001, local: true}, output: "local"},
				{name: "NodePort on the node IP", pkt: packet{src: outside, dst: nodeIP, dport: 3001, iif: "eth0"}, output: "10.180.1.1:80", masq: true},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			tc.cfg(&cfg)
			b, k, _ := newTestBackend(t, cfg, FlavourLegacy)
			mustApply(t, b, w.state(model.IPv4), full())
			assertConsistent(t, k)
			runPacketFlowTests(t, &traceEnv{k: k, localAddrs: testLocalAddrs}, tc.tests)
		})
	}
}

// TestFullRulesetGolden pins the generated text: upstream's rules, comments and chain
// names for every feature.
func TestFullRulesetGolden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		family  model.IPFamily
		cfg     func(*dataplane.Config)
		counted bool // every Service's traffic counted (--traffic-counters=all)
	}{
		{name: "ipv4", family: model.IPv4},
		{name: "ipv4-counted", family: model.IPv4, counted: true},
		{name: "ipv4-nodeport-addresses", family: model.IPv4, cfg: func(c *dataplane.Config) {
			c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("127.0.0.0/8")}}
			c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}
			c.MasqueradeAll = true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.family)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			b, k, _ := newTestBackend(t, cfg, FlavourLegacy)
			st := featureWorld().state(tc.family)
			if tc.counted {
				st = countertest.Counted(st)
			}
			mustApply(t, b, st, full())
			if len(k.restores) != 1 {
				t.Fatalf("full sync ran %d restores, want 1", len(k.restores))
			}
			golden := filepath.Join("testdata", "full-"+tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(k.restores[0]), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got := k.restores[0]; got != string(want) {
				t.Errorf("full sync input differs from %s (run with -update after checking):\n%s", golden, lineDiff(string(want), got))
			}
		})
	}
}

// lineDiff shows the first differing lines.
func lineDiff(want, got string) string {
	wl, gl := splitLines(want), splitLines(got)
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return "line " + itoa(i+1) + ":\n- " + w + "\n+ " + g
		}
	}
	return ""
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }
