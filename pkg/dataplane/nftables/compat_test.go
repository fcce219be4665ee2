//go:build kernel

package nftables

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func fixedAddrs(addrs ...netip.Addr) Option {
	return WithLocalAddresses(func() ([]netip.Addr, error) { return addrs, nil })
}

// TestTablesWrittenByNftConverge: the golden plans are nft scripts. Loaded by nft(8),
// they give tables our reader finds identical, rule for rule and element for element,
// to what we write over netlink: a table nft wrote is one we can converge without
// rewriting it. nft loads the whole script (Render's, which TestRenderIsTheFirstFullPlan
// checks is the golden file plus its empty endpoint maps): the table has all its maps.
func TestTablesWrittenByNftConverge(t *testing.T) {
	for _, v := range planVariants {
		t.Run(v.name, func(t *testing.T) {
			resetTable(t)
			script, err := Render(v.state(), v.config(), RenderOptions{LocalAddresses: testLocalAddrs})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			path := filepath.Join(t.TempDir(), "full-"+v.name+".nft")
			if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			nft(t, "-f", path)
			b := newTestBackend(t, v.config(), fixedAddrs(testLocalAddrs...))
			mustApply(t, b, v.state(), model.Changes{Full: true})
			if st := b.LastStats(); st.Operations != 0 {
				t.Errorf("converging the table nft wrote planned %d operations:\n%s", st.Operations, b.lastPlan)
			}
		})
	}
}

// TestNftReloadsItsListing: `nft list table` of our table loads back with `nft -f`
// (operators save and restore rulesets that way), and what it loads needs no change.
func TestNftReloadsItsListing(t *testing.T) {
	for _, f := range model.Families {
		t.Run(f.String(), func(t *testing.T) {
			resetTable(t)
			b := newTestBackend(t, testConfig(f), fixedAddrs(testLocalAddrs...))
			mustApply(t, b, examples(f), model.Changes{Full: true})
			listing := nftList(t, f)
			resetTable(t)
			path := filepath.Join(t.TempDir(), "table.nft")
			if err := os.WriteFile(path, []byte(listing), 0o644); err != nil {
				t.Fatal(err)
			}
			nft(t, "-f", path)
			b2 := newTestBackend(t, testConfig(f), fixedAddrs(testLocalAddrs...))
			mustApply(t, b2, examples(f), model.Changes{Full: true})
			if st := b2.LastStats(); st.Operations != 0 {
				t.Logf("the reloaded listing needed %d operations:\n%s", st.Operations, b2.lastPlan)
			}
		})
	}
}

// upstreamTable renders, as nft commands, the table upstream kube-proxy v1.37 writes for
// two Services: t/cluster (TCP, two local endpoints, a numgen anonymous map) and t/dns
// (UDP, one endpoint), with the test configuration. It adds two chains older upstream
// versions had.
func upstreamTable() string {
	cluster := chainNamesFor(model.ServicePortName{NamespacedName: nsName("t/cluster"), Port: "http", Protocol: model.TCP}).cluster
	dns := chainNamesFor(model.ServicePortName{NamespacedName: nsName("t/dns"), Port: "dns", Protocol: model.UDP}).cluster
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w(`add table ip kube-proxy { comment "rules for kube-proxy" ; }`)
	w(`add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }`)
	w(`add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }`)
	w(`add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment "service hairpin connections" ; }`)
	for _, m := range []string{firewallIPsMap, noEndpointServicesMap, serviceIPsMap} {
		w(`add map ip kube-proxy %s { type ipv4_addr . inet_proto . inet_service : verdict ; }`, m)
	}
	for _, m := range []string{noEndpointNodePortsMap, serviceNodePortsMap} {
		w(`add map ip kube-proxy %s { type inet_proto . inet_service : verdict ; }`, m)
	}
	for _, bc := range baseChains {
		w(`add chain ip kube-proxy %s { type %s hook %s priority %d ; }`, bc.name, bc.spec.typ, hookName(bc.spec.hook), bc.spec.priority)
	}
	for _, c := range []string{clusterIPsCheckChain, firewallCheckChain, masqueradingChain, nodePortEndpointsCheckChain, servicesChain, serviceEndpointsCheckChain} {
		w(`add chain ip kube-proxy %s`, c)
	}
	w(`add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }`)
	for _, j := range jumps {
		ct := ""
		if j.newOnly {
			ct = "ct state new "
		}
		w(`add rule ip kube-proxy %s %sjump %s`, j.from, ct, j.to)
	}
	w(`add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`)
	w(`add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"`)
	w(`add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips`)
	w(`add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random`)
	w(`add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random`)
	w(`add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports`)
	w(`add rule ip kube-proxy reject-chain reject`)
	w(`add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster"`)
	w(`add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips`)
	w(`add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports`)
	w(`add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services`)
	w(`add element ip kube-proxy nodeport-ips { 192.168.0.2 }`)
	// t/cluster
	w(`add chain ip kube-proxy %s`, cluster)
	w(`add rule ip kube-proxy %s meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.2 . 80 }`, cluster)
	w(`add element ip kube-proxy cluster-ips { 172.30.0.10 }`)
	w(`add element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 : goto %s }`, cluster)
	w(`add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }`)
	w(`add element ip kube-proxy hairpin-connections { 10.180.0.2 . 10.180.0.2 . tcp . 80 }`)
	// t/dns
	w(`add chain ip kube-proxy %s`, dns)
	w(`add rule ip kube-proxy %s meta l4proto udp dnat to 10.180.0.1:8080`, dns)
	w(`add element ip kube-proxy cluster-ips { 172.30.0.11 }`)
	w(`add element ip kube-proxy service-ips { 172.30.0.11 . udp . 53 : goto %s }`, dns)
	w(`add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . udp . 8080 }`)
	// Chains of older upstream versions.
	w(`add chain ip kube-proxy mark-for-masquerade`)
	w(`add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000`)
	w(`add chain ip kube-proxy endpoints-check`)
	return b.String()
}

