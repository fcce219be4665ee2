package nftables

// A root-free packet tracer for planned tables: it replays plans into a small model of
// the table (chains with their typed rules, set and map elements) and walks a packet
// through the hooks the kernel would, in priority order, saying where it goes: DNAT to
// which endpoint, reject, drop, or accept untouched, and whether it is masqueraded.
// It reads the rules as the planner wrote them (the typed terms), not their netlink
// form; the kernel tests send real packets through the same tables.

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// tracePacket is the first packet of a connection.
type tracePacket struct {
	src, dst netip.Addr
	proto    model.Protocol
	port     uint16
	// fromNode: sent by a process on the node (the output hook) rather than arriving
	// (prerouting).
	fromNode bool
	iif      string
	// random is the value numgen draws (0 picks the first endpoint of a block).
	random uint32
}

// traceResult is where the packet went.
type traceResult struct {
	verdict    string // "dnat", "reject", "drop" or "accept" (no rule stopped or translated it)
	to         netip.AddrPort
	masquerade bool
	chains     []string // the chains the packet went through, in order
}

func (r traceResult) String() string {
	s := r.verdict
	if r.verdict == "dnat" {
		s += " to " + r.to.String()
	}
	if r.masquerade {
		s += ", masquerade"
	}
	return s
}

// tracedTable is a table as the plans replayed into it left it.
type tracedTable struct {
	f          *family
	localAddrs []netip.Addr
	chains     map[string][]rule
	bases      map[string]*baseSpec
	elems      map[string]map[string]string // set -> key -> value
}

func newTracedTable(f model.IPFamily, localAddrs []netip.Addr) *tracedTable {
	return &tracedTable{f: familyOf(f), localAddrs: localAddrs, chains: map[string][]rule{},
		bases: map[string]*baseSpec{}, elems: map[string]map[string]string{}}
}

// replay applies a plan's operations in order.
func (t *tracedTable) replay(tb testing.TB, p *Plan) {
	tb.Helper()
	if p.replace {
		*t = *newTracedTable(t.f.model, t.localAddrs)
	}
	for _, g := range p.groups {
		for i := range g.ops {
			t.apply(tb, &g.ops[i])
		}
	}
}

func (t *tracedTable) apply(tb testing.TB, o *op) {
	switch o.kind {
	case opAddChain:
		if _, ok := t.chains[o.name]; !ok {
			t.chains[o.name] = nil
		}
		if o.base != nil {
			t.bases[o.name] = o.base
		}
	case opFlushChain:
		t.chains[o.name] = nil
	case opDeleteChain:
		delete(t.chains, o.name)
		delete(t.bases, o.name)
	case opAddRule:
		t.chains[o.name] = append(t.chains[o.name], o.rule.r)
	case opAddSet:
		if t.elems[o.name] == nil {
			t.elems[o.name] = map[string]string{}
		}
	case opDeleteSet:
		delete(t.elems, o.name)
	case opAddElements:
		if t.elems[o.name] == nil {
			t.elems[o.name] = map[string]string{}
		}
		for _, e := range o.elems {
			t.elems[o.name][e.key] = e.value
		}
	case opDeleteElements:
		for _, e := range o.elems {
			delete(t.elems[o.name], e.key)
		}
	}
}

// packetState is what the rules can change.
type packetState struct {
	tracePacket
	mark       uint32
	dnatted    bool
	to         netip.AddrPort
	masquerade bool
	chains     []string
}

// trace follows a packet through the hooks it meets: prerouting (or output for one the
// node sends), then, by routing on its translated destination, input or forward and
// postrouting.
func (t *tracedTable) trace(tb testing.TB, pkt tracePacket) traceResult {
	tb.Helper()
	p := &packetState{tracePacket: pkt}
	first := uint32(unix.NF_INET_PRE_ROUTING)
	if pkt.fromNode {
		first = unix.NF_INET_LOCAL_OUT
	}
	if v := t.runHook(tb, first, p); v != "" {
		return p.result(v)
	}
	next := []uint32{unix.NF_INET_FORWARD, unix.NF_INET_POST_ROUTING}
	switch {
	case pkt.fromNode:
		next = []uint32{unix.NF_INET_POST_ROUTING}
	case t.isLocal(p.dst):
		next = []uint32{unix.NF_INET_LOCAL_IN}
	}
	for _, h := range next {
		if v := t.runHook(tb, h, p); v != "" {
			return p.result(v)
		}
	}
	return p.result("accept")
}

