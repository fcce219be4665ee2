//go:build kernel

// Kernel tests of the backend with real packets. They need IPVS and dummy interfaces, so they
// run in the test VM (hack/ipvs-vm.sh); on a kernel without IPVS they skip, except
// TestKernelNewFailsWithoutIPVS, which runs only there.
//
// The test binary runs in a network namespace of its own (TestMain, netnstest.Main): that
// namespace is the node the backend programs. Each test adds namespaces around it and
// removes everything it programmed (with Cleanup) when it ends:
//
//	client namespace  192.168.0.10/24 and .11/24, default route via the node
//	node (this one)   192.168.0.2/24 towards the client (the node IP); 10.180.N.1/24 towards pod N
//	pod N namespace   10.180.N.2/24, default route via the node; TCP :8080 and UDP :5353 answer
//	                  "podN <source address>" to every line or datagram
//	Services          ClusterIPs 172.30.x.y, external and LoadBalancer IPs 192.168.99.x
//
// The addresses are the shared fixture's plan (pkg/dataplane/internal/fixture), laid out as
// the nftables kernel tests lay theirs.
//
// Pod 1 counts as this node's (Local) endpoint, pod 2 as another node's.
package ipvs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/netnstest"
	"github.com/sluiceproxy/sluice/test/require"
	"github.com/sluiceproxy/sluice/test/vm"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

var (
	kNodeIP   = fixture.NodeIPv4
	kClient   = fixture.ClientIPv4
	kClient2  = fixture.ClientIPv4b
	topoCount atomic.Int32
)

// requireKernelIPVS skips without IPVS, except in the VM, where that is a broken VM.
func requireKernelIPVS(t *testing.T) {
	t.Helper()
	ok, err := KernelSupportsIPVS()
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		return
	}
	if vm.InGuest() {
		t.Fatal("the test VM's kernel has no IPVS")
	}
	require.Feature(t, require.IPVS, false, "kernel has no IPVS; run via hack/ipvs-vm.sh")
}

// topology is a client and pods around this namespace, the node.
type topology struct {
	client string
	pods   []string
	podIPs []netip.Addr
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	return netnstest.MustRun(t, name, args...)
}

func newTopology(t *testing.T, pods int) *topology {
	t.Helper()
	requireKernelIPVS(t)
	n := topoCount.Add(1)
	tp := &topology{client: netnstest.NewNamed(t, "client")}
	clientLink := fmt.Sprintf("vc%d", n)
	netnstest.Veth(t, tp.client, clientLink, kNodeIP.String()+"/24", kClient.String()+"/24", kClient2.String()+"/24")
	for i := 1; i <= pods; i++ {
		ns := netnstest.NewNamed(t, fmt.Sprintf("pod%d", i))
		link := fmt.Sprintf("vp%d_%d", n, i)
		podIP := netip.MustParseAddr(fmt.Sprintf("10.180.%d.2", i))
		netnstest.Veth(t, ns, link, fmt.Sprintf("10.180.%d.1/24", i), podIP.String()+"/24")
		tp.pods = append(tp.pods, ns)
		tp.podIPs = append(tp.podIPs, podIP)
		servePod(t, ns, fmt.Sprintf("pod%d", i))
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, f := range model.Families {
			if err := Cleanup(ctx, f); err != nil {
				t.Errorf("Cleanup %s: %v", f, err)
			}
		}
		_ = exec.Command("conntrack", "-F").Run()
	})
	return tp
}

// servePod answers on TCP :8080 and UDP :5353 in the namespace with "name <peer address>".
func servePod(t *testing.T, ns, name string) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	if err := netnstest.Do(ns, func() error {
		var err error
		if ln, err = net.Listen("tcp", ":8080"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ":5353")
		return err
	}); err != nil {
		t.Fatalf("serving in %s: %v", ns, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); _ = pc.Close(); wg.Wait() })
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, host); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(from.String())
			_, _ = pc.WriteTo([]byte(name+" "+host), from)
		}
	}()
}

// dial opens a TCP connection from the namespace (from src when valid).
func dial(ns string, src netip.Addr, to string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netnstest.Do(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		var err error
		c, err = d.Dial("tcp", to)
		return err
	})
	return c, err
}

// ask sends one line over c and returns the answer ("pod1 192.168.0.10").
func ask(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", err
	}
	l, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(l), err
}

