//go:build kernel

package iptables

// Kernel tests: real iptables programs, real netfilter, real packets. The node is this
// test process's private network namespace (netnstest.Main); pods and an outside client
// are named namespaces behind veth pairs:
//
//	client 192.168.0.10 ──veth── 192.168.0.2  NODE  10.180.1.1 ──veth── 10.180.1.2 pod-a
//	                                                 10.180.2.1 ──veth── 10.180.2.2 pod-b
//
// pod-a's endpoint is on this node ("node-a"); pod-b's is declared on "node-b", so it
// stands for a remote endpoint. Each pod answers TCP and UDP on port 80 with its name and
// the source address it saw, which tells whether the packet was masqueraded.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

const (
	kNodeIP   = "192.168.0.2"
	kClientIP = "192.168.0.10"
	kPodA     = "10.180.1.2"
	kPodB     = "10.180.2.2"
)

// kTopology is one test's namespaces.
type kTopology struct {
	client, podA, podB string
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	return netnstest.MustRun(t, args[0], args[1:]...)
}

// wipeIPTables empties both flavours, so each test starts from a clean node.
func wipeIPTables(t testing.TB) {
	t.Helper()
	for _, prog := range []string{"iptables-legacy", "ip6tables-legacy"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			_ = exec.Command(prog, "-t", table, "-F").Run()
			_ = exec.Command(prog, "-t", table, "-X").Run()
		}
	}
	run(t, "nft", "flush", "ruleset")
}