func (p *packetState) result(v string) traceResult {
	if v == "accept" && p.dnatted {
		v = "dnat"
	}
	r := traceResult{verdict: v, masquerade: p.masquerade, chains: p.chains}
	if v == "dnat" {
		r.to = p.to
	}
	return r
}

// runHook runs the base chains of a hook in priority order; it returns "drop" or
// "reject" when one stops the packet, "" when the packet goes on.
func (t *tracedTable) runHook(tb testing.TB, hook uint32, p *packetState) string {
	var names []string
	for name, b := range t.bases {
		if b.hook == hook {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return int(t.bases[a].priority - t.bases[b].priority) })
	for _, name := range names {
		switch v := t.runChain(tb, name, p, 0); v {
		case "drop", "reject":
			return v
		}
	}
	return ""
}

// runChain runs a chain: "" when it ends without a verdict (back to the caller), or the
// verdict that ends the base chain ("accept", "drop", "reject").
func (t *tracedTable) runChain(tb testing.TB, name string, p *packetState, depth int) string {
	tb.Helper()
	if depth > 16 {
		tb.Fatalf("trace: chains nested too deep at %s", name)
	}
	rules, ok := t.chains[name]
	if !ok {
		tb.Fatalf("trace: jump to missing chain %s", name)
	}
	p.chains = append(p.chains, name)
	for _, r := range rules {
		v, gone := t.runRule(tb, r, p, depth)
		if gone {
			return v
		}
	}
	return ""
}

// runRule runs one rule's terms; gone is true when the rule ended the chain (a verdict,
// a goto, a NAT statement), with the verdict for the base chain in v.
func (t *tracedTable) runRule(tb testing.TB, r rule, p *packetState, depth int) (v string, gone bool) {
	f := t.f
	proto := protoNumber(p.proto)
	for _, term := range r.terms {
		switch x := term.(type) {
		case ctStateNew:
		case ctStatusDNAT:
			if !p.dnatted {
				return "", false
			}
		case addrMatch:
			a := p.addr(x.dir)
			in := slices.ContainsFunc(x.prefixes, func(pf netip.Prefix) bool { return pf.Contains(a) })
			if in == x.neg {
				return "", false
			}
		case addrInSet:
			_, in := t.elems[x.set][keyAddr(f, p.addr(x.dir))]
			if in == x.neg {
				return "", false
			}
		case fibLocal:
			if !t.isLocal(p.addr(x.dir)) {
				return "", false
			}
		case iifname:
			prefix, isPrefix := strings.CutSuffix(x.name, "*")
			in := p.iif == x.name || (isPrefix && strings.HasPrefix(p.iif, prefix))
			if in == x.neg {
				return "", false
			}
		case l4proto:
			if x.proto != proto {
				return "", false
			}
		case markAndNonZero:
			if p.mark&x.mark == 0 {
				return "", false
			}
		case markSetOr:
			p.mark |= x.mark
		case markSetXor:
			p.mark ^= x.mark
		case hairpinMatch:
			key := string(f.addrBytes(p.src)) + string(f.addrBytes(p.dst)) + keyProtoPort(proto, p.port)
			if _, in := t.elems[hairpinConnectionsSet][key]; !in {
				return "", false
			}
		case addrProtoPortLookup:
			if v, gone, matched := t.lookup(tb, x.set, keyAddrProtoPort(f, p.dst, proto, p.port), x.vmap, p, depth); !matched || gone {
				return v, gone
			}
		case protoPortLookup:
			if v, gone, matched := t.lookup(tb, x.set, keyProtoPort(proto, p.port), x.vmap, p, depth); !matched || gone {
				return v, gone
			}
		case numgenIsZero:
			if p.random%uint32(x.mod) != 0 {
				return "", false
			}
		case masqueradeFullyRandom:
			p.masquerade = true
			return "accept", true
		case dnatTo:
			p.dnat(x.to)
			return "accept", true
		case *dnatMap:
			to, ok := t.endpointFor(x, p.random)
			if !ok {
				return "", false // no range: the packet goes on untranslated
			}
			p.dnat(to)
			return "accept", true
		case numgenVmap:
			return t.verdict(tb, "goto "+x.chains[int(p.random)%len(x.chains)], p, depth)
		case updateSaddr, counterTerm: // they record the packet; its way goes on
		case rejectTerm, tcpResetTerm:
			return "reject", true
		case verdictTerm:
			return t.verdict(tb, verdictString(x.kind, x.chain), p, depth)
		default:
			tb.Fatalf("trace: no meaning for the term %T (%s)", term, r.String(f))
		}
	}
	return "", false
}

