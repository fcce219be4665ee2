//go:build kernel

package nftables

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

const (
	quick = 2 * time.Second        // connections that must succeed or be refused
	slow  = 400 * time.Millisecond // connections that must be dropped (we wait this long)
)

// In the packet tests the IPv6 addresses write the IPv4 ones' last number after the
// family's prefix: pod n is 10.180.0.n or fd00:10:180::n (pod-a 1, pod-b 2, pod-c 3),
// Service address n is 172.30.0.n or fd00:172:30::n.
var trafficPods = []string{"pod-a", "pod-b", "pod-c"}

func podIP(f model.IPFamily, n int) string { return familyAddr(f, "10.180.0.", "fd00:10:180::", n) }
func vip(f model.IPFamily, n int) string   { return familyAddr(f, "172.30.0.", "fd00:172:30::", n) }

func familyAddr(f model.IPFamily, v4, v6 string, n int) string {
	if f == model.IPv6 {
		return fmt.Sprintf("%s%d", v6, n)
	}
	return fmt.Sprintf("%s%d", v4, n)
}

// trafficServices is the Service set of the packet tests: one of each kind, in both
// families; LoadBalancers, source ranges, external IPs, affinity, hairpin and
// internalTrafficPolicy only in IPv4.
func trafficServices(f model.IPFamily) []*model.ServicePort {
	// ep is pod n's port p, on this node unless remote.
	ep := func(n int, p uint16) string {
		return netip.AddrPortFrom(netip.MustParseAddr(podIP(f, n)), p).String() + "@local"
	}
	remote := func(n int, p uint16) string { return strings.TrimSuffix(ep(n, p), "@local") }
	out := []*model.ServicePort{
		svc("t", "cluster", "http", model.TCP, vip(f, 10), 80).Endpoints(ep(1, 80), ep(2, 80)).Build(),
		svc("t", "dns", "dns", model.UDP, vip(f, 11), 53).Endpoints(ep(1, 8080)).Build(),
		svc("t", "nodeport", "http", model.TCP, vip(f, 12), 80).NodePort(30080).Endpoints(ep(2, 80)).Build(),
		svc("t", "local", "http", model.TCP, vip(f, 13), 80).NodePort(30081).ExternalLocal().Endpoints(ep(1, 80)).Build(),
		svc("t", "nolocal", "http", model.TCP, vip(f, 14), 80).NodePort(30082).ExternalLocal().Endpoints(remote(3, 80)).Build(),
		svc("t", "none", "http", model.TCP, vip(f, 15), 80).Build(),
	}
	if f == model.IPv6 {
		return out
	}
	return append(out,
		svc("t", "lb", "http", model.TCP, "172.30.0.16", 80).LoadBalancer("5.6.7.8").Endpoints("10.180.0.2:80@local").Build(),
		svc("t", "fw", "http", model.TCP, "172.30.0.19", 80).LoadBalancer("5.6.7.9").SourceRanges("192.168.0.10/32").Endpoints("10.180.0.2:80@local").Build(),
		svc("t", "eip", "http", model.TCP, "172.30.0.20", 80).ExternalIPs("192.168.99.22").Endpoints("10.180.0.3:80").Build(),
		svc("t", "sticky", "http", model.TCP, "172.30.0.17", 80).Affinity(100).Endpoints("10.180.0.1:80@local", "10.180.0.2:80@local", "10.180.0.3:80").Build(),
		svc("t", "hairpin", "http", model.TCP, "172.30.0.18", 80).Endpoints("10.180.0.1:80@local").Build(),
		svc("t", "itplocal", "http", model.TCP, "172.30.0.21", 80).InternalLocal().Endpoints("10.180.0.3:80").Build(),
	)
}

// trafficSetup builds the topology with three pods and programs trafficServices.
func trafficSetup(t *testing.T, f model.IPFamily) (*topology, *Backend, *model.NodeState) {
	t.Helper()
	resetTable(t)
	tp := newTopology(t, f)
	for i, name := range trafficPods {
		tp.addPod(name, podIP(f, i+1))
	}
	cfg := testConfig(f)
	b := newTestBackend(t, cfg, WithLocalAddresses(hostnet.InterfaceAddrs))
	ns := nodeState(f, trafficServices(f)...)
	mustApply(t, b, ns, model.Changes{Full: true})
	return tp, b, ns
}