// fetch connects, asks once and closes.
func fetch(ns string, src netip.Addr, to string) (string, error) {
	c, err := dial(ns, src, to, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return ask(c)
}

func mustFetch(t *testing.T, ns, to string) string {
	t.Helper()
	got, err := fetch(ns, netip.Addr{}, to)
	if err != nil {
		t.Fatalf("connecting from %s to %s: %v", ns, to, err)
	}
	return got
}

// expectBlocked checks that a connection attempt fails; refused tells a refusal (RST or
// ICMP) from silence.
func expectBlocked(t *testing.T, ns string, src netip.Addr, to string, refused bool) {
	t.Helper()
	got, err := fetch(ns, src, to)
	if err == nil {
		t.Fatalf("%s reached %s (answer %q), want it blocked", ns, to, got)
	}
	isRefused := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH)
	if isRefused != refused {
		t.Fatalf("%s to %s: %v; want refused=%v", ns, to, err, refused)
	}
}

// refusal connects (TCP) or sends a datagram and reads (UDP) from ns to to, and returns
// how long it took and the error.
func refusal(ns, network, to string) (time.Duration, error) {
	start := time.Now()
	err := netnstest.Do(ns, func() error {
		c, err := (&net.Dialer{Timeout: 3 * time.Second}).Dial(network, to)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if network == "udp" {
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
		}
		_, err = c.Read(make([]byte, 64))
		return err
	})
	return time.Since(start), err
}

// expectRefusedAtOnce requires ECONNREFUSED within a second: a TCP reset or an ICMP port
// unreachable on a connected UDP socket, not a retransmit (the first SYN retransmit
// comes after 1 s).
func expectRefusedAtOnce(t *testing.T, ns, network, to string) {
	t.Helper()
	took, err := refusal(ns, network, to)
	if !errors.Is(err, syscall.ECONNREFUSED) || took > time.Second {
		t.Errorf("%s %s from %s: %v after %v, want connection refused within 1s", network, to, ns, err, took.Round(time.Millisecond))
	}
}

func udpAsk(ns, to string) (string, error) {
	var c net.Conn
	if err := netnstest.Do(ns, func() error {
		var err error
		c, err = net.Dial("udp", to)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 200)
	for range 3 {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("hello")); err != nil {
			return "", err
		}
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", to)
}

func kernelConfig() dataplane.Config {
	return dataplane.Config{
		Family: model.IPv4, NodeName: nodeName, MasqueradeBit: 14,
		NodePortAddresses: dataplane.NodePortAddresses{MatchAll: true},
		LocalDetector:     dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{fixture.ClusterCIDRv4}},
		SyncPeriod:        time.Hour,
	}
}

func newKernelBackend(t *testing.T, settings Settings) *Backend {
	t.Helper()
	ctx := klog.NewContext(context.Background(), klog.Background())
	b, err := New(ctx, kernelConfig(), settings)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// kernelState is an IPv4 NodeState of this node.
func kernelState(ports ...*model.ServicePort) *model.NodeState {
	s := stateOf(ports...)
	s.Node = model.NodeInfo{Name: nodeName, IPs: []netip.Addr{kNodeIP}}
	return s
}

// pod1 is this node's endpoint, pod2 another node's (as far as the model is concerned), written
// as fixture.Port.Endpoints takes them.
const (
	pod1 = "10.180.1.2:8080@local"
	pod2 = "10.180.2.2:8080"
)

func kernelApply(t *testing.T, b *Backend, state *model.NodeState, ch model.Changes) {
	t.Helper()
	res := b.Apply(context.Background(), state, ch)
	if res.Err != nil || len(res.Failed) > 0 {
		t.Fatalf("Apply: %v %v", res.Err, res.Failed)
	}
}

func answeredBy(reply string) string { name, _, _ := strings.Cut(reply, " "); return name }
func sourceSeen(reply string) string { _, src, _ := strings.Cut(reply, " "); return src }

func TestKernelClusterIPReachesEndpoints(t *testing.T) {
	tp := newTopology(t, 2)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(
		fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints(pod1, pod2).Build(),
		fixture.ServicePort("ns/dns", "", model.UDP, "172.30.0.53", 53).Endpoints("10.180.2.2:5353").Build(),
		fixture.ServicePort("ns/self", "", model.TCP, "172.30.0.11", 80).Endpoints(pod1).Build(),
		fixture.ServicePort("ns/empty", "", model.TCP, "172.30.0.12", 80).Build(),
	), model.Changes{Full: true})

	seen := map[string]int{}
	for range 4 {
		reply := mustFetch(t, tp.client, "172.30.0.10:80")
		seen[answeredBy(reply)]++
		if src := sourceSeen(reply); src == kClient.String() {
			t.Errorf("traffic from outside the cluster to a ClusterIP was not masqueraded (pod saw %s)", src)
		}
	}
	if seen["pod1"] != 2 || seen["pod2"] != 2 {
		t.Errorf("answers %v, want round robin over both pods", seen)
	}
	// From a pod to another pod: no masquerade (the source is a pod). To itself it is
	// masqueraded (hairpin), so look at pod2's answers only. (Pod 2 counts as another
	// node's, so it has no hairpin entry and must not be the one asking.)
	for range 2 {
		if reply := mustFetch(t, tp.pods[0], "172.30.0.10:80"); answeredBy(reply) == "pod2" && sourceSeen(reply) != "10.180.1.2" {
			t.Errorf("pod-to-ClusterIP answer %q: the pod's source was rewritten", reply)
		}
	}
	// Hairpin: a pod reaching itself through its Service works (KUBE-LOOP-BACK masquerade).
	if reply := mustFetch(t, tp.pods[0], "172.30.0.11:80"); answeredBy(reply) != "pod1" {
		t.Errorf("hairpin answer %q", reply)
	}
	if reply, err := udpAsk(tp.client, "172.30.0.53:53"); err != nil || answeredBy(reply) != "pod2" {
		t.Errorf("UDP ClusterIP: %q, %v", reply, err)
	}
	// Other ports of a Service address are refused, not answered by the node
	// (KUBE-IPVS-FILTER): TCP with a reset, UDP with ICMP port unreachable.
	expectRefusedAtOnce(t, tp.client, "tcp", "172.30.0.10:22")
	expectRefusedAtOnce(t, tp.client, "udp", "172.30.0.10:22")
	// A Service without endpoints: TCP is refused with a reset by KUBE-IPVS-FILTER before
	// IPVS sees the SYN (KUBE-SLUICE-NO-ENDPOINTS-TCP).
	expectRefusedAtOnce(t, tp.client, "tcp", "172.30.0.12:80")
}