// lookup looks key up in a set (matched: the key is there) or a verdict map (the
// element's verdict is followed).
func (t *tracedTable) lookup(tb testing.TB, set, key string, vmap bool, p *packetState, depth int) (v string, gone, matched bool) {
	value, in := t.elems[set][key]
	if !in {
		return "", false, false
	}
	if !vmap {
		return "", false, true
	}
	v, gone = t.verdict(tb, value, p, depth)
	return v, gone, true
}

// verdict follows "jump X", "goto X", "drop", "accept" or "return".
func (t *tracedTable) verdict(tb testing.TB, v string, p *packetState, depth int) (string, bool) {
	kind, chain, _ := strings.Cut(v, " ")
	switch kind {
	case "jump":
		if got := t.runChain(tb, chain, p, depth+1); got != "" {
			return got, true
		}
		return "", false
	case "goto":
		return t.runChain(tb, chain, p, depth+1), true
	case "drop", "accept":
		return kind, true
	case "return":
		return "", true
	}
	tb.Fatalf("trace: unknown verdict %q", v)
	return "", false
}

// endpointFor finds the endpoint map range holding base+random and decodes its value.
func (t *tracedTable) endpointFor(d *dnatMap, random uint32) (netip.AddrPort, bool) {
	n := d.base + random%endpointBlockSize
	for key, value := range t.elems[d.set] {
		lo, hi := binary.BigEndian.Uint32([]byte(key[:4])), binary.BigEndian.Uint32([]byte(key[4:8]))
		if n < lo || n >= hi || !strings.HasPrefix(value, "=") {
			continue
		}
		data := []byte(value[1:])
		addr, _ := netip.AddrFromSlice(data[:t.f.addrLn])
		port := binary.BigEndian.Uint16(data[t.f.addrLn:])
		return netip.AddrPortFrom(addr.Unmap(), port), true
	}
	return netip.AddrPort{}, false
}

// dnat translates the destination: the later hooks see the endpoint.
func (p *packetState) dnat(to netip.AddrPort) {
	p.dnatted, p.to = true, to
	p.dst, p.port = to.Addr(), to.Port()
}

func (p *packetState) addr(dir addrDir) netip.Addr {
	if dir == saddr {
		return p.src
	}
	return p.dst
}

func (t *tracedTable) isLocal(a netip.Addr) bool {
	return slices.Contains(t.localAddrs, a) || a.IsLoopback()
}

// tracedFullPlan plans state from scratch with cfg and returns the table it leaves.
func tracedFullPlan(t testing.TB, v planVariant, state *model.NodeState) (*tracedTable, *fakeKernel) {
	t.Helper()
	k := newFakeKernel(v.config())
	tt := newTracedTable(v.family, testLocalAddrs)
	tt.replay(t, k.apply(state, model.Changes{Full: true}))
	return tt, k
}