func TestTrafficIPv4(t *testing.T) {
	tp, _, _ := trafficSetup(t, model.IPv4)
	client, podC := tp.client, tp.pods["pod-c"].ns

	t.Run("ClusterIP TCP reaches both endpoints, off-cluster client masqueraded", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 40 && len(seen) < 2; i++ {
			r, err := tp.tcp(client, netip.Addr{}, ap("172.30.0.10", 80), quick)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			seen[r.pod] = true
			if r.peer == clientIP {
				t.Fatalf("off-cluster traffic to a ClusterIP kept its source %v; want masquerade", r.peer)
			}
		}
		if !seen["pod-a"] || !seen["pod-b"] {
			t.Fatalf("endpoints reached: %v, want pod-a and pod-b", seen)
		}
	})
	t.Run("ClusterIP from a pod keeps the pod's address", func(t *testing.T) {
		r, err := tp.tcp(podC, netip.Addr{}, ap("172.30.0.10", 80), quick)
		if err != nil {
			t.Fatal(err)
		}
		if r.peer != netip.MustParseAddr("10.180.0.3") {
			t.Fatalf("source seen %v, want 10.180.0.3", r.peer)
		}
	})
	t.Run("ClusterIP from the node", func(t *testing.T) {
		if _, err := tp.tcp("", netip.Addr{}, ap("172.30.0.10", 80), quick); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ClusterIP UDP", func(t *testing.T) {
		tp.wantUDP(t, podC, netip.Addr{}, ap("172.30.0.11", 53), quick, "pod-a")
	})
	t.Run("NodePort, Cluster policy, masqueraded", func(t *testing.T) {
		r := tp.wantTCP(t, client, netip.Addr{}, ap("192.168.0.2", 30080), quick, "pod-b")
		if r.peer == clientIP {
			t.Fatalf("NodePort with Cluster policy kept source %v", r.peer)
		}
	})
	t.Run("NodePort, Local policy, source preserved", func(t *testing.T) {
		r := tp.wantTCP(t, client, netip.Addr{}, ap("192.168.0.2", 30081), quick, "pod-a")
		if r.peer != clientIP {
			t.Fatalf("NodePort with Local policy: source %v, want %v", r.peer, clientIP)
		}
	})
	t.Run("NodePort, Local policy, no local endpoints: dropped", func(t *testing.T) {
		tp.wantTCPError(t, client, netip.Addr{}, ap("192.168.0.2", 30082), slow, errDropped)
	})
	t.Run("NodePort, Local policy, no local endpoints: pods short-circuit to all endpoints", func(t *testing.T) {
		tp.wantTCP(t, tp.pods["pod-a"].ns, netip.Addr{}, ap("192.168.0.2", 30082), quick, "pod-c")
	})
	t.Run("no endpoints: rejected", func(t *testing.T) {
		for _, ns := range []string{client, podC} {
			tp.wantTCPError(t, ns, netip.Addr{}, ap("172.30.0.15", 80), quick, errRejected)
		}
	})
	t.Run("unused port of a ClusterIP: rejected", func(t *testing.T) {
		tp.wantTCPError(t, podC, netip.Addr{}, ap("172.30.0.10", 9999), quick, errRejected)
	})
	t.Run("unallocated ServiceCIDR address: dropped", func(t *testing.T) {
		tp.wantTCPError(t, podC, netip.Addr{}, ap("172.30.5.5", 80), slow, errDropped)
	})
	t.Run("LoadBalancer IP", func(t *testing.T) {
		tp.wantTCP(t, client, netip.Addr{}, ap("5.6.7.8", 80), quick, "pod-b")
	})
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		tp.wantTCP(t, client, clientIP, ap("5.6.7.9", 80), quick, "pod-b")
		tp.wantTCPError(t, client, clientIP2, ap("5.6.7.9", 80), slow, errDropped)
	})
	t.Run("external IP", func(t *testing.T) {
		tp.wantTCP(t, client, netip.Addr{}, ap("192.168.99.22", 80), quick, "pod-c")
	})
	t.Run("session affinity", func(t *testing.T) {
		first := ""
		for i := 0; i < 15; i++ {
			r, err := tp.tcp(client, netip.Addr{}, ap("172.30.0.17", 80), quick)
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = r.pod
			} else if r.pod != first {
				t.Fatalf("connection %d went to %s, the first to %s", i, r.pod, first)
			}
		}
	})
	t.Run("hairpin: a pod reaches itself through its Service, masqueraded", func(t *testing.T) {
		r := tp.wantTCP(t, tp.pods["pod-a"].ns, netip.Addr{}, ap("172.30.0.18", 80), quick, "pod-a")
		if r.peer == netip.MustParseAddr("10.180.0.1") {
			t.Fatal("hairpin connection was not masqueraded")
		}
	})
	t.Run("internalTrafficPolicy Local without local endpoints: dropped", func(t *testing.T) {
		tp.wantTCPError(t, podC, netip.Addr{}, ap("172.30.0.21", 80), slow, errDropped)
	})
	t.Run("no NodePorts on localhost", func(t *testing.T) {
		if _, err := tp.tcp("", netip.Addr{}, ap("127.0.0.1", 30080), quick); err == nil {
			t.Fatal("127.0.0.1:30080 answered")
		}
	})
}