func newTopology(t testing.TB) *kTopology {
	t.Helper()
	wipeIPTables(t)
	t.Cleanup(func() { wipeIPTables(t) })
	top := &kTopology{client: netnstest.NewNamed(t, "client"), podA: netnstest.NewNamed(t, "poda"), podB: netnstest.NewNamed(t, "podb")}
	netnstest.Veth(t, top.client, "vc", kNodeIP+"/24", kClientIP+"/24")
	netnstest.Veth(t, top.podA, "va", "10.180.1.1/24", kPodA+"/24")
	netnstest.Veth(t, top.podB, "vb", "10.180.2.1/24", kPodB+"/24")
	run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// REJECT answers with ICMP, which the kernel rate-limits per peer; a new peer's first
	// message is suppressed on this kernel, which turns a refusal into a 1 s retransmit.
	run(t, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0")
	// Routes for locally generated traffic to Service IPs: DNAT happens after the first
	// route lookup, which must find something.
	run(t, "ip", "route", "replace", "172.30.0.0/16", "via", kClientIP)
	// LoadBalancer IPs are routable from the node too (through the client, standing for
	// the network): traffic the source ranges refuse is then forwarded, and dropped by
	// KUBE-PROXY-FIREWALL, rather than failing its route lookup.
	run(t, "ip", "route", "replace", "5.6.7.0/24", "via", kClientIP)
	// The client reaches LoadBalancer IPs through the node.
	run(t, "ip", "-n", top.client, "route", "add", "5.6.7.0/24", "via", kNodeIP)
	serve(t, top.podA, "pod-a", 80)
	serve(t, top.podB, "pod-b", 80)
	return top
}

// serve answers TCP and UDP on port in ns with "<name> <source address>".
func serve(t testing.TB, ns, name string, port int) {
	t.Helper()
	answer := func(peer netip.Addr) string { return fmt.Sprintf("%s %s\n", name, peer) }
	netnstest.ServeTCP(t, ns, fmt.Sprintf(":%d", port), answer)
	netnstest.ServeUDP(t, ns, fmt.Sprintf(":%d", port), answer)
}

// dial connects from ns ("" for the node itself) and returns the pod's answer.
func dial(ns, network, addr string, timeout time.Duration) (string, error) {
	c, err := netnstest.Dial(ns, network, netip.Addr{}, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if network == "udp" {
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// expect checks one connection's outcome: a pod's answer ("pod-a 192.168.0.10"),
// "refused" or "timeout".
func expect(t *testing.T, what, ns, network, addr, want string) {
	t.Helper()
	timeout := 2 * time.Second
	if want == "timeout" {
		timeout = 700 * time.Millisecond
	}
	start := time.Now()
	got, err := dial(ns, network, addr, timeout)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ECONNREFUSED):
		got = "refused"
	case isTimeout(err):
		got = "timeout"
	default:
		got = "error: " + err.Error()
	}
	if got != want {
		t.Errorf("%s: %s %s from %q: got %q, want %q", what, network, addr, ns, got, want)
	}
	// A refusal is an answer, not a retransmit (the first SYN retransmit is after 1 s).
	if want == "refused" && time.Since(start) > time.Second {
		t.Errorf("%s: %s %s from %q: refusal took %v", what, network, addr, ns, time.Since(start))
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// expectOneOf accepts any of the answers.
func expectOneOf(t *testing.T, what, ns, network, addr string, want ...string) string {
	t.Helper()
	got, err := dial(ns, network, addr, 2*time.Second)
	if err != nil {
		t.Errorf("%s: %s %s from %q: %v", what, network, addr, ns, err)
		return ""
	}
	for _, w := range want {
		if got == w {
			return got
		}
	}
	t.Errorf("%s: %s %s from %q: got %q, want one of %q", what, network, addr, ns, got, want)
	return got
}

var kNode = model.NodeInfo{Name: fixture.NodeName, IPs: []netip.Addr{netip.MustParseAddr(kNodeIP)}}

func (w *world) kstate() *model.NodeState {
	return model.Compute(w.services, w.slices, kNode, nil, model.Options{Families: []model.IPFamily{model.IPv4}})[model.IPv4]
}

// newKernelBackend is a flavour backend of testConfig(IPv4) on this process's namespace.
func newKernelBackend(t testing.TB, flavour Flavour, opts ...Option) *Backend {
	t.Helper()
	b, err := New(context.Background(), testConfig(model.IPv4), append([]Option{WithFlavour(flavour)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

func kApply(t *testing.T, b *Backend, st *model.NodeState, ch model.Changes) dataplane.Result {
	t.Helper()
	return fixture.MustApply(t, b, st, ch)
}

// kSynced returns a new flavour-f backend that has fully synced kWorld's Services (source
// range 192.168.0.0/24, the client's), and that world.
func kSynced(t *testing.T, f Flavour) (*Backend, *world) {
	t.Helper()
	w := kWorld("192.168.0.0/24")
	b := newKernelBackend(t, f)
	kApply(t, b, w.kstate(), full())
	return b, w
}

var flavours = []Flavour{FlavourLegacy, FlavourNFT}

// eachFlavour runs test as a subtest per iptables flavour, each on a fresh topology.
func eachFlavour(t *testing.T, test func(t *testing.T, f Flavour, top *kTopology)) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) { test(t, f, newTopology(t)) })
	}
}

// kWorld: svc-both (pod-a local, pod-b remote), svc-none (no endpoints, NodePort 30002),
// svc-local (eTP Local NodePort 30003 with pod-a), svc-remote (eTP Local NodePort 30004
// with only pod-b), svc-udp, svc-lb (LoadBalancer 5.6.7.8, source ranges).
func kWorld(sourceRange string) *world {
	w := &world{}
	a := kPodA + ":80@local"
	b := kPodB + ":80"
	w.add(fixture.APIService("ns/both", "p80", model.TCP, "172.30.0.10", 80).NodePort(30001).Endpoints(a, b).Build())
	w.add(fixture.APIService("ns/none", "p80", model.TCP, "172.30.0.11", 80).NodePort(30002).Build())
	w.add(fixture.APIService("ns/local", "p80", model.TCP, "172.30.0.12", 80).NodePort(30003).ExternalLocal().Endpoints(a, b).Build())
	w.add(fixture.APIService("ns/remote", "p80", model.TCP, "172.30.0.13", 80).NodePort(30004).ExternalLocal().Endpoints(b).Build())
	w.add(fixture.APIService("ns/udp", "p80", model.UDP, "172.30.0.14", 80).Endpoints(b).Build())
	w.add(fixture.APIService("ns/lb", "p80", model.TCP, "172.30.0.15", 80).NodePort(30005).LoadBalancer("5.6.7.8").SourceRanges(sourceRange).Endpoints(a).Build())
	w.add(fixture.APIService("ns/sticky", "p80", model.TCP, "172.30.0.16", 80).Affinity(60).Endpoints(a, b).Build())
	return w
}

func TestKernelTraffic(t *testing.T) {
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		b, _ := kSynced(t, f)
		c := top.client
		masqA, masqB := "10.180.1.1", "10.180.2.1"

		expectOneOf(t, "ClusterIP TCP from outside (masqueraded)", c, "tcp", "172.30.0.10:80", "pod-a "+masqA, "pod-b "+masqB)
		expectOneOf(t, "ClusterIP TCP from a pod (source kept)", top.podA, "tcp", "172.30.0.10:80", "pod-a "+masqA, "pod-b "+kPodA)
		expectOneOf(t, "ClusterIP TCP from the node", "", "tcp", "172.30.0.10:80", "pod-a "+masqA, "pod-b "+masqB)
		expect(t, "ClusterIP UDP", top.podA, "udp", "172.30.0.14:80", "pod-b "+kPodA)
		expectOneOf(t, "NodePort, Cluster policy", c, "tcp", kNodeIP+":30001", "pod-a "+masqA, "pod-b "+masqB)
		expect(t, "NodePort, Local policy: source kept", c, "tcp", kNodeIP+":30003", "pod-a "+kClientIP)
		expect(t, "no endpoints: ClusterIP refused", c, "tcp", "172.30.0.11:80", "refused")
		expect(t, "no endpoints: NodePort refused", c, "tcp", kNodeIP+":30002", "refused")
		expect(t, "Local policy without local endpoints: dropped", c, "tcp", kNodeIP+":30004", "timeout")
		expect(t, "LoadBalancer IP from an allowed source", c, "tcp", "5.6.7.8:80", "pod-a "+masqA)

		// Affinity: every connection of one client goes to the same endpoint.
		first := expectOneOf(t, "affinity", c, "tcp", "172.30.0.16:80", "pod-a "+masqA, "pod-b "+masqB)
		for i := 0; i < 8; i++ {
			expect(t, "affinity again", c, "tcp", "172.30.0.16:80", first)
		}

		// Source ranges: the client's range removed.
		w := kWorld("203.0.113.0/24")
		res := kApply(t, b, w.kstate(), changed("ns/lb"))
		if res.Full {
			t.Errorf("source range change was a full sync")
		}
		expect(t, "LoadBalancer IP from a source outside the ranges", c, "tcp", "5.6.7.8:80", "timeout")
		expectOneOf(t, "other Service still works after a partial sync", c, "tcp", "172.30.0.10:80", "pod-a "+masqA, "pod-b "+masqB)
	})
}

// probe connects to addr from ns every few milliseconds until stopped and counts failures.
type probe struct{ *netnstest.Prober }

func startProbe(ns, addr string) *probe {
	return &probe{netnstest.StartProber(2*time.Millisecond, func() error {
		_, err := dial(ns, "tcp", addr, time.Second)
		return err
	})}
}

func (p *probe) finish(t *testing.T, what string) {
	t.Helper()
	ok, failed, lastErr := p.Stop()
	if failed > 0 {
		t.Errorf("%s: %d of %d connections failed (last: %v)", what, failed, failed+ok, lastErr)
	}
	if ok < 3 {
		t.Errorf("%s: only %d connections made", what, ok)
	}
	t.Logf("%s: %d connections, none failed", what, ok)
}

func TestKernelNoGap(t *testing.T) {
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		// What kube-proxy (or a previous sluice) left: the same layout, plus a
		// chain of a Service deleted since.
		_, w := kSynced(t, f)
		run(t, "iptables-"+string(f), "-t", "nat", "-N", "KUBE-SVC-GONEGONEGONEGONE")
		run(t, "iptables-"+string(f), "-t", "nat", "-I", "KUBE-SERVICES", "1", "-d", "172.30.9.9/32", "-p", "tcp", "--dport", "80", "-j", "KUBE-SVC-GONEGONEGONEGONE")

		p := startProbe(top.client, "172.30.0.10:80")
		time.Sleep(50 * time.Millisecond)
		b := newKernelBackend(t, f)
		kApply(t, b, w.kstate(), full())
		// A partial sync of another Service during traffic.
		w.set(fixture.APIService("ns/udp", "p80", model.UDP, "172.30.0.14", 80).Endpoints(kPodA + ":80@local").Build())
		if res := kApply(t, b, w.kstate(), changed("ns/udp")); res.Full {
			t.Errorf("second sync was full")
		}
		time.Sleep(50 * time.Millisecond)
		p.finish(t, "ClusterIP during restart and partial sync")

		out := run(t, "iptables-"+string(f)+"-save", "-t", "nat")
		if strings.Contains(out, "GONEGONE") {
			t.Errorf("upstream's stale chain survived")
		}
		// Jumps were not duplicated.
		if n := strings.Count(out, "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"); n != 1 {
			t.Errorf("%d PREROUTING jumps, want 1:\n%s", n, out)
		}
	})
}