// TestTraceExamples walks packets through the planned example tables of both families:
// every way a packet can end (DNAT, reject, drop, accept) and masquerading.
func TestTraceExamples(t *testing.T) {
	type tc struct {
		name string
		pkt  tracePacket
		want string
	}
	// A pod is inside the local detector's cluster CIDR (10.0.0.0/8, fd00:10::/64; the
	// IPv6 examples' endpoints, fd00:10:180::, are outside it, so a pod address of the
	// same prefix would be masqueraded).
	pod, outside := netip.MustParseAddr("10.180.0.9"), fixture.OutsideClientv4
	pod6, outside6 := netip.MustParseAddr("fd00:10::9"), fixture.OutsideClientv6
	v4 := []tc{
		{"ClusterIP from a pod", tracePacket{src: pod, dst: addr("172.30.0.41"), proto: model.TCP, port: 80}, "dnat to 10.180.0.1:80"},
		{"ClusterIP from outside the cluster is masqueraded", tracePacket{src: outside, dst: addr("172.30.0.41"), proto: model.TCP, port: 80}, "dnat to 10.180.0.1:80, masquerade"},
		{"hairpin: an endpoint reaching itself is masqueraded", tracePacket{src: addr("10.180.0.1"), dst: addr("172.30.0.41"), proto: model.TCP, port: 80}, "dnat to 10.180.0.1:80, masquerade"},
		{"ClusterIP port no Service has", tracePacket{src: pod, dst: addr("172.30.0.41"), proto: model.TCP, port: 81}, "reject"},
		{"unallocated ClusterIP", tracePacket{src: pod, dst: addr("172.30.0.99"), proto: model.TCP, port: 80}, "drop"},
		{"Service without endpoints", tracePacket{src: pod, dst: addr("172.30.0.46"), proto: model.TCP, port: 80}, "reject"},
		{"Local policy, no local endpoint: external IP from outside", tracePacket{src: outside, dst: addr("192.168.99.22"), proto: model.TCP, port: 80}, "drop"},
		{"Local policy, no local endpoint: NodePort from outside", tracePacket{src: outside, dst: testNodeIP, proto: model.TCP, port: 3001}, "drop"},
		{"Local policy, no local endpoint: a pod goes to the cluster's", tracePacket{src: pod, dst: addr("192.168.99.22"), proto: model.TCP, port: 80}, "dnat to 10.180.0.2:80"},
		{"Local policy, no local endpoint: the node goes to the cluster's, masqueraded", tracePacket{src: testNodeIP, dst: addr("1.2.3.4"), proto: model.TCP, port: 80, fromNode: true}, "dnat to 10.180.0.2:80, masquerade"},
		{"external IP, first endpoint", tracePacket{src: outside, dst: addr("192.168.99.33"), proto: model.TCP, port: 80}, "dnat to 10.180.0.4:80, masquerade"},
		{"external IP, second endpoint", tracePacket{src: outside, dst: addr("192.168.99.33"), proto: model.TCP, port: 80, random: endpointBlockSize / 2}, "dnat to 10.180.0.5:80, masquerade"},
		{"LB IP inside the source ranges", tracePacket{src: addr("203.0.113.5"), dst: addr("5.6.7.8"), proto: model.TCP, port: 80}, "dnat to 10.180.0.3:80, masquerade"},
		{"LB IP outside the source ranges", tracePacket{src: outside, dst: addr("5.6.7.8"), proto: model.TCP, port: 80}, "drop"},
		{"NodePort is not subject to source ranges", tracePacket{src: outside, dst: testNodeIP, proto: model.TCP, port: 3002}, "dnat to 10.180.0.3:80, masquerade"},
		{"a port nobody uses on the node is left alone", tracePacket{src: outside, dst: testNodeIP, proto: model.TCP, port: 22}, "accept"},
		{"other traffic is left alone", tracePacket{src: pod, dst: outside, proto: model.UDP, port: 53}, "accept"},
	}
	v6 := []tc{
		{"ClusterIP from a pod", tracePacket{src: pod6, dst: addr("fd00:172:30::41"), proto: model.TCP, port: 80}, "dnat to [fd00:10:180::1]:80"},
		{"ClusterIP from outside the cluster is masqueraded", tracePacket{src: outside6, dst: addr("fd00:172:30::41"), proto: model.TCP, port: 80}, "dnat to [fd00:10:180::1]:80, masquerade"},
		{"ClusterIP port no Service has", tracePacket{src: pod6, dst: addr("fd00:172:30::41"), proto: model.TCP, port: 81}, "reject"},
		{"Service without endpoints", tracePacket{src: pod6, dst: addr("fd00:172:30::46"), proto: model.SCTP, port: 80}, "reject"},
		{"UDP external IP, local endpoint", tracePacket{src: outside6, dst: addr("2001:db8:99::33"), proto: model.UDP, port: 80, random: endpointBlockSize - 1}, "dnat to [fd00:10:180::5]:80, masquerade"},
		{"LB IP outside the source ranges", tracePacket{src: outside6, dst: addr("2001:db8:1::8"), proto: model.TCP, port: 80}, "drop"},
		{"LB IP inside the source ranges", tracePacket{src: addr("2001:db8:203::5"), dst: addr("2001:db8:1::8"), proto: model.TCP, port: 80}, "dnat to [fd00:10:180::3]:80, masquerade"},
	}
	// The counted variants take the same ways: a traffic counter records, it never decides.
	for _, v := range planVariants {
		if v.edit != nil {
			continue
		}
		cases := v4
		if v.family == model.IPv6 {
			cases = v6
		}
		tt, _ := tracedFullPlan(t, v, v.state())
		for _, c := range cases {
			t.Run(v.name+"/"+c.name, func(t *testing.T) {
				got := tt.trace(t, c.pkt)
				if got.String() != c.want {
					t.Errorf("trace = %s, want %s\nchains: %s", got, c.want, strings.Join(got.chains, " → "))
				}
			})
		}
	}
}