func TestKernelNodePortLoadBalancerAndExternalIP(t *testing.T) {
	tp := newTopology(t, 2)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(
		fixture.ServicePort("ns/web", "", model.TCP, "172.30.1.10", 80).NodePort(30080).LoadBalancer("192.168.99.10").ExternalIPs("192.168.99.20").Endpoints(pod2).Build(),
	), model.Changes{Full: true})
	for _, to := range []string{"192.168.0.2:30080", "192.168.99.10:80", "192.168.99.20:80"} {
		reply := mustFetch(t, tp.client, to)
		if answeredBy(reply) != "pod2" {
			t.Errorf("%s answered %q", to, reply)
		}
		if sourceSeen(reply) == kClient.String() {
			t.Errorf("%s: externalTrafficPolicy Cluster kept the client's address", to)
		}
	}
}

func TestKernelExternalTrafficPolicyLocal(t *testing.T) {
	tp := newTopology(t, 2)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(
		fixture.ServicePort("ns/local", "", model.TCP, "172.30.2.10", 80).NodePort(30081).LoadBalancer("192.168.99.11").ExternalLocal().Endpoints(pod1, pod2).Build(),
		fixture.ServicePort("ns/nolocal", "", model.TCP, "172.30.2.11", 80).NodePort(30082).LoadBalancer("192.168.99.12").ExternalLocal().Endpoints(pod2).Build(),
	), model.Changes{Full: true})

	// A local endpoint: only it answers, and it sees the client's own address.
	for _, to := range []string{"192.168.0.2:30081", "192.168.99.11:80"} {
		for range 2 {
			reply := mustFetch(t, tp.client, to)
			if answeredBy(reply) != "pod1" || sourceSeen(reply) != kClient.String() {
				t.Errorf("%s answered %q, want pod1 seeing %s", to, reply, kClient)
			}
		}
	}
	// No local endpoint: outside traffic is dropped (like the iptables and nftables modes);
	// pods still get the cluster's endpoints (upstream's fallback).
	for _, to := range []string{"192.168.0.2:30082", "192.168.99.12:80"} {
		expectBlocked(t, tp.client, netip.Addr{}, to, false)
		if reply := mustFetch(t, tp.pods[0], to); answeredBy(reply) != "pod2" {
			t.Errorf("pod to %s answered %q, want pod2", to, reply)
		}
	}
}

func TestKernelSessionAffinity(t *testing.T) {
	tp := newTopology(t, 2)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(fixture.ServicePort("ns/sticky", "", model.TCP, "172.30.3.10", 80).Affinity(60).Endpoints(pod1, pod2).Build()), model.Changes{Full: true})
	first := answeredBy(mustFetch(t, tp.client, "172.30.3.10:80"))
	for range 5 {
		if got := answeredBy(mustFetch(t, tp.client, "172.30.3.10:80")); got != first {
			t.Fatalf("affinity broken: %s then %s", first, got)
		}
	}
	vs := ipvsServiceOf(t, vsKey{model.TCP, netip.MustParseAddr("172.30.3.10"), 80})
	if vs.Flags&flagPersistent == 0 || vs.Timeout != 60 {
		t.Errorf("virtual server flags %#x timeout %d, want persistent 60", vs.Flags, vs.Timeout)
	}
}