func TestKernelFlushIsRepaired(t *testing.T) {
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		b, w := kSynced(t, f)
		expect(t, "before", top.client, "tcp", kNodeIP+":30003", "pod-a "+kClientIP)
		// A firewall reload.
		for _, table := range []string{"filter", "nat", "mangle"} {
			run(t, "iptables-"+string(f), "-t", table, "-F")
			run(t, "iptables-"+string(f), "-t", table, "-X")
		}
		// Without rules the node itself answers on the NodePort: nothing listens there.
		expect(t, "after the flush", top.client, "tcp", kNodeIP+":30003", "refused")
		res := kApply(t, b, w.kstate(), changed())
		if !res.Full {
			t.Errorf("sync after a flush was not full")
		}
		expect(t, "repaired", top.client, "tcp", kNodeIP+":30003", "pod-a "+kClientIP)
	})
}

func TestKernelFailingServiceIsIsolated(t *testing.T) {
	bad := types.NamespacedName{Namespace: "ns", Name: "local"}
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		w := kWorld("192.168.0.0/24")
		b := newKernelBackend(t, f, withFaultyServices(bad))
		res := b.Apply(context.Background(), w.kstate(), full())
		if res.Err != nil {
			t.Fatalf("Apply: %v", res.Err)
		}
		if len(res.Failed) != 1 || res.Failed[bad] == nil {
			t.Fatalf("Failed = %v, want %v", res.Failed, bad)
		}
		t.Logf("kernel refused %v: %v (%d restores)", bad, res.Failed[bad], b.LastStats().Restores)
		expect(t, "failed Service is not programmed", top.client, "tcp", kNodeIP+":30003", "refused")
		expect(t, "others work", top.client, "udp", "172.30.0.14:80", "pod-b 10.180.2.1")
		expectOneOf(t, "others work", top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1", "pod-b 10.180.2.1")

		// Retried on the next sync (the loop marks it changed): still isolated,
		// partial, and a change elsewhere goes through.
		w.set(fixture.APIService("ns/none", "p80", model.TCP, "172.30.0.11", 80).NodePort(30002).Endpoints(kPodB + ":80").Build())
		res = b.Apply(context.Background(), w.kstate(), changed("ns/local", "ns/none"))
		if res.Err != nil || res.Full || len(res.Failed) != 1 {
			t.Fatalf("retry: err=%v full=%v failed=%v", res.Err, res.Full, res.Failed)
		}
		expect(t, "change next to a failing Service", top.client, "tcp", "172.30.0.11:80", "pod-b 10.180.2.1")
	})
}

