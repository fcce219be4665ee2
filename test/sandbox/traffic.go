package sandbox

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/topology"
)

// probeCase is one line of the traffic table: a client, a Service address, and what the
// client should get.
type probeCase struct {
	service string
	client  *topology.Host
	// clientName is how the line names the client ("pod a0 (node-a)").
	clientName string
	proto      echo.Protocol
	target     netip.AddrPort
	// tries is how many connections the line makes.
	tries int

	// wantResult is Answered, or the refusal or silence the case demonstrates.
	wantResult echo.Result
	// wantPods are the pods allowed to answer (all of them need not, in few tries).
	wantPods []string
	// sticky asks every try to be answered by the same pod.
	sticky bool
	// wantSources, when set, are the only source addresses the pods may see.
	wantSources []netip.Addr
	// note explains the expectation.
	note string
}

// probeResult is what the clients got.
type probeResult struct {
	c        *probeCase
	outcomes []echo.Outcome
}

// ok reports whether the result is what the case expects, and if not, why.
func (r *probeResult) ok() (bool, string) {
	c := r.c
	seen := map[string]bool{}
	for i, o := range r.outcomes {
		if o.Result != c.wantResult {
			return false, fmt.Sprintf("try %d: %s, want %s", i+1, o, c.wantResult)
		}
		if o.Result != echo.Answered {
			continue
		}
		if !slices.Contains(c.wantPods, o.Reply.Pod) {
			return false, fmt.Sprintf("try %d: answered by %s, not one of %v", i+1, o.Reply.Pod, c.wantPods)
		}
		if len(c.wantSources) > 0 && !slices.Contains(c.wantSources, o.Reply.Remote.Addr()) {
			return false, fmt.Sprintf("try %d: %s saw source %s, want one of %v", i+1, o.Reply.Pod, o.Reply.Remote.Addr(), c.wantSources)
		}
		seen[o.Reply.Pod] = true
	}
	if c.sticky && len(seen) > 1 {
		return false, fmt.Sprintf("answered by %d different pods, want one (session affinity)", len(seen))
	}
	return true, ""
}

// run probes the case's target tries times from its client.
func (c *probeCase) run() *probeResult {
	r := &probeResult{c: c}
	for range c.tries {
		timeout := time.Duration(0)
		if c.wantResult != echo.Answered {
			timeout = time.Second // a demonstrated drop needs no longer wait
		}
		r.outcomes = append(r.outcomes, c.client.Probe(c.proto, c.target, echo.ProbeOptions{Timeout: timeout}))
	}
	return r
}

// trafficCases builds the table: each sample Service from a pod, from the other node and
// from the external client, wherever that makes sense.
func trafficCases(topo *topology.Cluster) []*probeCase {
	nodeA, nodeB := topo.Node("node-a"), topo.Node("node-b")
	a0, b0 := topo.Pod("a0"), topo.Pod("b0")
	ext := topo.External
	all := []string{"a0", "a1", "b0", "b1"}
	pod := func(p *topology.Pod) (*topology.Host, string) {
		return &p.Host, fmt.Sprintf("pod %s (%s)", p.Name, p.Node.Name)
	}
	node := func(n *topology.Node) (*topology.Host, string) { return &n.Host, "node " + n.Name }
	external := func() (*topology.Host, string) { return ext, "external " + ext.IPv4.String() }
	at := func(ip string, port int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))
	}
	var cases []*probeCase
	add := func(service string, client func() (*topology.Host, string), proto echo.Protocol, target netip.AddrPort, tries int, want echo.Result, pods []string, note string) *probeCase {
		h, name := client()
		c := &probeCase{service: service, client: h, clientName: name, proto: proto, target: target, tries: tries, wantResult: want, wantPods: pods, note: note}
		cases = append(cases, c)
		return c
	}
	podA0 := func() (*topology.Host, string) { return pod(a0) }
	podB0 := func() (*topology.Host, string) { return pod(b0) }
	fromNodeB := func() (*topology.Host, string) { return node(nodeB) }

	// A pod reaching itself through a Service (hairpin) is masqueraded to its node's bridge.
	a0Sources := []netip.Addr{a0.IPv4, nodeA.BridgeIPs[0]}
	web := add("web", podA0, echo.TCP, at("10.96.100.10", 80), 8, echo.Answered, all, "pods keep their address (a0 reaching itself is masqueraded)")
	web.wantSources = a0Sources
	add("web", podA0, echo.UDP, at("10.96.100.10", 80), 8, echo.Answered, all, "UDP too")
	add("web", fromNodeB, echo.TCP, at("10.96.100.10", 80), 8, echo.Answered, all, "the node's own traffic is masqueraded")

	nodePort := nodeA.IPv4.String()
	c := add("web-nodeport", external, echo.TCP, at(nodePort, 30080), 8, echo.Answered, all, "masqueraded to node-a's address (externalTrafficPolicy Cluster)")
	c.wantSources = nodeAddrs(nodeA)
	add("web-nodeport", podB0, echo.TCP, at(nodePort, 30080), 8, echo.Answered, all, "")
	add("web-nodeport", fromNodeB, echo.TCP, at(nodePort, 30080), 8, echo.Answered, all, "")

	c = add("web-lb", external, echo.TCP, at("192.0.2.10", 80), 8, echo.Answered, all, "via node-a, masqueraded")
	c.wantSources = nodeAddrs(nodeA)
	add("web-lb", podB0, echo.TCP, at("192.0.2.10", 80), 8, echo.Answered, all, "")

	c = add("web-local", external, echo.TCP, at("192.0.2.11", 80), 4, echo.Answered, []string{"a1"}, "node-a's own pod; the client's address is kept")
	c.wantSources = []netip.Addr{ext.IPv4}
	add("web-local", external, echo.TCP, at(nodeB.IPv4.String(), 30082), 2, echo.Timeout, nil, "dropped: node-b has no local endpoint")
	add("web-local", podB0, echo.TCP, at("192.0.2.11", 80), 4, echo.Answered, []string{"a1"}, "pods are short-circuited to every endpoint")

	c = add("web-sticky", podA0, echo.TCP, at("10.96.100.14", 80), 8, echo.Answered, all, "one pod for every try")
	c.sticky = true
	c = add("web-sticky", fromNodeB, echo.TCP, at("10.96.100.14", 80), 8, echo.Answered, all, "one pod for every try")
	c.sticky = true
	return cases
}

