//go:build kernel

package nftables

// The packet topology of the kernel tests. The test process's own (private) namespace is
// the node. Pods and a client are named namespaces joined to it by veth pairs:
//
//	client ns  eth0 192.168.0.10/24 (+.11)  ──  vc0 192.168.0.2/24   node
//	pod ns     eth0 10.180.0.N/32           ──  vpN (192.168.1.1/32, route 10.180.0.N/32)
//
// IPv6 uses 2001:db8::10 (+::11) / 2001:db8::1 for the client link and fd00:10:180::N for
// pods. Each pod runs TCP and UDP servers on ports 80 and 8080 that answer
// "<pod> <source address they saw>", so tests can see which endpoint got a connection and
// whether it was masqueraded.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

type topology struct {
	t      testing.TB
	f      model.IPFamily
	client string // namespace name
	pods   map[string]*pod
	seq    int
}

type pod struct {
	name string
	ns   string
	ip   netip.Addr
}

var (
	clientIP      = netip.MustParseAddr("192.168.0.10")
	clientIP2     = netip.MustParseAddr("192.168.0.11")
	clientIPv6    = netip.MustParseAddr("2001:db8::10")
	podGatewayV4  = "192.168.1.1"
	podGatewayV6  = "fd00:1::1"
	topologyMutex sync.Mutex
)

func sysctl(t testing.TB, path, value string) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/"+path, []byte(value), 0o644); err != nil {
		t.Fatalf("sysctl %s=%s: %v", path, value, err)
	}
}

// newTopology builds the node's client link and returns a topology pods can be added
// to. Everything is deleted when the test ends.
func newTopology(t testing.TB, f model.IPFamily) *topology {
	t.Helper()
	if !netnstest.InNetns() {
		t.Fatal("kernel tests must run under netnstest.Main")
	}
	topologyMutex.Lock()
	t.Cleanup(topologyMutex.Unlock)
	sysctl(t, "net/ipv4/ip_forward", "1")
	sysctl(t, "net/ipv6/conf/all/forwarding", "1")
	sysctl(t, "net/ipv4/conf/all/rp_filter", "0")
	sysctl(t, "net/ipv4/conf/default/rp_filter", "0")
	// The client's default gateway is the node, and the node's is the client: packets
	// the node forwards back out of vc0 make it send an ICMP redirect, which uses up the
	// per-peer ICMP rate-limit token and silences the reject that follows.
	sysctl(t, "net/ipv4/conf/all/send_redirects", "0")
	sysctl(t, "net/ipv4/conf/default/send_redirects", "0")

	tp := &topology{t: t, f: f, pods: map[string]*pod{}}
	tp.client = netnstest.NewNamed(t, "client")
	run := func(args ...string) { netnstest.MustRun(t, args[0], args[1:]...) }
	run("ip", "link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns", tp.client)
	t.Cleanup(func() { _ = runQuiet("ip", "link", "del", "vc0") })
	sysctl(t, "net/ipv4/conf/vc0/send_redirects", "0")
	run("ip", "addr", "add", "192.168.0.2/24", "dev", "vc0")
	run("ip", "-6", "addr", "add", "2001:db8::1/64", "dev", "vc0", "nodad")
	run("ip", "link", "set", "vc0", "up")
	// A node has a default route; without one, traffic the node itself sends to a
	// Service address fails routing before the output hook can DNAT it.
	run("ip", "route", "add", "default", "via", "192.168.0.10")
	run("ip", "-6", "route", "add", "default", "via", "2001:db8::10")
	run("ip", "-n", tp.client, "addr", "add", "192.168.0.10/24", "dev", "eth0")
	run("ip", "-n", tp.client, "addr", "add", "192.168.0.11/24", "dev", "eth0")
	run("ip", "-n", tp.client, "-6", "addr", "add", "2001:db8::10/64", "dev", "eth0", "nodad")
	run("ip", "-n", tp.client, "-6", "addr", "add", "2001:db8::11/64", "dev", "eth0", "nodad")
	run("ip", "-n", tp.client, "link", "set", "eth0", "up")
	run("ip", "-n", tp.client, "route", "add", "default", "via", "192.168.0.2")
	run("ip", "-n", tp.client, "-6", "route", "add", "default", "via", "2001:db8::1")
	return tp
}

func runQuiet(name string, args ...string) error {
	return exec.Command(name, args...).Run()
}

