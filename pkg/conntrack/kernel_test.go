//go:build kernel

package conntrack

// Kernel test with real UDP: the node is this process's private network namespace, a
// client and two pods are named namespaces behind veths, and DNAT rules stand for a
// Service (written with iptables directly: this package is backend-neutral).
//
//	client 192.168.200.2 ──veth── 192.168.200.1  NODE  10.1.1.1 ──veth── 10.1.1.2 pod-a
//	                                                   10.1.2.1 ──veth── 10.1.2.2 pod-b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

func run(t *testing.T, args ...string) { t.Helper(); netnstest.MustRun(t, args[0], args[1:]...) }

func setup(t *testing.T) (client string) {
	t.Helper()
	client, _ = setupPods(t)
	return client
}

// setupPods builds the topology above and returns the client's and pod-a's namespaces.
func setupPods(t *testing.T) (client, podA string) {
	t.Helper()
	client = netnstest.NewNamed(t, "ctclient")
	podA = netnstest.NewNamed(t, "ctpoda")
	podB := netnstest.NewNamed(t, "ctpodb")
	netnstest.Veth(t, client, "ctc", "192.168.200.1/24", "192.168.200.2/24")
	netnstest.Veth(t, podA, "cta", "10.1.1.1/24", "10.1.1.2/24")
	netnstest.Veth(t, podB, "ctb", "10.1.2.1/24", "10.1.2.2/24")
	run(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// The Service range leads somewhere (back to the client, which drops it): a datagram
	// sent while the Service has no DNAT rule then leaves a conntrack entry.
	run(t, "ip", "route", "replace", "172.30.0.0/16", "via", "192.168.200.2")
	serveUDP(t, podA, "pod-a")
	serveUDP(t, podB, "pod-b")
	// The Service's rules live in a chain of their own: PREROUTING keeps its jump, so the
	// nat base chain (and with it NAT of existing flows) never goes away.
	// Connection tracking runs in a namespace only while some rule uses it; a Service
	// losing its last DNAT rule must not switch it off (a proxy's own rules always use it).
	run(t, "iptables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	run(t, "iptables", "-t", "nat", "-N", "TEST-SVC")
	run(t, "iptables", "-t", "nat", "-A", "PREROUTING", "-j", "TEST-SVC")
	t.Cleanup(func() {
		_ = exec.Command("iptables", "-t", "nat", "-F", "PREROUTING").Run()
		_ = exec.Command("iptables", "-t", "nat", "-F", "TEST-SVC").Run()
		_ = exec.Command("iptables", "-t", "nat", "-X", "TEST-SVC").Run()
		_ = exec.Command("iptables", "-F", "FORWARD").Run()
	})
	return client, podA
}

func serveUDP(t *testing.T, ns, name string) {
	netnstest.ServeUDP(t, ns, ":5353", func(netip.Addr) string { return name })
}

// dnat points a Service frontend at one endpoint ("" for none).
func dnat(t *testing.T, dst string, port int, endpoint string) {
	t.Helper()
	run(t, "iptables", "-t", "nat", "-F", "TEST-SVC")
	if endpoint != "" {
		run(t, "iptables", "-t", "nat", "-A", "TEST-SVC", "-d", dst, "-p", "udp", "--dport", fmt.Sprint(port),
			"-j", "DNAT", "--to-destination", endpoint+":5353")
	}
}

// ask sends one datagram on the client's socket and returns the answer ("" for none).
func ask(c net.Conn) string {
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("?")); err != nil {
		return ""
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func dnsState(frontendIP string, nodePort int32, endpoints ...string) *model.NodeState {
	sp := udpService("ns", "dns", frontendIP, nodePort)
	for _, e := range endpoints {
		sp.AllEndpoints = append(sp.AllEndpoints, model.Endpoint{IP: netip.MustParseAddr(e), Port: 5353, Ready: true, Serving: true})
	}
	return state(sp)
}

func TestKernelStaleUDPEntriesFollowEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name, dst string
		port      int
	}{
		{name: "ClusterIP", dst: "172.30.0.20", port: 53},
		{name: "NodePort", dst: "192.168.200.1", port: 30053},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := setup(t)
			c, err := netnstest.Dial(client, "udp", netip.Addr{}, net.JoinHostPort(tc.dst, fmt.Sprint(tc.port)), 0)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := NewReconciler(model.IPv4)
			ctx := context.Background()
			state := func(eps ...string) *model.NodeState {
				if tc.name == "ClusterIP" {
					return dnsState(tc.dst, 0, eps...)
				}
				return dnsState("172.30.0.21", int32(tc.port), eps...)
			}
			reconcile := func(st *model.NodeState) int {
				t.Helper()
				n, err := r.Reconcile(ctx, st, changedServices("ns/dns"))
				if err != nil {
					t.Fatalf("Reconcile: %v", err)
				}
				return n
			}

			dnat(t, tc.dst, tc.port, "10.1.1.2")
			if got := ask(c); got != "pod-a" {
				t.Fatalf("first datagram reached %q, want pod-a", got)
			}

			// Each step points the frontend elsewhere: the socket's existing entry keeps
			// leading to what it led to before (before) until Reconcile deletes it, then
			// the same socket reaches the new endpoint (after, "" for no answer).
			for _, step := range []struct {
				name, endpoint string
				before, after  string
				// settled: a second Reconcile of the same state deletes nothing.
				settled bool
			}{
				{name: "endpoint A replaced by B", endpoint: "10.1.2.2", before: "pod-a", after: "pod-b", settled: true},
				{name: "scale to zero (N -> 0)", endpoint: "", before: "pod-b", after: ""},
				// The datagram just sent left an entry that was not DNATed (ClusterIP) or
				// went to the node itself (NodePort).
				{name: "scale from zero (0 -> N)", endpoint: "10.1.1.2", before: "", after: "pod-a"},
			} {
				var eps []string
				if step.endpoint != "" {
					eps = []string{step.endpoint}
				}
				dnat(t, tc.dst, tc.port, step.endpoint)
				if got := ask(c); got != step.before {
					t.Fatalf("%s: without reconciling, the old entry should still lead to %q, got %q", step.name, step.before, got)
				}
				if n := reconcile(state(eps...)); n < 1 {
					t.Fatalf("%s: deleted %d entries, want at least 1", step.name, n)
				}
				if got := ask(c); got != step.after {
					t.Fatalf("%s: after reconciling, the same socket reached %q, want %q", step.name, got, step.after)
				}
				if !step.settled {
					continue
				}
				if n := reconcile(state(eps...)); n != 0 {
					t.Errorf("%s: second reconcile deleted %d entries of a serving endpoint", step.name, n)
				}
			}
			out, _ := exec.Command("conntrack", "-L", "-p", "udp").CombinedOutput()
			t.Logf("conntrack table at the end:\n%s", strings.TrimSpace(string(out)))
		})
	}
}