// nodeAddrs are the addresses a node may masquerade to.
func nodeAddrs(n *topology.Node) []netip.Addr {
	out := append([]netip.Addr{}, n.IPs()...)
	out = append(out, n.BridgeIPs...)
	return append(out, n.APIAddress)
}

// probeAll runs every case.
func probeAll(cases []*probeCase) []*probeResult {
	out := make([]*probeResult, 0, len(cases))
	for _, c := range cases {
		out = append(out, c.run())
	}
	return out
}

// allOK reports whether every result is as expected, and the first that is not.
func allOK(results []*probeResult) (bool, string) {
	for _, r := range results {
		if ok, why := r.ok(); !ok {
			return false, fmt.Sprintf("%s from %s to %s %s: %s", r.c.service, r.c.clientName, r.c.proto, r.c.target, why)
		}
	}
	return true, ""
}

// writeTraffic prints the table: per Service a heading, then per case one line (client,
// target, ok or FAIL, who answered) and one line saying which sources the pods saw
// and why that is right. names maps addresses to what they are.
func writeTraffic(w io.Writer, results []*probeResult, names map[netip.Addr]string) error {
	var b strings.Builder
	last := ""
	for _, r := range results {
		c := r.c
		if c.service != last {
			fmt.Fprintf(&b, "\n%s/%s: %s\n", Namespace, c.service, serviceByName(c.service).about)
			last = c.service
		}
		ok, why := r.ok()
		mark := "ok"
		if !ok {
			mark = "FAIL"
		}
		answers, sources := summarize(r, names)
		fmt.Fprintf(&b, "  %-22s -> %-22s %-4s %s\n", c.clientName, fmt.Sprintf("%s %s", c.proto, c.target), mark, answers)
		detail := c.note
		if sources != "" {
			detail = strings.TrimSuffix("pods saw "+sources+"; "+c.note, "; ")
		}
		if !ok {
			detail = why + "; " + detail
		}
		if detail != "" {
			fmt.Fprintf(&b, "  %-22s    %-22s %-4s %s\n", "", "", "", detail)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// summarize renders what a case's tries got ("answered by a0 a1 b1 (8/8)", "timeout
// (2/2)") and the source addresses the pods saw ("10.244.1.10 (pod a0)").
func summarize(r *probeResult, names map[netip.Addr]string) (answers, sources string) {
	var pods []string
	var seen []netip.Addr
	other := map[echo.Result]int{}
	answered := 0
	for _, o := range r.outcomes {
		if o.Result != echo.Answered {
			other[o.Result]++
			continue
		}
		answered++
		if !slices.Contains(pods, o.Reply.Pod) {
			pods = append(pods, o.Reply.Pod)
		}
		if a := o.Reply.Remote.Addr(); !slices.Contains(seen, a) {
			seen = append(seen, a)
		}
	}
	slices.Sort(pods)
	slices.SortFunc(seen, netip.Addr.Compare)
	var parts []string
	if answered > 0 {
		parts = append(parts, fmt.Sprintf("answered by %s (%d/%d)", joinPods(pods), answered, len(r.outcomes)))
	}
	for _, res := range []echo.Result{echo.Refused, echo.Timeout, echo.Unreachable, echo.Failed} {
		if n := other[res]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s (%d/%d)", res, n, len(r.outcomes)))
		}
	}
	var src []string
	for _, a := range seen {
		if n, ok := names[a]; ok {
			src = append(src, fmt.Sprintf("%s (%s)", a, n))
		} else {
			src = append(src, a.String())
		}
	}
	return strings.Join(parts, ", "), strings.Join(src, ", ")
}

// addressNames names every address of the topology, for the "source seen" column.
func addressNames(topo *topology.Cluster) map[netip.Addr]string {
	names := map[netip.Addr]string{}
	for _, n := range topo.Nodes {
		names[n.IPv4] = n.Name
		for _, b := range n.BridgeIPs {
			names[b] = n.Name + " cbr0"
		}
		names[n.APIAddress] = n.Name + " api0"
		for _, p := range n.Pods {
			names[p.IPv4] = "pod " + p.Name
		}
	}
	for _, a := range topo.ExternalIPs {
		names[a] = "external"
	}
	return names
}