func TestKernelSchedulerAnnotation(t *testing.T) {
	newTopology(t, 1)
	b := newKernelBackend(t, Settings{Scheduler: "wrr"})
	kernelApply(t, b, kernelState(
		fixture.ServicePort("ns/default", "", model.TCP, "172.30.4.10", 80).Endpoints(pod1).Build(),
		fixture.ServicePort("ns/mh", "", model.TCP, "172.30.4.11", 80).Scheduler("mh").Endpoints(pod1).Build(),
		fixture.ServicePort("ns/sh", "", model.TCP, "172.30.4.12", 80).Scheduler("sh").Endpoints(pod1).Build(),
	), model.Changes{Full: true})
	for ip, want := range map[string]struct {
		sched string
		flags uint32
	}{"172.30.4.10": {"wrr", 0}, "172.30.4.11": {"mh", flagSched2}, "172.30.4.12": {"sh", 0}} {
		vs := ipvsServiceOf(t, vsKey{model.TCP, netip.MustParseAddr(ip), 80})
		if vs.SchedName != want.sched || vs.Flags&^flagHashed != want.flags {
			t.Errorf("%s: scheduler %s flags %#x, want %s %#x", ip, vs.SchedName, vs.Flags&^flagHashed, want.sched, want.flags)
		}
	}
}

func TestKernelLoadBalancerSourceRanges(t *testing.T) {
	tp := newTopology(t, 1)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(
		fixture.ServicePort("ns/fw", "", model.TCP, "172.30.5.10", 80).LoadBalancer("192.168.99.30").SourceRanges(kClient.String()+"/32").Endpoints(pod1).Build(),
	), model.Changes{Full: true})
	if _, err := fetch(tp.client, kClient, "192.168.99.30:80"); err != nil {
		t.Errorf("allowed source: %v", err)
	}
	expectBlocked(t, tp.client, kClient2, "192.168.99.30:80", false)
}

