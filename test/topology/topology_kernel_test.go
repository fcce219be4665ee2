//go:build kernel

package topology

// Conventions: the test process lives in a private namespace (netnstest.Main), which plays
// the root namespace: the apiserver bridge is created there. Addresses are the package
// defaults (see the package comment); 9999 is a port nothing listens on.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

func mustRun(t *testing.T, h *Host, name string, args ...string) string {
	t.Helper()
	out, err := h.Run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func expect(t *testing.T, what string, out echo.Outcome, want echo.Result) echo.Outcome {
	t.Helper()
	if out.Result != want {
		t.Errorf("%s: %s, want %s", what, out, want)
	}
	return out
}

func TestTopologyCarriesRealPackets(t *testing.T) {
	c := New(t, Options{IPv6: true, ExternalAddresses: 2})
	c.StartEcho(t, EchoOptions{Ports: []uint16{8080}})
	a0, a1, b0 := c.Pod("a0"), c.Pod("a1"), c.Pod("b0")
	nodeA, nodeB := c.Node("node-a"), c.Node("node-b")

	t.Run("pod to pod across nodes, both families, source preserved", func(t *testing.T) {
		for _, fam := range []int{0, 1} {
			for _, proto := range []echo.Protocol{echo.TCP, echo.UDP} {
				target := netip.AddrPortFrom(b0.IPs()[fam], 8080)
				out := expect(t, "a0 -> "+target.String(), a0.Probe(proto, target, echo.ProbeOptions{}), echo.Answered)
				if out.Result == echo.Answered && (out.Reply.Pod != "b0" || out.Reply.Remote.Addr() != a0.IPs()[fam]) {
					t.Errorf("a0 -> %s %s: reply %s, want pod b0 seeing a0's address", proto, target, out.Reply)
				}
			}
		}
	})

	t.Run("pod to pod on the same node", func(t *testing.T) {
		out := expect(t, "a0 -> a1", a0.Probe(echo.TCP, netip.AddrPortFrom(a1.IPv4, 8080), echo.ProbeOptions{}), echo.Answered)
		if out.Reply.Pod != "a1" {
			t.Errorf("reply %s, want a1", out.Reply)
		}
	})

	t.Run("external client reaches a node's underlay address, from each of its addresses", func(t *testing.T) {
		if _, err := nodeA.Start("echo-node-a", EchoServerBinary(t), "serve", "-pod", "node-a", "-ports", "9090", "-protocols", "tcp,udp"); err != nil {
			t.Fatal(err)
		}
		target := netip.AddrPortFrom(nodeA.IPv4, 9090)
		for _, src := range []netip.Addr{c.ExternalIPs[0], c.ExternalIPs[2]} {
			var out echo.Outcome
			err := waitFor(5*time.Second, func() error {
				out = c.External.Probe(echo.TCP, target, echo.ProbeOptions{Source: src})
				if out.Result != echo.Answered {
					return errors.New(out.String())
				}
				return nil
			})
			if err != nil {
				t.Fatalf("external (%s) -> %s: %v", src, target, err)
			}
			if out.Reply.Pod != "node-a" || out.Reply.Remote.Addr() != src {
				t.Errorf("reply %s, want node-a seeing %s", out.Reply, src)
			}
		}
	})

	t.Run("nodes reach the apiserver bridge in the test's namespace", func(t *testing.T) {
		serveAPIEcho(t)
		for _, n := range c.Nodes {
			out := expect(t, n.Name+" -> apiserver", n.Probe(echo.TCP, netip.AddrPortFrom(c.APIAddress(), 16443), echo.ProbeOptions{}), echo.Answered)
			if out.Result == echo.Answered && out.Reply.Remote.Addr() != n.APIAddress {
				t.Errorf("%s -> apiserver: seen as %s, want %s", n.Name, out.Reply.Remote.Addr(), n.APIAddress)
			}
		}
	})

	t.Run("a closed port is refused, a dropped one times out", func(t *testing.T) {
		closed := netip.AddrPortFrom(b0.IPv4, 9999)
		expect(t, "tcp to a closed port", a0.Probe(echo.TCP, closed, echo.ProbeOptions{}), echo.Refused)
		expect(t, "udp to a closed port", a0.Probe(echo.UDP, closed, echo.ProbeOptions{}), echo.Refused)

		mustRun(t, &nodeB.Host, "nft", "add", "table", "inet", "selftest")
		mustRun(t, &nodeB.Host, "nft", "add chain inet selftest dropper { type filter hook forward priority 0 ; }")
		mustRun(t, &nodeB.Host, "nft", "add rule inet selftest dropper ip daddr "+b0.IPv4.String()+" drop")
		defer func() { _, _ = nodeB.Run("nft", "delete", "table", "inet", "selftest") }()
		dropped := netip.AddrPortFrom(b0.IPv4, 8080)
		short := echo.ProbeOptions{Timeout: 500 * time.Millisecond}
		expect(t, "tcp to a dropped destination", a0.Probe(echo.TCP, dropped, short), echo.Timeout)
		expect(t, "udp to a dropped destination", a0.Probe(echo.UDP, dropped, short), echo.Timeout)
	})

	t.Run("a node has a default route, so a ClusterIP-like address is routed, not 'network unreachable'", func(t *testing.T) {
		out := nodeA.Probe(echo.TCP, netip.MustParseAddrPort("10.96.0.1:443"), echo.ProbeOptions{Timeout: 500 * time.Millisecond})
		if errors.Is(out.Err, syscall.ENETUNREACH) {
			t.Errorf("node-a -> 10.96.0.1: %s", out)
		}
		out = a0.Probe(echo.TCP, netip.MustParseAddrPort("10.96.0.1:443"), echo.ProbeOptions{Timeout: 500 * time.Millisecond})
		if errors.Is(out.Err, syscall.ENETUNREACH) {
			t.Errorf("a0 -> 10.96.0.1: %s", out)
		}
	})

	t.Run("the underlay gateway drops what escapes a node silently, in both families", func(t *testing.T) {
		short := echo.ProbeOptions{Timeout: 500 * time.Millisecond}
		for _, target := range []string{"10.96.0.1:443", "[fd00:10:96::1]:443"} {
			for _, proto := range []echo.Protocol{echo.TCP, echo.UDP} {
				// Many tries in a row: a rate-limited ICMP error would show up in some.
				for i := range 4 {
					expect(t, fmt.Sprintf("a0 -> %s %s, try %d", proto, target, i), a0.Probe(proto, netip.MustParseAddrPort(target), short), echo.Timeout)
				}
			}
		}
	})

	t.Run("a router's refusal is refused in both families; a plain IPv6 TCP client learns of it at the SYN retransmission", func(t *testing.T) {
		// node-b rejects what it would forward to b0's port 9997 (ICMP port unreachable,
		// as kube-proxy's REJECT rules do) and answers port 9996 with a TCP RST. An ICMPv6
		// error to a connecting socket without IPV6_RECVERR is a soft error on Linux 6.18:
		// connect fails only when the SYN is sent again, a second later; IPv4 fails at once.
		mustRun(t, &nodeB.Host, "nft", "add", "table", "inet", "refusals")
		mustRun(t, &nodeB.Host, "nft", "add chain inet refusals forwarding { type filter hook forward priority 0 ; }")
		mustRun(t, &nodeB.Host, "nft", "add rule inet refusals forwarding th dport 9997 reject")
		mustRun(t, &nodeB.Host, "nft", "add rule inet refusals forwarding tcp dport 9996 reject with tcp reset")
		defer func() { _, _ = nodeB.Run("nft", "delete", "table", "inet", "refusals") }()
		for _, tc := range []struct {
			proto      echo.Protocol
			addr       netip.Addr
			port       uint16
			retransmit int
		}{
			{echo.TCP, b0.IPv4, 9997, 0},
			{echo.UDP, b0.IPv4, 9997, 0},
			{echo.TCP, b0.IPv4, 9996, 0},
			{echo.TCP, b0.IPv6, 9997, -1}, // kernel-dependent: 1 on Linux 6.18
			{echo.UDP, b0.IPv6, 9997, 0},
			{echo.TCP, b0.IPv6, 9996, 0},
		} {
			target := netip.AddrPortFrom(tc.addr, tc.port)
			out := expect(t, fmt.Sprintf("a0 -> %s %s", tc.proto, target), a0.Probe(tc.proto, target, echo.ProbeOptions{Timeout: 3 * time.Second}), echo.Refused)
			t.Logf("a0 -> %s %s: %s", tc.proto, target, out)
			if tc.retransmit >= 0 && out.SYNRetransmits != tc.retransmit {
				t.Errorf("a0 -> %s %s: refused after %d SYN retransmissions, want %d", tc.proto, target, out.SYNRetransmits, tc.retransmit)
			}
		}
	})

	t.Run("addresses have names by role", func(t *testing.T) {
		for a, want := range map[netip.Addr]string{
			a0.IPv4: "a0", a0.IPv6: "a0", nodeA.IPv4: "node-a/eth0", nodeB.IPv6: "node-b/eth0",
			nodeA.BridgeIPs[0]: "node-a/cbr0", nodeA.BridgeIPs[1]: "node-a/cbr0", nodeA.APIAddress: "node-a/api0",
			c.ExternalIPs[0]: "external", c.ExternalIPs[1]: "external", c.ExternalIPs[2]: "external-2",
			c.APIAddress(): "apiserver", netip.MustParseAddr("192.0.2.1"): "192.0.2.1",
		} {
			if got := c.AddressName(a); got != want {
				t.Errorf("AddressName(%s) = %q, want %q", a, got, want)
			}
		}
	})

	t.Run("a UDP client keeps its source port across sends", func(t *testing.T) {
		u, err := a0.DialUDP(netip.AddrPortFrom(b0.IPv4, 8080), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		for i := range 3 {
			out := u.Send(0)
			if out.Result != echo.Answered || out.Reply.Remote != u.LocalAddr() {
				t.Errorf("send %d: %s, want b0 seeing %s", i, out, u.LocalAddr())
			}
		}
	})

	t.Run("nodes are set up like kube-proxy expects", func(t *testing.T) {
		// Settings go to the nodes, never to the test's own namespace (a fresh one here).
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "0" {
			t.Errorf("the test's own namespace has ip_forward=%q (%v), want it untouched (0)", b, err)
		}
		for _, n := range c.Nodes {
			for _, key := range []string{"net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"} {
				path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
				if got := strings.TrimSpace(mustRun(t, &n.Host, "cat", path)); got != "1" {
					t.Errorf("%s: %s = %s, want 1", n.Name, key, got)
				}
			}
			for j := range n.Pods {
				path := "/sys/class/net/veth" + string(rune('0'+j)) + "/brport/hairpin_mode"
				if got := strings.TrimSpace(mustRun(t, &n.Host, "cat", path)); got != "1" {
					t.Errorf("%s: %s = %s, want 1", n.Name, path, got)
				}
			}
		}
	})
}

func TestTeardownLeavesNothingBehind(t *testing.T) {
	var id, tag string
	t.Run("build and use a topology", func(t *testing.T) {
		c := New(t, Options{IPv6: true})
		c.StartEcho(t, EchoOptions{})
		id, tag = c.ID, c.LinkTag()
		if left := Leftovers(id, tag); len(left) == 0 {
			t.Fatal("Leftovers found nothing while the topology exists")
		}
	})
	if left := Leftovers(id, tag); len(left) > 0 {
		t.Errorf("after the test ended: %v", left)
	}
}

func TestTeardownRemovesWhatACrashedRunLeft(t *testing.T) {
	// A pid above pid_max can never be alive: this "run" has crashed.
	ns := "slct-999999-1-node-a"
	link := "slct0f423f1br"
	if err := script(words("netns add %s", ns), words("link add %s type bridge", link)); err != nil {
		t.Fatal(err)
	}
	// A process left inside keeps the namespace alive unless Teardown kills it.
	sleeper := exec.Command("ip", "netns", "exec", ns, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = sleeper.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = sleeper.Process.Kill()
		_ = exec.Command("ip", "netns", "del", ns).Run()
		_ = exec.Command("ip", "link", "del", link).Run()
	})

	// A run in progress (this process) must survive Teardown.
	live := New(t, Options{Nodes: 1, PodsPerNode: 1})

	if err := Teardown(); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if left := Leftovers("slct-999999-1", "slct0f423f"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Error("the process inside the crashed run's namespace was not killed")
	}
	if left := Leftovers(live.ID, live.LinkTag()); len(left) == 0 {
		t.Error("Teardown removed the live run's namespaces")
	}
}

func TestTopologiesShareAnAPIServerBridgeAndNodesHaveSecondaryAddresses(t *testing.T) {
	first := New(t, Options{Nodes: 1, PodsPerNode: 1, IPv6: true, SecondaryUnderlay: true})
	second := New(t, Options{Nodes: 1, PodsPerNode: 1, IPv6: true, SecondaryUnderlay: true, APIOf: first})
	if second.APIAddress() != first.APIAddress() || second.APIBridge != first.APIBridge {
		t.Fatalf("second topology's apiserver %s on %s, want the first's %s on %s", second.APIAddress(), second.APIBridge, first.APIAddress(), first.APIBridge)
	}
	if a, b := first.Nodes[0].APIAddress, second.Nodes[0].APIAddress; a == b {
		t.Fatalf("both topologies' node-a have api0 address %s", a)
	}
	serveAPIEcho(t)
	for _, c := range []*Cluster{first, second} {
		n := c.Nodes[0]
		out := expect(t, c.ID+" node-a -> apiserver", n.Probe(echo.TCP, netip.AddrPortFrom(first.APIAddress(), 16443), echo.ProbeOptions{}), echo.Answered)
		if out.Result == echo.Answered && out.Reply.Remote.Addr() != n.APIAddress {
			t.Errorf("%s node-a seen by the apiserver as %s, want %s", c.ID, out.Reply.Remote.Addr(), n.APIAddress)
		}
	}

	n := second.Nodes[0]
	if len(n.SecondaryIPs) != 2 || len(second.ExternalSecondaryIPs) != 2 {
		t.Fatalf("secondary addresses: node %v, external %v; want one per family", n.SecondaryIPs, second.ExternalSecondaryIPs)
	}
	if _, err := n.Start("echo-node-a", EchoServerBinary(t), "serve", "-pod", "node-a", "-ports", "9090", "-protocols", "tcp"); err != nil {
		t.Fatal(err)
	}
	for i, a := range n.SecondaryIPs {
		target := netip.AddrPortFrom(a, 9090)
		var out echo.Outcome
		if err := waitFor(5*time.Second, func() error {
			out = second.External.Probe(echo.TCP, target, echo.ProbeOptions{})
			if out.Result != echo.Answered {
				return errors.New(out.String())
			}
			return nil
		}); err != nil {
			t.Fatalf("external -> %s: %v", target, err)
		}
		// IPv4 picks the address in the target's subnet; IPv6 never picks a deprecated
		// address by itself, so the client's primary one.
		want := second.ExternalSecondaryIPs[i]
		if a.Is6() {
			want = second.External.IPv6
		}
		if src := out.Reply.Remote.Addr(); src != want {
			t.Errorf("external -> %s: seen as %s (%s), want %s (%s)", target, src, second.AddressName(src), want, second.AddressName(want))
		}
		// Bound, the secondary address is used.
		out = second.External.Probe(echo.TCP, target, echo.ProbeOptions{Source: second.ExternalSecondaryIPs[i]})
		if out.Result != echo.Answered || second.AddressName(out.Reply.Remote.Addr()) != "external/secondary" {
			t.Errorf("external (from %s) -> %s: %s, want an answer seeing external/secondary", second.ExternalSecondaryIPs[i], target, out)
		}
		if got := second.AddressName(a); got != "node-a/eth0-secondary" {
			t.Errorf("AddressName(%s) = %q", a, got)
		}
	}
}

// serveAPIEcho stands in for the apiserver: an echo server on TCP 16443 in the test's
// namespace, stopped when the test ends.
func serveAPIEcho(t *testing.T) {
	t.Helper()
	srv, err := echo.Listen(echo.ServerConfig{Pod: "apiserver", Ports: []uint16{16443}, Protocols: []echo.Protocol{echo.TCP}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // only waits for Serve to stop; the test checks the traffic
}