// askTCPFrom connects from the client to addr from one fixed source port, as a client that
// reuses its port does, and returns what the pod answered ("" for no answer in time).
func askTCPFrom(t *testing.T, client string, srcPort int, addr string) string {
	t.Helper()
	var answer string
	err := netnstest.In(client, func() error {
		d := net.Dialer{Timeout: 1500 * time.Millisecond, LocalAddr: &net.TCPAddr{Port: srcPort},
			Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				})
				return errors.Join(err, serr)
			}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return nil // no answer in time is an outcome the caller checks
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		b, _ := io.ReadAll(c)
		answer = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

// A TCP SYN that reaches a ClusterIP before its rules exist leaves an entry that was never
// DNATed: without the reconciler, the client's retransmissions and any new connection from
// the same source port keep matching it for conntrack's SYN_SENT timeout (120 s) and go
// nowhere, although the rules are now in place. The reconcile of the sync that programs the
// new frontend deletes it; later changes of a known frontend walk no TCP entry, and an
// answered connection is never touched.
func TestKernelUnansweredTCPEntryGoesWithNewService(t *testing.T) {
	client, podA := setupPods(t)
	netnstest.ServeTCP(t, podA, ":8080", func(netip.Addr) string { return "web" })
	const cip, srcPort, otherPort = "172.30.0.30", 41000, 41002
	frontend := net.JoinHostPort(cip, "80")
	web := udpService("ns", "web", cip, 0, model.Endpoint{IP: netip.MustParseAddr("10.1.1.2"), Port: 8080, Ready: true, Serving: true})
	web.Name.Protocol, web.Name.Port, web.Port = model.TCP, "http", 80
	st := state(web)
	r := NewReconciler(model.IPv4)
	ctx := context.Background()

	// The Service exists in the API, but its rules are not written yet.
	if got := askTCPFrom(t, client, srcPort, frontend); got != "" {
		t.Fatalf("before any rule, the ClusterIP answered %q", got)
	}
	run(t, "iptables", "-t", "nat", "-A", "TEST-SVC", "-d", cip, "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", "10.1.1.2:8080")
	if got := askTCPFrom(t, client, otherPort, frontend); got != "web" {
		t.Fatalf("a fresh source port reached %q, want web: the rule does not work", got)
	}
	if got := askTCPFrom(t, client, srcPort, frontend); got != "" {
		t.Fatalf("the source port of the early SYN reached %q before reconciling: the kernel no longer keeps the un-NATed entry, so this test shows nothing", got)
	}
	n, err := r.Reconcile(ctx, st, changedServices("ns/web"))
	if err != nil || n < 1 {
		t.Fatalf("Reconcile of the sync that programs the Service: deleted %d, err %v; want the early entry deleted", n, err)
	}
	if got := askTCPFrom(t, client, srcPort, frontend); got != "web" {
		t.Fatalf("after reconciling, the early SYN's source port reached %q, want web", got)
	}
	// An endpoint change of the now known frontend deletes nothing, answered entries
	// (TIME_WAIT of the connections above) included.
	if n, err := r.Reconcile(ctx, st, changedServices("ns/web")); err != nil || n != 0 {
		t.Errorf("second Reconcile: deleted %d, err %v; want nothing", n, err)
	}
	out, _ := exec.Command("conntrack", "-L", "-p", "tcp").CombinedOutput()
	t.Logf("conntrack table at the end:\n%s", strings.TrimSpace(string(out)))
}