func TestTrafficIPv6(t *testing.T) {
	tp, _, _ := trafficSetup(t, model.IPv6)
	client, podC := tp.client, tp.pods["pod-c"].ns
	if r, err := tp.tcp(client, netip.Addr{}, ap("fd00:172:30::10", 80), quick); err != nil || (r.pod != "pod-a" && r.pod != "pod-b") {
		t.Fatalf("ClusterIP TCP: %+v, %v", r, err)
	}
	tp.wantUDP(t, podC, netip.Addr{}, ap("fd00:172:30::11", 53), quick, "pod-a")
	tp.wantTCP(t, client, netip.Addr{}, ap("2001:db8::1", 30080), quick, "pod-b")
	if r, err := tp.tcp(client, clientIPv6, ap("2001:db8::1", 30081), quick); err != nil || r.peer != clientIPv6 {
		t.Fatalf("NodePort Local: %+v, %v", r, err)
	}
	tp.wantTCPError(t, client, netip.Addr{}, ap("2001:db8::1", 30082), slow, errDropped)
	tp.wantTCPError(t, podC, netip.Addr{}, ap("fd00:172:30::15", 80), quick, errRejected)
	tp.wantTCPError(t, podC, netip.Addr{}, ap("fd00:172:30::10", 9999), quick, errRejected)
	tp.wantTCPError(t, podC, netip.Addr{}, ap("fd00:172:30::99", 80), slow, errDropped)
}

// prober connects to a Service over and over, counting failures, until stopped.
type prober struct{ *netnstest.Prober }

func startProber(tp *topology, ns string, tcp, udp netip.AddrPort) *prober {
	var probes []func() error
	if tcp.IsValid() {
		probes = append(probes, func() error { _, err := tp.tcp(ns, netip.Addr{}, tcp, time.Second); return err })
	}
	if udp.IsValid() {
		probes = append(probes, func() error { _, err := tp.udp(ns, netip.Addr{}, udp, time.Second); return err })
	}
	return &prober{netnstest.StartProber(time.Millisecond, probes...)}
}

// finish stops the prober and fails the test if any probe failed.
func (p *prober) finish(t *testing.T) {
	t.Helper()
	ok, failed, lastErr := p.Stop()
	if failed > 0 {
		t.Errorf("%d of %d probes failed (last: %v)", failed, failed+ok, lastErr)
	} else {
		t.Logf("%d probes, none failed", ok)
	}
	if ok == 0 {
		t.Error("no probe ran")
	}
}