func TestKernelCleanupLeavesNothing(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			newTopology(t)
			b := newKernelBackend(t, f)
			// Every Service counted: the packet counters' chains and jumps in mangle go too.
			kApply(t, b, countertest.Counted(kWorld("192.168.0.0/24").kstate()), full())
			if !mangleHolds(t, f, model.IPv4) {
				t.Fatal("no packet counters in mangle before Cleanup")
			}
			if err := Cleanup(context.Background(), model.IPv4); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			out := run(t, "iptables-"+string(f)+"-save")
			for _, l := range strings.Split(out, "\n") {
				if (strings.Contains(l, "KUBE-") || strings.Contains(l, "SLUICE-")) && !strings.Contains(l, "KUBE-FIREWALL") {
					t.Errorf("left after Cleanup: %s", l)
				}
			}
			if !strings.Contains(out, ":KUBE-FIREWALL") {
				t.Errorf("kubelet's KUBE-FIREWALL was removed")
			}
		})
	}
}

// ipv6Pod wipes the tables and builds an IPv6 pod, fd00:10::2 ("pod6", serving port 80)
// behind a veth from the node's fd00:10::1, with the ClusterIP range fd00:172:30::/112
// routed to it.
func ipv6Pod(t *testing.T) string {
	t.Helper()
	wipeIPTables(t)
	t.Cleanup(func() { wipeIPTables(t) })
	pod := netnstest.NewNamed(t, "pod6")
	netnstest.Veth(t, pod, "v6", "fd00:10::1/64", "fd00:10::2/64")
	run(t, "ip", "-6", "route", "replace", "fd00:172:30::/112", "dev", "v6")
	run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	serve(t, pod, "pod6", 80)
	return pod
}