func takeoverState() *model.NodeState {
	return nodeState(model.IPv4,
		svc("t", "cluster", "http", model.TCP, "172.30.0.10", 80).Endpoints("10.180.0.1:80@local", "10.180.0.2:80@local").Build(),
		svc("t", "dns", "dns", model.UDP, "172.30.0.11", 53).Endpoints("10.180.0.1:8080@local").Build(),
	)
}

// TestTakeOverUpstreamTable: a node running upstream kube-proxy in nftables mode
// switches to sluice. sluice converges the table upstream wrote (its anonymous numgen
// maps become endpoint maps, old chains go) while connections keep being made.
func TestTakeOverUpstreamTable(t *testing.T) {
	tp := takeoverTopology(t)
	nftScript(t, upstreamTable())
	b := takeOverWhileProbing(t, tp, "upstream")
	st := b.LastStats()

	if st.Replaced {
		t.Error("the upstream table was replaced rather than converged")
	}
	t.Logf("takeover: %d operations in %d batches:\n%s", st.Operations, st.Batches, b.lastPlan)
	out := nftList(t, model.IPv4)
	for _, gone := range []string{"chain mark-for-masquerade", "chain endpoints-check", "numgen random mod 2 map {"} {
		if strings.Contains(out, gone) {
			t.Errorf("%q still in the table:\n%s", gone, out)
		}
	}
	b2 := newTestBackend(t, testConfig(model.IPv4), fixedAddrs(testNodeIP))
	mustApply(t, b2, takeoverState(), model.Changes{Full: true})
	if n := b2.LastStats().Operations; n != 0 {
		t.Errorf("after the takeover a new process planned %d operations:\n%s", n, b2.lastPlan)
	}
}

// TestIncompatibleTableIsReplacedWithoutGap: a kube-proxy table whose maps have other
// types (a future or foreign layout) cannot be converged in place; it is replaced in one
// transaction, and connections made meanwhile all succeed.
func TestIncompatibleTableIsReplacedWithoutGap(t *testing.T) {
	tp := takeoverTopology(t)
	nftScript(t, `
add table ip kube-proxy
add map ip kube-proxy service-ips { type ipv4_addr : verdict ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add rule ip kube-proxy nat-prerouting ip daddr 172.30.0.10 tcp dport 80 dnat to 10.180.0.1:80
add rule ip kube-proxy nat-prerouting ip daddr 172.30.0.11 udp dport 53 dnat to 10.180.0.1:8080
`)
	b := takeOverWhileProbing(t, tp, "foreign")
	if st := b.LastStats(); !st.Replaced || st.Batches != 1 {
		t.Errorf("want one replacing transaction, got %+v", st)
	}
}

// takeoverTopology is a clean node with pod-a (10.180.0.1) and pod-b (10.180.0.2), for a
// table written by another program to be taken over.
func takeoverTopology(t *testing.T) *topology {
	t.Helper()
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	tp.addPod("pod-b", "10.180.0.2")
	return tp
}

// takeOverWhileProbing checks that the table on the node (what wrote it) carries
// traffic, then programs takeoverState with a new backend while a prober keeps
// connecting to both of its Services, and fails the test if any connection failed.
func takeOverWhileProbing(t *testing.T, tp *topology, what string) *Backend {
	t.Helper()
	if _, err := tp.tcp(tp.client, netip.Addr{}, ap("172.30.0.10", 80), quick); err != nil {
		t.Fatalf("the %s table does not work: %v", what, err)
	}
	p := startProber(tp, tp.client, ap("172.30.0.10", 80), ap("172.30.0.11", 53))
	time.Sleep(100 * time.Millisecond)
	b := newTestBackend(t, testConfig(model.IPv4), fixedAddrs(testNodeIP))
	mustApply(t, b, takeoverState(), model.Changes{Full: true})
	time.Sleep(100 * time.Millisecond)
	p.finish(t)
	return b
}

func nftScript(t testing.TB, script string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.nft")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	nft(t, "-f", path)
}