// TestTraceFollowsPartialPlans: the partial plans of endpoint changes move traffic as
// they should (the planner's incremental path, traced): an endpoint replaced, then none
// left (reject), then one again.
func TestTraceFollowsPartialPlans(t *testing.T) {
	v := planVariants[0]
	mk := func(eps ...string) *model.NodeState {
		return nodeState(model.IPv4, svc("ns1", "web", "http", model.TCP, "172.30.0.10", 80).Endpoints(eps...).Build())
	}
	pkt := tracePacket{src: netip.MustParseAddr("10.180.0.9"), dst: addr("172.30.0.10"), proto: model.TCP, port: 80}
	tt, k := tracedFullPlan(t, v, mk("10.180.0.1:8080"))
	for _, step := range []struct {
		name  string
		state *model.NodeState
		want  string
	}{
		{"endpoint replaced", mk("10.180.0.2:8080"), "dnat to 10.180.0.2:8080"},
		{"no endpoint left", mk(), "reject"},
		{"an endpoint again", mk("10.180.0.3:8080", "10.180.0.4:8080"), "dnat to 10.180.0.3:8080"},
	} {
		tt.replay(t, k.apply(step.state, changed("ns1/web")))
		if got := tt.trace(t, pkt); got.String() != step.want {
			t.Errorf("%s: trace = %s, want %s\nchains: %s", step.name, got, step.want, strings.Join(got.chains, " → "))
		}
	}
}

// TestTracerMeaning checks the tracer itself on hand-made chains: jump returns, goto
// does not, a base chain's accept lets the next base chain see the packet, drop stops.
func TestTracerMeaning(t *testing.T) {
	mkTable := func() *tracedTable {
		tt := newTracedTable(model.IPv4, nil)
		tt.bases["early"] = &baseSpec{typ: "filter", hook: unix.NF_INET_PRE_ROUTING, priority: -110}
		tt.bases["late"] = &baseSpec{typ: "nat", hook: unix.NF_INET_PRE_ROUTING, priority: -100}
		tt.chains["early"], tt.chains["late"] = nil, nil
		tt.chains["sub"] = []rule{{terms: []term{markSetOr{1}}}}
		return tt
	}
	pkt := tracePacket{src: addr("10.0.0.1"), dst: addr("10.0.0.2"), proto: model.TCP, port: 80}
	for _, c := range []struct {
		name        string
		early, late []rule
		want        string
	}{
		{"empty chains accept", nil, nil, "accept"},
		{"accept ends only its base chain",
			[]rule{{terms: []term{verdictTerm{kind: expr.VerdictAccept}}}, {terms: []term{dropVerdict}}},
			[]rule{{terms: []term{dnatTo{netip.MustParseAddrPort("10.0.0.3:8080")}}}}, "dnat to 10.0.0.3:8080"},
		{"drop stops the packet", []rule{{terms: []term{dropVerdict}}}, []rule{{terms: []term{dnatTo{netip.MustParseAddrPort("10.0.0.3:8080")}}}}, "drop"},
		{"jump returns, goto does not",
			[]rule{{terms: []term{jumpTo("sub")}}, {terms: []term{markAndNonZero{1}, gotoChain("sub")}}, {terms: []term{dropVerdict}}},
			nil, "accept"},
		{"a failed match skips the rest of its rule",
			[]rule{{terms: []term{l4proto{unix.IPPROTO_UDP}, dropVerdict}}, {terms: []term{addrMatch{dir: saddr, neg: true, prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, dropVerdict}}},
			nil, "accept"},
		{"reject", []rule{{terms: []term{addrMatch{dir: daddr, prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32")}}, rejectTerm{}}}}, nil, "reject"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tt := mkTable()
			tt.chains["early"], tt.chains["late"] = c.early, c.late
			if got := tt.trace(t, pkt).String(); got != c.want {
				t.Errorf("trace = %s, want %s", got, c.want)
			}
		})
	}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