func TestKernelIPv6(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			pod := ipv6Pod(t)
			run(t, "sysctl", "-qw", "net.ipv6.icmp.ratelimit=0")

			w := &world{}
			w.add(fixture.APIService("ns/v6", "p80", model.TCP, "fd00:172:30::10", 80).Endpoints("[fd00:10::2]:80@local").Build())
			w.add(fixture.APIService("ns/v6none", "p80", model.TCP, "fd00:172:30::11", 80).Build())
			cfg := testConfig(model.IPv6)
			b, err := New(context.Background(), cfg, WithFlavour(f))
			if err != nil {
				t.Fatal(err)
			}
			node := model.NodeInfo{Name: fixture.NodeName, IPs: []netip.Addr{netip.MustParseAddr("fd00:10::1")}}
			st := model.Compute(w.services, w.slices, node, nil, model.Options{Families: []model.IPFamily{model.IPv6}})[model.IPv6]
			kApply(t, b, st, full())
			expect(t, "IPv6 ClusterIP, hairpin", pod, "tcp", "[fd00:172:30::10]:80", "pod6 fd00:10::1")
			// Refused at once: a TCP reset (an ICMPv6 error would count only at the
			// SYN's retransmit; see TestKernelNoEndpointsRefusedAtOnce).
			expect(t, "IPv6 no endpoints", pod, "tcp", "[fd00:172:30::11]:80", "refused")
		})
	}
}

