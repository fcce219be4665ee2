//go:build kernel

package echo

// Conventions: every test runs in the private network namespace netnstest.Main creates, so
// the server binds 0.0.0.0 and [::] freely. 127.0.0.2 and fd00:98::2 (on lo) are made to
// drop everything (an nft input rule); 10.99.0.0/24 and fd00:99::/64 are unreachable
// routes, 10.98.0.0/24 and fd00:97::/64 prohibited ones.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/test/netnstest"
	"github.com/sluiceproxy/sluice/test/require"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

const port = 18080

func startServer(t *testing.T, protos ...Protocol) *Server {
	t.Helper()
	srv, err := Listen(ServerConfig{Pod: "p0", Ports: []uint16{port}, Protocols: protos, Logf: t.Logf})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

func run(t *testing.T, cmd string) {
	t.Helper()
	f := strings.Fields(cmd)
	if out, err := exec.Command(f[0], f[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
}

func TestProbeClassifiesWhatTheClientReceives(t *testing.T) {
	startServer(t, TCP, UDP)
	run(t, "nft add table inet echotest")
	run(t, "nft add chain inet echotest input { type filter hook input priority 0 ; }")
	run(t, "nft add rule inet echotest input ip daddr 127.0.0.2 drop")
	run(t, "ip addr add fd00:98::2/128 dev lo nodad")
	run(t, "nft add rule inet echotest input ip6 daddr fd00:98::2 drop")
	run(t, "ip route add unreachable 10.99.0.0/24")
	run(t, "ip -6 route add unreachable fd00:99::/64")
	run(t, "ip route add prohibit 10.98.0.0/24")
	run(t, "ip -6 route add prohibit fd00:97::/64")
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", "echotest").Run() })

	// Only the cases that expect a timeout wait the short time; an answer, a refusal or an
	// unreachable error gets a long one, since in the emulated VM on a busy host a connection
	// over loopback has taken more than 300 ms to be answered.
	short := ProbeOptions{Timeout: 300 * time.Millisecond}
	long := ProbeOptions{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		name   string
		proto  Protocol
		target string
		want   Result
	}{
		{"tcp to a listening port is answered", TCP, "127.0.0.1:18080", Answered},
		{"udp to a listening port is answered", UDP, "127.0.0.1:18080", Answered},
		{"tcp over ipv6 is answered", TCP, "[::1]:18080", Answered},
		{"udp over ipv6 is answered", UDP, "[::1]:18080", Answered},
		{"tcp to a closed port is refused", TCP, "127.0.0.1:18081", Refused},
		{"udp to a closed port is refused", UDP, "127.0.0.1:18081", Refused},
		{"tcp to a dropping address times out", TCP, "127.0.0.2:18080", Timeout},
		{"udp to a dropping address times out", UDP, "127.0.0.2:18080", Timeout},
		{"tcp without a route is unreachable", TCP, "10.99.0.1:18080", Unreachable},
		{"udp without a route is unreachable", UDP, "10.99.0.1:18080", Unreachable},
		{"tcp over ipv6 to a closed port is refused", TCP, "[::1]:18081", Refused},
		{"udp over ipv6 to a closed port is refused", UDP, "[::1]:18081", Refused},
		{"tcp over ipv6 to a dropping address times out", TCP, "[fd00:98::2]:18080", Timeout},
		{"udp over ipv6 to a dropping address times out", UDP, "[fd00:98::2]:18080", Timeout},
		{"tcp over ipv6 without a route is unreachable", TCP, "[fd00:99::1]:18080", Unreachable},
		{"udp over ipv6 without a route is unreachable", UDP, "[fd00:99::1]:18080", Unreachable},
		{"tcp to a prohibited destination is unreachable", TCP, "10.98.0.1:18080", Unreachable},
		{"tcp over ipv6 to a prohibited destination is unreachable", TCP, "[fd00:97::1]:18080", Unreachable},
		{"udp over ipv6 to a prohibited destination is unreachable", UDP, "[fd00:97::1]:18080", Unreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := netip.MustParseAddrPort(tc.target)
			opts := long
			if tc.want == Timeout {
				opts = short
			}
			out := Probe(context.Background(), tc.proto, target, opts)
			if out.Result != tc.want {
				t.Fatalf("Probe(%s %s) = %s, want %s", tc.proto, target, out, tc.want)
			}
			if out.Result != Answered {
				return
			}
			r := out.Reply
			if r.Pod != "p0" || r.Protocol != tc.proto || r.Local != target || r.Remote.Addr() != target.Addr() {
				t.Errorf("reply %s does not describe this connection to %s", r, target)
			}
		})
	}
}

func TestUDPClientKeepsItsSourcePort(t *testing.T) {
	startServer(t, UDP)
	c, err := DialUDP(netip.MustParseAddrPort("127.0.0.1:18080"), netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 3 {
		out := c.Send(time.Second)
		if out.Result != Answered {
			t.Fatalf("send %d: %s", i, out)
		}
		if out.Reply.Remote != c.LocalAddr() {
			t.Errorf("send %d: server saw %s, the socket is %s", i, out.Reply.Remote, c.LocalAddr())
		}
	}
}

func TestProbeBindsTheRequestedSource(t *testing.T) {
	startServer(t, TCP, UDP)
	src := netip.MustParseAddr("127.0.0.3")
	for _, proto := range []Protocol{TCP, UDP} {
		out := Probe(context.Background(), proto, netip.MustParseAddrPort("127.0.0.1:18080"), ProbeOptions{Source: src})
		if out.Result != Answered || out.Reply.Remote.Addr() != src {
			t.Errorf("%s from %s: %s", proto, src, out)
		}
	}
}

func TestSCTPIsAnsweredOrSkippedCleanly(t *testing.T) {
	srv := startServer(t, SCTP)
	if !SCTPSupported() {
		if len(srv.Skipped) == 0 {
			t.Fatal("no SCTP in this kernel, yet the server did not record its SCTP listeners as skipped")
		}
		require.Feature(t, require.SCTP, false, fmt.Sprintf("kernel has no SCTP sockets; server skipped %v", srv.Skipped))
	}
	out := Probe(context.Background(), SCTP, netip.MustParseAddrPort("127.0.0.1:18080"), ProbeOptions{})
	if out.Result != Answered || out.Reply.Protocol != SCTP {
		t.Fatalf("sctp probe: %s", out)
	}
	out = Probe(context.Background(), SCTP, netip.MustParseAddrPort("127.0.0.1:18081"), ProbeOptions{})
	if out.Result != Refused {
		t.Errorf("sctp probe of a closed port: %s, want refused", out)
	}
}

// An association that is already up when the probe starts waiting for it is noticed at
// once. Go's poller forgets that the socket turned writable when the wait is armed, so the
// wait has to look at the socket first; a probe that did not timed out with its answer
// waiting in the socket whenever the handshake was quicker than the probe's goroutine.
func TestSCTPAssociationUpBeforeTheWaitIsNoticed(t *testing.T) {
	startServer(t, SCTP)
	require.Feature(t, require.SCTP, SCTPSupported(), "kernel has no SCTP sockets")
	fd, err := sctpSocket(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "sctp")
	defer f.Close()
	_ = f.SetDeadline(time.Now().Add(5 * time.Second))
	if err := unix.Connect(fd, toSockaddr(netip.MustParseAddrPort("127.0.0.1:18080"))); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		t.Fatalf("connect: %v", err)
	}
	// Let the handshake finish and the answer arrive before anything waits (poll(2) does
	// not touch Go's poller), then let the delayed SACK go out (200 ms), so that the socket
	// has nothing left to report: the state in which a probe used to hang.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := unix.Getpeername(fd); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the association did not come up on loopback within 2s")
		}
	}
	if n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 2000); n != 1 || err != nil {
		t.Fatalf("no answer in the socket within 2s (poll: %d, %v)", n, err)
	}
	time.Sleep(500 * time.Millisecond)
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := awaitAssociation(raw); err != nil {
		t.Fatalf("awaitAssociation: %v", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("an established association was noticed only after %s", waited)
	}
	if out := readReply(f); out.Result != Answered {
		t.Errorf("reply: %s", out)
	}
}