func TestKernelGracefulTermination(t *testing.T) {
	tp := newTopology(t, 2)
	b := newKernelBackend(t, Settings{})
	key := vsKey{model.TCP, netip.MustParseAddr("172.30.6.10"), 80}
	both := kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.6.10", 80).Endpoints(pod1, pod2).Build(), fixture.ServicePort("ns/dns", "", model.UDP, "172.30.6.53", 53).Endpoints("10.180.1.2:5353@local", "10.180.2.2:5353").Build())
	kernelApply(t, b, both, model.Changes{Full: true})

	// An established connection, and which pod it reached.
	conn, err := dial(tp.client, netip.Addr{}, "172.30.6.10:80", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reply, err := ask(conn)
	if err != nil {
		t.Fatal(err)
	}
	gone, stays := pod1, pod2
	if answeredBy(reply) == "pod2" {
		gone, stays = pod2, pod1
	}

	// That endpoint goes away: its real server stays, at weight 0.
	kernelApply(t, b, kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.6.10", 80).Endpoints(stays).Build(), fixture.ServicePort("ns/dns", "", model.UDP, "172.30.6.53", 53).Endpoints("10.180.2.2:5353").Build()), changed("ns/web", "ns/dns"))
	if rs := realServerOf(t, key, gone); rs == nil || rs.Weight != 0 {
		t.Fatalf("removed endpoint's real server = %+v, want it draining at weight 0", rs)
	}
	if rs := realServerOf(t, vsKey{model.UDP, netip.MustParseAddr("172.30.6.53"), 53}, "10.180.1.2:5353"); rs != nil {
		t.Errorf("UDP real server kept after its endpoint went; UDP real servers go at once")
	}
	// The old connection keeps working; new ones go to the endpoint that stays.
	for range 3 {
		if r, err := ask(conn); err != nil || r != reply {
			t.Fatalf("established connection after its endpoint went: %q, %v (want %q)", r, err, reply)
		}
	}
	endpointOf := map[string]string{"pod1": pod1, "pod2": pod2}
	for range 3 {
		if got := mustFetch(t, tp.client, "172.30.6.10:80"); endpointOf[answeredBy(got)] != stays {
			t.Fatalf("new connection answered %q, want the remaining endpoint %s", got, stays)
		}
	}
	// The connection ends (reset: IPVS forgets a reset connection after 10 s, one closed
	// with FIN only after TIME_WAIT's 2 minutes); a sync after that deletes the real server.
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.Close()
	deadline := time.Now().Add(40 * time.Second)
	for {
		kernelApply(t, b, kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.6.10", 80).Endpoints(stays).Build(), fixture.ServicePort("ns/dns", "", model.UDP, "172.30.6.53", 53).Endpoints("10.180.2.2:5353").Build()), changed())
		if realServerOf(t, key, gone) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drained real server %s still there: %+v", gone, realServerOf(t, key, gone))
		}
		time.Sleep(time.Second)
	}
}

func TestKernelFullSyncRepairsDrift(t *testing.T) {
	tp := newTopology(t, 1)
	b := newKernelBackend(t, Settings{})
	state := kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.7.10", 80).NodePort(30090).Endpoints(pod1).Build(), fixture.ServicePort("ns/lb", "", model.TCP, "172.30.7.11", 80).LoadBalancer("192.168.99.40").Endpoints(pod1).Build())
	kernelApply(t, b, state, model.Changes{Full: true})

	h, err := mobyipvs.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.DelService(toMobyService(vsKey{model.TCP, netip.MustParseAddr("172.30.7.10"), 80}, vsParams{})); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "addr", "del", "192.168.99.40/32", "dev", dummyDevice)
	run(t, "iptables", "-t", "nat", "-F", chainPostrouting)
	run(t, "ipset", "del", "KUBE-NODE-PORT-TCP", "30090")
	expectBlocked(t, tp.client, netip.Addr{}, "172.30.7.10:80", true)

	before := driftCounts()
	kernelApply(t, b, state, model.Changes{Full: true})
	after := driftCounts()
	for _, kind := range []string{"virtual_server", "address", "element", "rule"} {
		if after[kind] <= before[kind] {
			t.Errorf("sluice_drift_repairs_total{kind=%q} did not grow (%v)", kind, after[kind])
		}
	}
	for _, to := range []string{"172.30.7.10:80", "192.168.99.40:80", "192.168.0.2:30090"} {
		mustFetch(t, tp.client, to)
	}
	if out := run(t, "ipset", "list", "KUBE-NODE-PORT-TCP"); !strings.Contains(out, "30090") {
		t.Errorf("NodePort set not repaired:\n%s", out)
	}
	if out := run(t, "iptables", "-t", "nat", "-S", chainPostrouting); !strings.Contains(out, "MASQUERADE") {
		t.Errorf("KUBE-POSTROUTING not repaired:\n%s", out)
	}
}

func TestKernelRestartWithoutGap(t *testing.T) {
	tp := newTopology(t, 2)
	// The first process finds leftovers of the iptables and nftables modes, and removes them
	// while serving.
	run(t, "nft", "add", "table", "ip", "kube-proxy")
	run(t, "iptables", "-t", "nat", "-N", "KUBE-SVC-LEFTOVER")
	run(t, "iptables", "-t", "nat", "-N", "KUBE-SERVICES")
	run(t, "iptables", "-t", "nat", "-A", "KUBE-SERVICES", "-d", "172.30.8.10/32", "-j", "KUBE-SVC-LEFTOVER")
	run(t, "iptables", "-t", "nat", "-I", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")

	state := kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.8.10", 80).Endpoints(pod1, pod2).Build())
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, state, model.Changes{Full: true})
	if out, _ := exec.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput(); !strings.Contains(string(out), "No such file") {
		t.Errorf("nftables mode's table left: %s", out)
	}
	if out := run(t, "iptables-save", "-t", "nat"); strings.Contains(out, "KUBE-SVC-LEFTOVER") {
		t.Errorf("iptables mode's chain left:\n%s", out)
	}

	// Traffic flows while a second process starts and syncs.
	conn, err := dial(tp.client, netip.Addr{}, "172.30.8.10:80", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := context.WithCancel(context.Background())
	var failures, successes atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if _, err := fetch(tp.client, netip.Addr{}, "172.30.8.10:80"); err != nil {
				failures.Add(1)
			} else {
				successes.Add(1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	b2 := newKernelBackend(t, Settings{})
	kernelApply(t, b2, state, model.Changes{Full: true})
	time.Sleep(200 * time.Millisecond)
	stop()
	<-done
	if failures.Load() > 0 || successes.Load() == 0 {
		t.Errorf("during the restart: %d connections failed, %d succeeded", failures.Load(), successes.Load())
	}
	if _, err := ask(conn); err != nil {
		t.Errorf("a connection established before the restart broke: %v", err)
	}
	if ops := b2.LastStats().Operations; ops["add-vs"]+ops["delete-vs"]+ops["add-rs"]+ops["delete-rs"] > 0 {
		t.Errorf("the restarted backend rebuilt IPVS: %v", ops)
	}
}

func TestKernelCleanupRemovesEverything(t *testing.T) {
	newTopology(t, 1)
	b := newKernelBackend(t, Settings{})
	kernelApply(t, b, kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.9.10", 80).NodePort(30099).LoadBalancer("192.168.99.50").SourceRanges("198.51.100.0/24").Endpoints(pod1).Build()), model.Changes{Full: true})
	for _, f := range model.Families {
		if err := Cleanup(context.Background(), f); err != nil {
			t.Fatalf("Cleanup %s: %v", f, err)
		}
	}
	h, err := mobyipvs.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if svcs, err := h.GetServices(); err != nil || len(svcs) != 0 {
		t.Errorf("virtual servers left: %d (%v)", len(svcs), err)
	}
	if out, err := exec.Command("ip", "link", "show", dummyDevice).CombinedOutput(); err == nil {
		t.Errorf("%s left: %s", dummyDevice, out)
	}
	if out := run(t, "ipset", "list", "-n"); strings.Contains(out, "KUBE-") {
		t.Errorf("ipsets left:\n%s", out)
	}
	for _, table := range []string{"nat", "filter"} {
		if out := run(t, "iptables-save", "-t", table); strings.Contains(out, "KUBE-") {
			t.Errorf("%s rules left:\n%s", table, out)
		}
	}
	// A second run finds nothing and does not fail.
	for _, f := range model.Families {
		if err := Cleanup(context.Background(), f); err != nil {
			t.Errorf("second Cleanup %s: %v", f, err)
		}
	}
}

// TestKernelNewFailsWithoutIPVS runs where the kernel has no IPVS (the CI host): New must
// refuse, naming what is missing, instead of programming nothing.
func TestKernelNewFailsWithoutIPVS(t *testing.T) {
	ok, err := KernelSupportsIPVS()
	if err != nil {
		t.Fatal(err)
	}
	require.Feature(t, require.NoIPVS, !ok, "this kernel has IPVS; the test is for kernels without it")
	_, err = New(context.Background(), kernelConfig(), Settings{})
	if !errors.Is(err, ErrNoIPVS) || !strings.Contains(err.Error(), "use mode nftables") {
		t.Fatalf("New = %v, want the no-IPVS error", err)
	}
	t.Logf("New on a kernel without IPVS: %v", err)
	// Cleanup runs on every host and must not fail here.
	for _, f := range model.Families {
		if err := Cleanup(context.Background(), f); err != nil {
			t.Errorf("Cleanup %s on a kernel without IPVS: %v", f, err)
		}
	}
}

// mobyQuery asks the kernel through a moby IPVS handle of its own (closed before it
// returns), independent of the backend's; what names the query in a failure.
func mobyQuery[T any](t *testing.T, what string, q func(*mobyipvs.Handle) (T, error)) T {
	t.Helper()
	h, err := mobyipvs.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	v, err := q(h)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func ipvsServiceOf(t *testing.T, k vsKey) *mobyipvs.Service {
	t.Helper()
	return mobyQuery(t, "virtual server "+k.String(), func(h *mobyipvs.Handle) (*mobyipvs.Service, error) {
		return h.GetService(toMobyService(k, vsParams{}))
	})
}

func realServerOf(t *testing.T, k vsKey, rs string) *mobyipvs.Destination {
	t.Helper()
	ds := mobyQuery(t, "real servers of "+k.String(), func(h *mobyipvs.Handle) ([]*mobyipvs.Destination, error) {
		return h.GetDestinations(toMobyService(k, vsParams{}))
	})
	want := netip.MustParseAddrPort(rs)
	for _, d := range ds {
		a, _ := netip.AddrFromSlice(d.Address)
		if netip.AddrPortFrom(a.Unmap(), d.Port) == want {
			return d
		}
	}
	return nil
}

// TestKernelIPSetsRoundTrip writes an entry of every set the backend uses, in both families,
// through the netlink seam, and reads them back. It needs only ip_set, so it runs on the CI
// host as well as in the VM.
func TestKernelIPSetsRoundTrip(t *testing.T) {
	sets, err := newNetlinkIPSets()
	if err != nil {
		t.Fatal(err)
	}
	defer sets.close()
	v4 := map[ipsetType]setEntry{
		typeHashIP:        {IP: netip.MustParseAddr("172.30.0.10")},
		typeHashIPPort:    {IP: netip.MustParseAddr("172.30.0.10"), Proto: 17, Port: 53},
		typeHashIPPortIP:  {IP: netip.MustParseAddr("10.180.1.2"), Proto: 6, Port: 8080, IP2: netip.MustParseAddr("10.180.1.2")},
		typeHashIPPortNet: {IP: netip.MustParseAddr("192.168.99.10"), Proto: 132, Port: 80, Net: netip.MustParsePrefix("198.51.100.0/24")},
		typeBitmapPort:    {Port: 30080},
	}
	v6 := map[ipsetType]setEntry{
		typeHashIP:        {IP: netip.MustParseAddr("fd00:172:30::10")},
		typeHashIPPort:    {IP: netip.MustParseAddr("fd00:172:30::10"), Proto: 6, Port: 80},
		typeHashIPPortIP:  {IP: netip.MustParseAddr("fd00:10::2"), Proto: 6, Port: 8080, IP2: netip.MustParseAddr("fd00:10::2")},
		typeHashIPPortNet: {IP: netip.MustParseAddr("2001:db8::10"), Proto: 6, Port: 443, Net: netip.MustParsePrefix("2001:db8:77::/64")},
		typeBitmapPort:    {Port: 32000},
	}
	for family, entries := range map[model.IPFamily]map[ipsetType]setEntry{model.IPv4: v4, model.IPv6: v6} {
		for typ, e := range entries {
			name := fmt.Sprintf("SLUICE-TEST-%d-%s", family, strings.NewReplacer(":", "-", ",", "-").Replace(string(typ)))
			if err := sets.Create(name, typ, family); err != nil {
				require.Feature(t, require.IPSet, !hostnet.IsNotSupported(err), fmt.Sprintf("no ipset in this kernel: %v", err))
				t.Fatalf("create %s: %v", name, err)
			}
			if err := sets.Create(name, typ, family); !errors.Is(err, errExist) {
				t.Errorf("creating %s twice: %v, want errExist", name, err)
			}
			if err := sets.Add(name, typ, e); err != nil {
				t.Fatalf("add %v to %s: %v", e, name, err)
			}
			if err := sets.Add(name, typ, e); !errors.Is(err, errExist) {
				t.Errorf("adding %v twice: %v, want errExist", e, err)
			}
			ks, err := sets.List(name)
			if err != nil {
				t.Fatalf("list %s: %v", name, err)
			}
			if ks.Type != typ || len(ks.Entries) != 1 || !ks.Entries[e] {
				t.Errorf("%s read back as %s %v, want %s {%v}", name, ks.Type, ks.Entries, typ, e)
			}
			if err := sets.Del(name, typ, e); err != nil {
				t.Errorf("del %v: %v", e, err)
			}
			if err := sets.Del(name, typ, e); !errors.Is(err, errNotExist) {
				t.Errorf("deleting %v twice: %v, want errNotExist", e, err)
			}
			if err := sets.Destroy(name); err != nil {
				t.Errorf("destroy %s: %v", name, err)
			}
			if _, err := sets.List(name); !errors.Is(err, errNotExist) {
				t.Errorf("listing destroyed %s: %v, want errNotExist", name, err)
			}
		}
	}
}

// TestKernelIPv6 runs an IPv6 Service through the IPv6 backend: ClusterIP (held by
// kube-ipvs0) and NodePort, from a client outside the cluster.
//
//	client 2001:db8::10/64, node 2001:db8::1/64; pod fd00:10::2/64 behind fd00:10::1
func TestKernelIPv6(t *testing.T) {
	tp := newTopology(t, 1)
	n := topoCount.Load()
	clientLink, podLink := fmt.Sprintf("vc%d", n), fmt.Sprintf("vp%d_1", n)
	run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	run(t, "ip", "-6", "addr", "add", "2001:db8::1/64", "dev", clientLink, "nodad")
	run(t, "ip", "-n", tp.client, "-6", "addr", "add", "2001:db8::10/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", tp.client, "-6", "route", "add", "default", "via", "2001:db8::1")
	run(t, "ip", "-6", "addr", "add", "fd00:10::1/64", "dev", podLink, "nodad")
	run(t, "ip", "-n", tp.pods[0], "-6", "addr", "add", "fd00:10::2/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", tp.pods[0], "-6", "route", "add", "default", "via", "fd00:10::1")

	cfg := kernelConfig()
	cfg.Family = model.IPv6
	cfg.LocalDetector.CIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}
	b, err := New(context.Background(), cfg, Settings{})
	if err != nil {
		t.Fatal(err)
	}
	state := stateOfFamily(model.IPv6,
		fixture.ServicePort("ns/web6", "", model.TCP, "fd00:172:30::10", 80).NodePort(30600).Endpoints("[fd00:10::2]:8080").Build(),
		fixture.ServicePort("ns/none6", "", model.TCP, "fd00:172:30::11", 80).NodePort(30611).Build(),
		fixture.ServicePort("ns/none6udp", "", model.UDP, "fd00:172:30::12", 53).Build())
	state.Node = model.NodeInfo{Name: nodeName, IPs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}
	kernelApply(t, b, state, model.Changes{Full: true})
	for _, to := range []string{"[fd00:172:30::10]:80", "[2001:db8::1]:30600"} {
		if reply := mustFetch(t, tp.client, to); answeredBy(reply) != "pod1" {
			t.Errorf("%s answered %q", to, reply)
		}
	}
	// Other ports of a Service address: TCP refused with a reset at once (an ICMPv6 error
	// counts only at the SYN's retransmit), UDP with ICMPv6 port unreachable.
	expectRefusedAtOnce(t, tp.client, "tcp", "[fd00:172:30::10]:22")
	expectRefusedAtOnce(t, tp.client, "udp", "[fd00:172:30::10]:22")
	// A Service without endpoints: TCP is refused with a reset at once, on its ClusterIP and
	// its NodePort (IPVS's own ICMPv6 port unreachable would count only at the SYN's
	// retransmit, after a second); UDP keeps IPVS's ICMPv6 port unreachable.
	expectRefusedAtOnce(t, tp.client, "tcp", "[fd00:172:30::11]:80")
	expectRefusedAtOnce(t, tp.client, "tcp", "[2001:db8::1]:30611")
	expectRefusedAtOnce(t, tp.client, "udp", "[fd00:172:30::12]:53")
	if out := run(t, "ipset", "list", "-n"); !strings.Contains(out, "KUBE-6-CLUSTER-IP") {
		t.Errorf("IPv6 sets missing:\n%s", out)
	}
}

// TestKernelLegacyFlavour writes the rules with iptables-legacy (the VM's iptables is the nft
// flavour): both must take the ruleset.
func TestKernelLegacyFlavour(t *testing.T) {
	tp := newTopology(t, 1)
	_, err := exec.LookPath("iptables-legacy-restore")
	require.Feature(t, require.IPTablesLegacy, err == nil, "no iptables-legacy")
	b, err := New(context.Background(), kernelConfig(), Settings{}, WithFlavour(FlavourLegacy))
	if err != nil {
		t.Fatal(err)
	}
	if b.Flavour() != FlavourLegacy {
		t.Fatalf("flavour %s", b.Flavour())
	}
	kernelApply(t, b, kernelState(fixture.ServicePort("ns/web", "", model.TCP, "172.30.10.10", 80).NodePort(30110).Endpoints(pod1).Build()), model.Changes{Full: true})
	for _, to := range []string{"172.30.10.10:80", "192.168.0.2:30110"} {
		if reply := mustFetch(t, tp.client, to); sourceSeen(reply) == kClient.String() {
			t.Errorf("%s: not masqueraded with the legacy flavour's rules (%q)", to, reply)
		}
	}
	if out := run(t, "iptables-legacy-save", "-t", "nat"); !strings.Contains(out, "KUBE-SERVICES") {
		t.Errorf("rules not in the legacy tables:\n%s", out)
	}
}

// TestKernelSCTP sends SCTP associations through a ClusterIP and a NodePort (the CI host's
// kernel has no SCTP sockets; the VM's has).
func TestKernelSCTP(t *testing.T) {
	tp := newTopology(t, 2)
	require.Feature(t, require.SCTP, echo.SCTPSupported(), "kernel has no SCTP sockets")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i, ns := range tp.pods {
		var s *echo.Server
		if err := netnstest.Do(ns, func() error {
			var err error
			s, err = echo.Listen(echo.ServerConfig{Pod: fmt.Sprintf("pod%d", i+1), Ports: []uint16{9000}, Protocols: []echo.Protocol{echo.SCTP}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		go func() { _ = s.Serve(ctx) }()
	}
	b := newKernelBackend(t, Settings{})
	sp := fixture.ServicePort("ns/sctp", "", model.SCTP, "172.30.11.10", 80).NodePort(30111).Endpoints("10.180.1.2:9000@local", "10.180.2.2:9000").Build()
	kernelApply(t, b, kernelState(sp), model.Changes{Full: true})
	for _, target := range []string{"172.30.11.10:80", "192.168.0.2:30111"} {
		seen := map[string]int{}
		for range 4 {
			var out echo.Outcome
			if err := netnstest.Do(tp.client, func() error {
				out = echo.Probe(ctx, echo.SCTP, netip.MustParseAddrPort(target), echo.ProbeOptions{Timeout: 3 * time.Second})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if out.Result != echo.Answered {
				t.Fatalf("SCTP to %s: %s", target, out)
			}
			seen[out.Reply.Pod]++
		}
		if seen["pod1"] == 0 || seen["pod2"] == 0 {
			t.Errorf("SCTP to %s answered by %v, want both pods", target, seen)
		}
	}
	if out := run(t, "ipset", "list", "KUBE-NODE-PORT-SCTP-HASH"); !strings.Contains(out, "192.168.0.2,sctp:30111") {
		t.Errorf("SCTP NodePort set:\n%s", out)
	}
}