// TestKernelNoEndpointsRefusedAtOnce: a TCP connection to a Service port without
// endpoints is refused with a reset, at once, in both families and from another host as
// from the node itself; UDP keeps the ICMP port unreachable (ECONNREFUSED on a connected
// socket). Upstream's ICMPv6 answer to TCP leaves IPv6 clients waiting for a retransmit.
// Both families' backends run, with an IPv4, an IPv6 and a RequireDualStack Service.
func TestKernelNoEndpointsRefusedAtOnce(t *testing.T) {
	const nodeIPv6, clientIPv6 = "2001:db8::1", "2001:db8::10"
	families := []model.IPFamily{model.IPv4, model.IPv6}
	eachFlavour(t, func(t *testing.T, f Flavour, top *kTopology) {
		run(t, "ip", "-6", "addr", "add", nodeIPv6+"/64", "dev", "vc", "nodad")
		run(t, "ip", "-n", top.client, "-6", "addr", "add", clientIPv6+"/64", "dev", "eth0", "nodad")
		run(t, "ip", "-n", top.client, "-6", "route", "add", "default", "via", nodeIPv6)
		run(t, "ip", "-6", "route", "replace", "fd00:172:30::/112", "via", clientIPv6)
		run(t, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")

		w := &world{}
		w.add(fixture.APIService("ns/v4", "p80", model.TCP, "172.30.0.40", 80).NodePort(30040).Build())
		w.add(fixture.APIService("ns/v4udp", "p80", model.UDP, "172.30.0.41", 53).NodePort(30041).Build())
		w.add(fixture.APIService("ns/v6", "p80", model.TCP, "fd00:172:30::40", 80).NodePort(30042).Build())
		w.add(fixture.APIService("ns/v6udp", "p80", model.UDP, "fd00:172:30::41", 53).NodePort(30043).Build())
		w.add(fixture.APIService("ns/dual", "p80", model.TCP, "172.30.0.42", 80).NodePort(30044).DualStack("fd00:172:30::42").Build())
		node := model.NodeInfo{Name: fixture.NodeName, IPs: []netip.Addr{netip.MustParseAddr(kNodeIP), netip.MustParseAddr(nodeIPv6)}}
		states := model.Compute(w.services, w.slices, node, nil, model.Options{Families: families})
		for _, fam := range families {
			b, err := New(context.Background(), testConfig(fam), WithFlavour(f))
			if err != nil {
				t.Fatal(err)
			}
			kApply(t, b, states[fam], full())
		}

		for _, tc := range []struct{ what, network, addr string }{
			{"IPv4 ClusterIP", "tcp", "172.30.0.40:80"},
			{"IPv4 NodePort", "tcp", kNodeIP + ":30040"},
			{"IPv4 UDP ClusterIP", "udp", "172.30.0.41:53"},
			{"IPv4 UDP NodePort", "udp", kNodeIP + ":30041"},
			{"IPv6 ClusterIP", "tcp", "[fd00:172:30::40]:80"},
			{"IPv6 NodePort", "tcp", "[" + nodeIPv6 + "]:30042"},
			{"IPv6 UDP ClusterIP", "udp", "[fd00:172:30::41]:53"},
			{"IPv6 UDP NodePort", "udp", "[" + nodeIPv6 + "]:30043"},
			{"dual-stack ClusterIP, IPv4", "tcp", "172.30.0.42:80"},
			{"dual-stack ClusterIP, IPv6", "tcp", "[fd00:172:30::42]:80"},
			{"dual-stack NodePort, IPv4", "tcp", kNodeIP + ":30044"},
			{"dual-stack NodePort, IPv6", "tcp", "[" + nodeIPv6 + "]:30044"},
		} {
			expect(t, tc.what+" from another host", top.client, tc.network, tc.addr, "refused")
			if tc.network == "tcp" {
				// An ICMP error would reach the node's own socket while connect()
				// holds it, and count for nothing until the retransmit.
				expect(t, tc.what+" from the node", "", tc.network, tc.addr, "refused")
			}
		}
	})
}

// TestKernelRemovesOtherModesLeftovers switches a node from every other mode at once:
// upstream's nftables table, the ipvs mode's device and chains, and kube-proxy rules in the
// other iptables flavour all go, once sluice's rules are in place.
func TestKernelRemovesOtherModesLeftovers(t *testing.T) {
	top := newTopology(t)
	run(t, "nft", "add table ip kube-proxy")
	run(t, "nft", "add chain ip kube-proxy services")
	// This kernel has no dummy devices; the leftover is recognised by its name.
	run(t, "ip", "link", "add", "kube-ipvs0", "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "kube-ipvs0").Run() })
	run(t, "iptables-nft", "-t", "filter", "-N", "KUBE-IPVS-FILTER")
	run(t, "iptables-nft", "-t", "filter", "-I", "INPUT", "-j", "KUBE-IPVS-FILTER")
	run(t, "iptables-legacy", "-t", "nat", "-N", "KUBE-SVC-LEGACYLEFTOVER1")
	run(t, "iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES")
	run(t, "iptables-legacy", "-t", "nat", "-I", "PREROUTING", "-j", "KUBE-SERVICES")
	// sluice's packet counters, left in the other flavour.
	run(t, "iptables-legacy", "-t", "mangle", "-N", "SLUICE-SERVICE-PACKETS")
	run(t, "iptables-legacy", "-t", "mangle", "-N", "SLUICE-PKTC-LEGACYLEFTOVER1")
	run(t, "iptables-legacy", "-t", "mangle", "-A", "SLUICE-SERVICE-PACKETS", "-j", "SLUICE-PKTC-LEGACYLEFTOVER1")
	run(t, "iptables-legacy", "-t", "mangle", "-I", "PREROUTING", "-j", "SLUICE-SERVICE-PACKETS")
	// and its new-connection counters, which a path chain jumps to.
	run(t, "iptables-legacy", "-t", "nat", "-N", "SLUICE-NEWC-LEGACYLEFTOVER1")
	run(t, "iptables-legacy", "-t", "nat", "-A", "SLUICE-NEWC-LEGACYLEFTOVER1", "-m", "comment", "--comment", "ns/x:p traffic counter")
	run(t, "iptables-legacy", "-t", "nat", "-A", "KUBE-SVC-LEGACYLEFTOVER1", "-j", "SLUICE-NEWC-LEGACYLEFTOVER1")

	b := newKernelBackend(t, FlavourNFT)
	if out := run(t, "nft", "list", "tables"); !strings.Contains(out, "kube-proxy") {
		t.Fatalf("the nftables table went before sluice's rules were in place")
	}
	kApply(t, b, kWorld("192.168.0.0/24").kstate(), full())
	if out := run(t, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") {
		t.Errorf("nftables table kube-proxy left:\n%s", out)
	}
	if err := exec.Command("ip", "link", "show", "kube-ipvs0").Run(); err == nil {
		t.Errorf("kube-ipvs0 left")
	}
	if out := run(t, "iptables-nft-save", "-t", "filter"); strings.Contains(out, "KUBE-IPVS-FILTER") {
		t.Errorf("ipvs chain left:\n%s", out)
	}
	if out := run(t, "iptables-legacy-save", "-t", "nat"); strings.Contains(out, "KUBE-") || strings.Contains(out, "SLUICE-") {
		t.Errorf("kube-proxy rules left in the legacy flavour:\n%s", out)
	}
	if mangleHolds(t, FlavourLegacy, model.IPv4) {
		t.Errorf("packet counters left in the legacy flavour:\n%s", run(t, "iptables-legacy-save", "-t", "mangle"))
	}
	expectOneOf(t, "traffic after the cleanup", top.client, "tcp", "172.30.0.10:80", "pod-a 10.180.1.1", "pod-b 10.180.2.1")
}