func TestPartialSyncKeepsOthersWorking(t *testing.T) {
	tp, b, ns := trafficSetup(t, model.IPv4)
	p := startProber(tp, tp.client, ap("172.30.0.10", 80), ap("172.30.0.11", 53))
	name := "t/nodeport"
	for i := 0; i < 61; i++ {
		eps := []string{"10.180.0.2:80@local"}
		if i%2 == 1 {
			eps = []string{"10.180.0.3:80", "10.180.0.1:80@local"}
		}
		sp := svc("t", "nodeport", "http", model.TCP, "172.30.0.12", 80).NodePort(30080).Endpoints(eps...).Build()
		ns.SetService(sp.Name.NamespacedName, []*model.ServicePort{sp}, nil)
		mustApply(t, b, ns, changed(name))
		if st := b.LastStats(); st.Full || st.Dumps != 0 {
			t.Fatalf("a partial sync read the kernel: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.finish(t)
	// The changed Service works too.
	tp.wantTCP(t, tp.client, netip.Addr{}, ap("192.168.0.2", 30080), quick, "pod-b")
}

func TestDriftIsRepaired(t *testing.T) {
	tp, b, ns := trafficSetup(t, model.IPv4)
	b.cfg.SyncPeriod = 50 * time.Millisecond
	sp := ns.Services[model.ServicePortName{NamespacedName: nsName("t/cluster"), Port: "http", Protocol: model.TCP}]
	chain := chainNamesFor(sp.Name).cluster

	// Someone deletes our map element and flushes a chain by hand.
	nft(t, "delete", "element", "ip", kubeProxyTable, serviceIPsMap, "{ 172.30.0.10 . tcp . 80 }")
	nft(t, "flush", "chain", "ip", kubeProxyTable, chainNamesFor(ns.Services[model.ServicePortName{NamespacedName: nsName("t/nodeport"), Port: "http", Protocol: model.TCP}].Name).cluster)
	if _, err := tp.tcp(tp.pods["pod-c"].ns, netip.Addr{}, ap("172.30.0.10", 80), quick); err == nil {
		t.Fatal("the Service still works without its map element; the test is broken")
	}
	_ = chain

	// The next sync after syncPeriod (here a partial one, for an unrelated Service)
	// reads the table back and repairs both.
	time.Sleep(60 * time.Millisecond)
	mustApply(t, b, ns, changed("t/none"))
	st := b.LastStats()
	if !st.Full {
		t.Fatalf("no full resync after syncPeriod: %+v", st)
	}
	if st.Operations != 3 {
		t.Errorf("repair planned %d operations, want 3 (element, flush, rule):\n%s", st.Operations, b.lastPlan)
	}
	if r, err := tp.tcp(tp.pods["pod-c"].ns, netip.Addr{}, ap("172.30.0.10", 80), quick); err != nil {
		t.Fatalf("ClusterIP after repair: %+v, %v", r, err)
	}
	tp.wantTCP(t, tp.client, netip.Addr{}, ap("192.168.0.2", 30080), quick, "pod-b")
}

func TestRestartWithoutDisruption(t *testing.T) {
	tp, _, ns := trafficSetup(t, model.IPv4)
	p := startProber(tp, tp.client, ap("172.30.0.10", 80), ap("172.30.0.11", 53))
	time.Sleep(100 * time.Millisecond)
	for i := 0; i < 3; i++ {
		// A new process: new socket, empty model, full sync over the existing table.
		b2 := newTestBackend(t, testConfig(model.IPv4), WithLocalAddresses(hostnet.InterfaceAddrs))
		mustApply(t, b2, ns, model.Changes{Full: true})
		if st := b2.LastStats(); st.Operations != 0 {
			t.Errorf("restart planned %d operations over an up-to-date table:\n%s", st.Operations, b2.lastPlan)
		}
		_ = b2.Close()
		time.Sleep(50 * time.Millisecond)
	}
	p.finish(t)
}

func TestCleanupLeavesNothing(t *testing.T) {
	_, _, _ = trafficSetup(t, model.IPv4)
	b6 := newTestBackend(t, testConfig(model.IPv6))
	mustApply(t, b6, examples(model.IPv6), model.Changes{Full: true})
	for _, f := range model.Families {
		if err := Cleanup(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}
	if out := nft(t, "list", "tables"); strings.Contains(out, kubeProxyTable) {
		t.Fatalf("tables after cleanup:\n%s", out)
	}
	// Cleaning up nothing is fine.
	if err := Cleanup(t.Context(), model.IPv4); err != nil {
		t.Fatal(err)
	}
}

// TestDeletedTableIsRebuilt: someone deletes the table; the next sync finds objects
// missing and the one after rebuilds everything.
func TestDeletedTableIsRebuilt(t *testing.T) {
	tp, b, ns := trafficSetup(t, model.IPv4)
	nft(t, "delete", "table", "ip", kubeProxyTable)
	moveOneEndpoint(ns, nsName("t/cluster"), "10.180.0.3:80")
	res := b.Apply(t.Context(), ns, changed("t/cluster"))
	if res.Err == nil && len(res.Failed) == 0 {
		t.Fatal("a sync on a deleted table succeeded")
	}
	mustApply(t, b, ns, changed())
	if !b.LastStats().Full {
		t.Fatal("the sync after a missing object was not a full one")
	}
	if r, err := tp.tcp(tp.client, netip.Addr{}, ap("172.30.0.10", 80), quick); err != nil || r.pod == "pod-b" {
		t.Fatalf("after the rebuild: %+v, %v", r, err)
	}
}

// TestNodePortsOnEveryAddress: with nodePortAddresses "all", a NodePort answers on any
// local address ("fib daddr type local"), but never on a loopback one.
func TestNodePortsOnEveryAddress(t *testing.T) {
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	netnstestRun(t, "ip", "addr", "add", "192.168.0.3/24", "dev", "vc0")
	cfg := testConfig(model.IPv4)
	cfg.NodePortAddresses = dataplane.NodePortAddresses{MatchAll: true}
	b := newTestBackend(t, cfg)
	mustApply(t, b, nodeState(model.IPv4,
		svc("t", "np", "http", model.TCP, "172.30.0.12", 80).NodePort(30080).Endpoints("10.180.0.1:80@local").Build()),
		model.Changes{Full: true})
	for _, addr := range []string{"192.168.0.2", "192.168.0.3"} {
		if r, err := tp.tcp(tp.client, netip.Addr{}, ap(addr, 30080), quick); err != nil || r.pod != "pod-a" {
			t.Errorf("NodePort on %s: %+v, %v", addr, r, err)
		}
	}
	if _, err := tp.tcp("", netip.Addr{}, ap("127.0.0.1", 30080), quick); err == nil {
		t.Error("the NodePort answers on 127.0.0.1")
	}
}

func netnstestRun(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}
