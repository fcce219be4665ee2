// Package echo is the wire protocol of sluice's test echo server and the client side that
// tests use to probe Services with real packets.
//
// A server answers every TCP or SCTP connection, and every UDP datagram, with one line:
//
//	pod=<name> local=<ip:port> remote=<ip:port> proto=<tcp|udp|sctp>
//
// local is the address the packet reached inside the pod (after any DNAT), remote is the
// source the pod saw (after any SNAT). A client therefore learns which backend answered and
// whether its own address was preserved or masqueraded, without reading a single rule.
//
// Probe and UDPClient classify what a client receives: an answer, a refusal (TCP RST, SCTP
// ABORT or ICMP port unreachable), silence (the packet was dropped) or an unreachable error
// (ICMP host/net unreachable, or no route). Sockets belong to the network namespace of the
// thread that creates them, so a test creates them inside a namespace (netnstest.Do) and
// may use them after leaving it.
package echo

import (
	"fmt"
	"net/netip"
	"strings"
)

// Protocol is a transport protocol the echo server speaks.
type Protocol string

// The protocols, spelt as in the reply line.
const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// ParseProtocol accepts tcp, udp or sctp in any case.
func ParseProtocol(s string) (Protocol, error) {
	switch p := Protocol(strings.ToLower(strings.TrimSpace(s))); p {
	case TCP, UDP, SCTP:
		return p, nil
	}
	return "", fmt.Errorf("unknown protocol %q (want tcp, udp or sctp)", s)
}

// Reply is one answer of the echo server.
type Reply struct {
	// Pod is the name the server was started with.
	Pod string
	// Local is the destination the packet had when it reached the pod.
	Local netip.AddrPort
	// Remote is the source the packet had when it reached the pod.
	Remote   netip.AddrPort
	Protocol Protocol
}

// String renders the reply line, without the trailing newline.
func (r Reply) String() string {
	return fmt.Sprintf("pod=%s local=%s remote=%s proto=%s", r.Pod, r.Local, r.Remote, r.Protocol)
}

// ParseReply parses one reply line (a trailing newline is allowed).
func ParseReply(line string) (Reply, error) {
	var r Reply
	seen := map[string]bool{}
	for _, field := range strings.Fields(line) {
		key, value, ok := strings.Cut(field, "=")
		if !ok {
			return Reply{}, fmt.Errorf("reply %q: field %q has no '='", line, field)
		}
		var err error
		switch key {
		case "pod":
			r.Pod = value
		case "local":
			r.Local, err = netip.ParseAddrPort(value)
		case "remote":
			r.Remote, err = netip.ParseAddrPort(value)
		case "proto":
			r.Protocol, err = ParseProtocol(value)
		default:
			continue // newer servers may add fields
		}
		if err != nil {
			return Reply{}, fmt.Errorf("reply %q: %s: %w", line, key, err)
		}
		seen[key] = true
	}
	for _, key := range []string{"pod", "local", "remote", "proto"} {
		if !seen[key] {
			return Reply{}, fmt.Errorf("reply %q: missing %s", line, key)
		}
	}
	return r, nil
}