// addPod creates a pod namespace with address ip (a pod IP of the family) and starts
// its servers.
func (tp *topology) addPod(name, ip string) *pod {
	t := tp.t
	t.Helper()
	tp.seq++
	p := &pod{name: name, ns: netnstest.NewNamed(t, "pod"), ip: netip.MustParseAddr(ip)}
	veth := fmt.Sprintf("vp%d", tp.seq)
	run := func(args ...string) { netnstest.MustRun(t, args[0], args[1:]...) }
	run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", p.ns)
	t.Cleanup(func() { _ = runQuiet("ip", "link", "del", veth) })
	run("ip", "link", "set", veth, "up")
	if p.ip.Is4() {
		run("ip", "addr", "add", podGatewayV4+"/32", "dev", veth)
		run("ip", "route", "add", ip+"/32", "dev", veth)
		run("ip", "-n", p.ns, "addr", "add", ip+"/32", "dev", "eth0")
		run("ip", "-n", p.ns, "link", "set", "eth0", "up")
		run("ip", "-n", p.ns, "route", "add", podGatewayV4, "dev", "eth0")
		run("ip", "-n", p.ns, "route", "add", "default", "via", podGatewayV4)
	} else {
		run("ip", "-6", "addr", "add", podGatewayV6+"/128", "dev", veth, "nodad")
		run("ip", "-6", "route", "add", ip+"/128", "dev", veth)
		run("ip", "-n", p.ns, "-6", "addr", "add", ip+"/128", "dev", "eth0", "nodad")
		run("ip", "-n", p.ns, "link", "set", "eth0", "up")
		run("ip", "-n", p.ns, "-6", "route", "add", podGatewayV6, "dev", "eth0")
		run("ip", "-n", p.ns, "-6", "route", "add", "default", "via", podGatewayV6)
	}
	for _, port := range []int{80, 8080} {
		tp.serve(p, port)
	}
	tp.pods[name] = p
	return p
}

// serve starts TCP and UDP servers in the pod answering "<pod> <peer address>".
func (tp *topology) serve(p *pod, port int) {
	answer := func(peer netip.Addr) string { return fmt.Sprintf("%s %s\n", p.name, peer) }
	netnstest.ServeTCP(tp.t, p.ns, fmt.Sprintf(":%d", port), answer)
	netnstest.ServeUDP(tp.t, p.ns, fmt.Sprintf(":%d", port), answer)
}

// reply is what a server answered.
type reply struct {
	pod  string
	peer netip.Addr
}

var errDropped = errors.New("no answer (dropped)")
var errRejected = errors.New("rejected")

// tcp connects from namespace ns ("" for the node itself) to dst, optionally from src,
// and returns the server's answer, errRejected or errDropped.
func (tp *topology) tcp(ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (reply, error) {
	return tp.ask("tcp", ns, src, dst, timeout)
}

// udp sends one datagram from ns to dst and waits for the answer.
func (tp *topology) udp(ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (reply, error) {
	return tp.ask("udp", ns, src, dst, timeout)
}

// ask connects over network from ns to dst (sending one datagram over UDP) and reads the
// server's one-line answer.
func (tp *topology) ask(network, ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (reply, error) {
	c, err := netnstest.Dial(ns, network, src, dst.String(), timeout)
	if err != nil {
		return reply{}, classify(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if network == "udp" {
		if _, err := c.Write([]byte("hi")); err != nil {
			return reply{}, classify(err)
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return reply{}, classify(err)
	}
	return parseReply(line)
}

// wantTCP connects over TCP from ns ("" for the node; from src when valid) to dst and
// fails the test unless pod answers.
func (tp *topology) wantTCP(t *testing.T, ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration, pod string) reply {
	t.Helper()
	return tp.wantAnswer(t, "tcp", ns, src, dst, timeout, pod)
}

// wantUDP is wantTCP with one UDP datagram.
func (tp *topology) wantUDP(t *testing.T, ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration, pod string) reply {
	t.Helper()
	return tp.wantAnswer(t, "udp", ns, src, dst, timeout, pod)
}

func (tp *topology) wantAnswer(t *testing.T, network, ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration, pod string) reply {
	t.Helper()
	r, err := tp.ask(network, ns, src, dst, timeout)
	if err != nil || r.pod != pod {
		t.Fatalf("%s %v from %q: got %+v, %v; want %s", network, dst, ns, r, err, pod)
	}
	return r
}

// wantTCPError connects over TCP like wantTCP and fails the test unless the attempt ends
// in want (errDropped or errRejected).
func (tp *topology) wantTCPError(t *testing.T, ns string, src netip.Addr, dst netip.AddrPort, timeout time.Duration, want error) {
	t.Helper()
	if _, err := tp.tcp(ns, src, dst, timeout); !errors.Is(err, want) {
		t.Fatalf("tcp %v from %q: got %v, want %v", dst, ns, err, want)
	}
}

func parseReply(line string) (reply, error) {
	fields := strings.Fields(line)
	if len(fields) != 2 {
		return reply{}, fmt.Errorf("bad answer %q", line)
	}
	a, err := netip.ParseAddr(fields[1])
	if err != nil {
		return reply{}, fmt.Errorf("bad answer %q", line)
	}
	return reply{pod: fields[0], peer: a}, nil
}

func classify(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return fmt.Errorf("%w: %w", errRejected, err)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w", errDropped, err)
	}
	return err
}

func ap(addr string, port int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port))
}
