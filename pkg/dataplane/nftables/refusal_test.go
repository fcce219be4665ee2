//go:build kernel

package nftables

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// refusalLimit is how long a refusal may take: an answer, not a retransmit (the first
// SYN retransmit comes after 1 s).
const refusalLimit = time.Second

// expectRefused connects (TCP) or sends one datagram and reads (UDP) from ns ("" for the
// node) to dst, and fails unless the kernel answers ECONNREFUSED within refusalLimit: a
// TCP reset or an ICMP port unreachable on a connected UDP socket.
func expectRefused(t *testing.T, what, ns, network string, dst netip.AddrPort) {
	t.Helper()
	start := time.Now()
	try := func() error {
		c, err := (&net.Dialer{Timeout: 3 * refusalLimit}).Dial(network, dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * refusalLimit))
		if network == "udp" {
			if _, err := c.Write([]byte("hi")); err != nil {
				return err
			}
		}
		_, err = c.Read(make([]byte, 64))
		return err
	}
	err := netnstest.In(ns, try)
	took := time.Since(start)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s: %s %v from %q: got %v after %v, want connection refused", what, network, dst, ns, err, took.Round(time.Millisecond))
	} else if took > refusalLimit {
		t.Errorf("%s: %s %v from %q: refused only after %v", what, network, dst, ns, took.Round(time.Millisecond))
	}
}

// TestNoEndpointsRefusedAtOnce: a TCP connection to a Service port without endpoints is
// refused with a reset, at once, in both families (upstream's ICMPv6 port unreachable
// leaves IPv6 clients retransmitting); UDP keeps the ICMP port unreachable. Both
// families' tables are programmed together, with an IPv4, an IPv6 and a dual-stack
// Service.
func TestNoEndpointsRefusedAtOnce(t *testing.T) {
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	services := map[model.IPFamily][]*model.ServicePort{
		model.IPv4: {
			svc("r", "v4", "http", model.TCP, "172.30.0.30", 80).NodePort(30090).Build(),
			svc("r", "v4dns", "dns", model.UDP, "172.30.0.31", 53).NodePort(30091).Build(),
			svc("r", "dual", "http", model.TCP, "172.30.0.32", 80).NodePort(30092).Build(),
		},
		model.IPv6: {
			svc("r", "v6", "http", model.TCP, "fd00:172:30::30", 80).NodePort(30093).Build(),
			svc("r", "v6dns", "dns", model.UDP, "fd00:172:30::31", 53).NodePort(30094).Build(),
			svc("r", "dual", "http", model.TCP, "fd00:172:30::32", 80).NodePort(30092).Build(),
		},
	}
	for _, f := range model.Families {
		b := newTestBackend(t, testConfig(f), WithLocalAddresses(hostnet.InterfaceAddrs))
		mustApply(t, b, nodeState(f, services[f]...), model.Changes{Full: true})
	}
	node := map[model.IPFamily]netip.Addr{model.IPv4: testNodeIP, model.IPv6: testNodeIPv6}
	cases := []struct {
		name    string
		f       model.IPFamily
		network string
		dst     netip.AddrPort
	}{
		{"IPv4 ClusterIP", model.IPv4, "tcp", ap("172.30.0.30", 80)},
		{"IPv4 NodePort", model.IPv4, "tcp", netip.AddrPortFrom(node[model.IPv4], 30090)},
		{"IPv4 ClusterIP, undefined port", model.IPv4, "tcp", ap("172.30.0.30", 81)},
		{"IPv4 UDP ClusterIP", model.IPv4, "udp", ap("172.30.0.31", 53)},
		{"IPv4 UDP NodePort", model.IPv4, "udp", netip.AddrPortFrom(node[model.IPv4], 30091)},
		{"IPv6 ClusterIP", model.IPv6, "tcp", ap("fd00:172:30::30", 80)},
		{"IPv6 NodePort", model.IPv6, "tcp", netip.AddrPortFrom(node[model.IPv6], 30093)},
		{"IPv6 ClusterIP, undefined port", model.IPv6, "tcp", ap("fd00:172:30::30", 81)},
		{"IPv6 UDP ClusterIP", model.IPv6, "udp", ap("fd00:172:30::31", 53)},
		{"IPv6 UDP NodePort", model.IPv6, "udp", netip.AddrPortFrom(node[model.IPv6], 30094)},
		{"dual-stack ClusterIP, IPv4", model.IPv4, "tcp", ap("172.30.0.32", 80)},
		{"dual-stack ClusterIP, IPv6", model.IPv6, "tcp", ap("fd00:172:30::32", 80)},
		{"dual-stack NodePort, IPv4", model.IPv4, "tcp", netip.AddrPortFrom(node[model.IPv4], 30092)},
		{"dual-stack NodePort, IPv6", model.IPv6, "tcp", netip.AddrPortFrom(node[model.IPv6], 30092)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectRefused(t, "from another host", tp.client, tc.network, tc.dst)
			if tc.network == "tcp" {
				// The node's own connection: an ICMP error would reach its socket while
				// connect() holds it, and count for nothing until a retransmit.
				expectRefused(t, "from the node", "", tc.network, tc.dst)
			}
		})
	}
}
