package nftables

import (
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// chainDef is a chain we want: its rules in order, and for a base chain its hook.
type chainDef struct {
	name    string
	base    *baseSpec
	comment string
	rules   []rule
}

// baseSpec is what attaches a base chain to a netfilter hook.
type baseSpec struct {
	typ      string // "filter" or "nat"
	hook     uint32
	priority int32
}

// Named priorities (nft's "dstnat", "filter", "srcnat").
const (
	priorityDstNAT = -100
	priorityFilter = 0
	prioritySrcNAT = 100
)

// setDef is a named set or map we want.
type setDef struct {
	name     string
	flags    uint32 // NFT_SET_MAP, NFT_SET_TIMEOUT, NFT_SET_EVAL
	keyType  uint32
	keyLen   uint32
	dataType uint32
	dataLen  uint32
	timeout  time.Duration
	comment  string
	// udata replaces the userdata nft reads to print the set (see endpointMapUdata).
	udata []byte
}

// sameKind reports whether the kernel object s can stand for d: equal types, lengths,
// flags and timeout. Comments and nft's private userdata do not matter.
func (d *setDef) sameKind(s *setDef) bool {
	return d.flags == s.flags && d.keyType == s.keyType && d.keyLen == s.keyLen &&
		d.dataType == s.dataType && d.dataLen == s.dataLen && d.timeout == s.timeout
}

// layoutConfig is what the fixed part of the table depends on.
type layoutConfig struct {
	f             *family
	mark          uint32
	masqueradeAll bool
	localDetector dataplane.LocalDetector
	// nodePortMatchAll: NodePorts answer on every local address ("fib daddr type local")
	// rather than on the addresses in @nodeport-ips.
	nodePortMatchAll bool
	// nodePortCIDRs select the local addresses that go in @nodeport-ips otherwise.
	nodePortCIDRs []netip.Prefix
	serviceCIDRs  []netip.Prefix
	// countPackets: some Service port is Counted; the packet counter maps and the rules
	// that look them up exist only then (README, "Traffic counters").
	countPackets bool
}

// The base chains: upstream's hooks and priorities. The filter chains that must see the
// destination before DNAT (loadBalancerSourceRanges) run at dstnat-10; the reject/drop
// checks run at filter priority, after DNAT, so that only traffic no Service took is
// rejected or dropped.
var baseChains = []struct {
	name string
	spec baseSpec
}{
	{filterPreroutingPreDNATChain, baseSpec{"filter", unix.NF_INET_PRE_ROUTING, priorityDstNAT - 10}},
	{filterOutputPreDNATChain, baseSpec{"filter", unix.NF_INET_LOCAL_OUT, priorityDstNAT - 10}},
	{filterInputChain, baseSpec{"filter", unix.NF_INET_LOCAL_IN, priorityFilter}},
	{filterForwardChain, baseSpec{"filter", unix.NF_INET_FORWARD, priorityFilter}},
	{filterOutputChain, baseSpec{"filter", unix.NF_INET_LOCAL_OUT, priorityFilter}},
	{natPreroutingChain, baseSpec{"nat", unix.NF_INET_PRE_ROUTING, priorityDstNAT}},
	{natOutputChain, baseSpec{"nat", unix.NF_INET_LOCAL_OUT, priorityDstNAT}},
	{natPostroutingChain, baseSpec{"nat", unix.NF_INET_POST_ROUTING, prioritySrcNAT}},
}

// jumps lists, in order, the rules of the base chains: which regular chain each jumps
// to, and whether only new connections do. Reject is only valid in input, forward and
// output with kernels before 5.9, hence the endpoint checks there rather than in
// prerouting.
var jumps = []struct {
	from, to string
	newOnly  bool
}{
	{filterInputChain, nodePortEndpointsCheckChain, true},
	{filterInputChain, serviceEndpointsCheckChain, true},
	{filterForwardChain, serviceEndpointsCheckChain, true},
	{filterOutputChain, serviceEndpointsCheckChain, true},
	{filterPreroutingPreDNATChain, firewallCheckChain, true},
	{filterOutputPreDNATChain, firewallCheckChain, true},
	{natOutputChain, servicesChain, false},
	{natPreroutingChain, servicesChain, false},
	{natPostroutingChain, masqueradingChain, false},
	{filterForwardChain, clusterIPsCheckChain, true},
	{filterOutputChain, clusterIPsCheckChain, true},
}

// staticSets returns the named sets and maps every table has.
func staticSets(c *layoutConfig) []setDef {
	f := c.f
	addrProtoPort := concatType(f.addrType, typeInetProto, typeInetService)
	addrProtoPortLen := uint32(f.addrLn) + 8
	protoPort := concatType(typeInetProto, typeInetService)
	vmap := func(name string, keyType, keyLen uint32, comment string) setDef {
		return setDef{name: name, flags: unix.NFT_SET_MAP, keyType: keyType, keyLen: keyLen,
			dataType: dataTypeVerdict, comment: comment}
	}
	sets := []setDef{
		{name: clusterIPsSet, keyType: f.addrType, keyLen: uint32(f.addrLn), comment: "Active ClusterIPs"},
		{name: hairpinConnectionsSet, keyType: concatType(f.addrType, f.addrType, typeInetProto, typeInetService),
			keyLen: 2*uint32(f.addrLn) + 8, comment: "service hairpin connections"},
		vmap(firewallIPsMap, addrProtoPort, addrProtoPortLen, "destinations that are subject to LoadBalancerSourceRanges"),
		vmap(noEndpointNodePortsMap, protoPort, 8, "vmap to drop or reject packets to service nodeports with no endpoints"),
		vmap(noEndpointServicesMap, addrProtoPort, addrProtoPortLen, "vmap to drop or reject packets to services with no endpoints"),
		vmap(serviceIPsMap, addrProtoPort, addrProtoPortLen, "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
		vmap(serviceNodePortsMap, protoPort, 8, "NodePort traffic"),
		{name: rejectServicesSet, keyType: addrProtoPort, keyLen: addrProtoPortLen, comment: "services with no endpoints: reject"},
		{name: rejectNodePortsSet, keyType: protoPort, keyLen: 8, comment: "service nodeports with no endpoints: reject"},
	}
	for i := 0; i < endpointMaps; i++ {
		sets = append(sets, setDef{name: endpointMapName(i), flags: unix.NFT_SET_MAP | unix.NFT_SET_INTERVAL, keyType: typeInteger, keyLen: 4,
			dataType: concatType(f.addrType, typeInetService), dataLen: uint32(f.addrLn) + 4,
			udata: endpointMapUdata(f)})
	}
	if !c.nodePortMatchAll {
		sets = append(sets, setDef{name: nodePortIPsSet, keyType: f.addrType, keyLen: uint32(f.addrLn),
			comment: "IPs that accept NodePort traffic"})
	}
	if c.countPackets {
		sets = append(sets,
			vmap(packetCountersMap, addrProtoPort, addrProtoPortLen, "packet counters of counted Service IPs"),
			vmap(packetCountersNodePortMap, protoPort, 8, "packet counters of counted NodePorts"))
	}
	return sets
}

// staticChains returns the base chains and the fixed regular chains with their rules.
func staticChains(c *layoutConfig) []chainDef {
	f := c.f
	var out []chainDef
	rulesOf := map[string][]rule{}
	for _, j := range jumps {
		r := rule{terms: []term{jumpTo(j.to)}}
		if j.newOnly {
			r.terms = []term{ctStateNew{}, jumpTo(j.to)}
		}
		rulesOf[j.from] = append(rulesOf[j.from], r)
	}
	if c.countPackets {
		// Before DNAT every packet a client sends still has the Service's address and
		// port: these lookups count the original direction of each connection (README,
		// "Traffic counters"). After the firewall check, so dropped packets do not count.
		for _, chain := range []string{filterPreroutingPreDNATChain, filterOutputPreDNATChain} {
			rulesOf[chain] = append(rulesOf[chain], packetCounterRules(c)...)
		}
	}
	for _, bc := range baseChains {
		spec := bc.spec
		out = append(out, chainDef{name: bc.name, base: &spec, rules: rulesOf[bc.name]})
	}

	notLoopback := addrMatch{dir: daddr, neg: true, prefixes: []netip.Prefix{f.loopback}}

	var services []rule
	switch {
	case c.masqueradeAll:
		services = append(services, rule{
			terms:   []term{addrInSet{dir: daddr, set: clusterIPsSet}, markSetOr{c.mark}},
			comment: "masquerade all clusterIP traffic",
		})
	case !c.localDetector.IsNoOp():
		// Off-cluster traffic to a ClusterIP (someone routed the Service range to this
		// node) may come back through another node, so it is masqueraded.
		services = append(services, rule{
			terms:   []term{addrInSet{dir: daddr, set: clusterIPsSet}, localMatch(f, c.localDetector, true), markSetOr{c.mark}},
			comment: "masquerade clusterIP traffic from outside cluster",
		})
	}
	services = append(services, rule{terms: []term{addrProtoPortLookup{set: serviceIPsMap, vmap: true}}})
	if c.nodePortMatchAll {
		services = append(services, rule{terms: []term{fibLocal{daddr}, notLoopback, protoPortLookup{set: serviceNodePortsMap, vmap: true}}})
	} else {
		services = append(services, rule{terms: []term{addrInSet{dir: daddr, set: nodePortIPsSet}, protoPortLookup{set: serviceNodePortsMap, vmap: true}}})
	}

	clusterIPsCheck := rejectRules("Reject traffic to invalid ports of ClusterIPs", addrInSet{dir: daddr, set: clusterIPsSet})
	if len(c.serviceCIDRs) > 0 {
		clusterIPsCheck = append(clusterIPsCheck, rule{
			terms:   []term{addrMatch{dir: daddr, prefixes: c.serviceCIDRs, braces: true}, dropVerdict},
			comment: "Drop traffic to unallocated ClusterIPs",
		})
	}

	var nodePortAddrMatch term = notLoopback
	if !c.nodePortMatchAll {
		nodePortAddrMatch = addrInSet{dir: daddr, set: nodePortIPsSet}
	}
	nodePortChecks := []rule{
		{terms: []term{nodePortAddrMatch, protoPortLookup{set: noEndpointNodePortsMap, vmap: true}}},
		{terms: []term{nodePortAddrMatch, protoPortLookup{set: rejectNodePortsSet}, gotoChain(rejectChain)}},
	}

	out = append(out,
		chainDef{name: servicesChain, rules: services},
		chainDef{name: masqueradingChain, rules: []rule{
			{terms: []term{markAndNonZero{c.mark}, markSetXor{c.mark}, masqueradeFullyRandom{}}},
			{terms: []term{ctStatusDNAT{}, hairpinMatch{}, masqueradeFullyRandom{}}},
		}},
		chainDef{name: clusterIPsCheckChain, rules: clusterIPsCheck},
		chainDef{name: firewallCheckChain, rules: []rule{{terms: []term{addrProtoPortLookup{set: firewallIPsMap, vmap: true}}}}},
		chainDef{name: serviceEndpointsCheckChain, rules: []rule{
			{terms: []term{addrProtoPortLookup{set: noEndpointServicesMap, vmap: true}}},
			{terms: []term{addrProtoPortLookup{set: rejectServicesSet}, gotoChain(rejectChain)}},
		}},
		chainDef{name: nodePortEndpointsCheckChain, rules: nodePortChecks},
		chainDef{name: rejectChain, comment: "helper for @no-endpoint-services / @no-endpoint-nodeports",
			rules: rejectRules("")},
	)
	return out
}

// packetCounterRules look a packet up in the packet counter maps, NodePorts on the
// addresses the services chain takes them on. The verdicts are "goto": a packet counts
// once, and the base chain ends with it.
func packetCounterRules(c *layoutConfig) []rule {
	nodePorts := []term{fibLocal{daddr}, addrMatch{dir: daddr, neg: true, prefixes: []netip.Prefix{c.f.loopback}}}
	if !c.nodePortMatchAll {
		nodePorts = []term{addrInSet{dir: daddr, set: nodePortIPsSet}}
	}
	return []rule{
		{terms: []term{addrProtoPortLookup{set: packetCountersMap, vmap: true}}},
		{terms: append(nodePorts, protoPortLookup{set: packetCountersNodePortMap, vmap: true})},
	}
}

// localMatch returns the term matching traffic from this node's pods (neg: traffic not
// from them), following the detector.
func localMatch(f *family, d dataplane.LocalDetector, neg bool) term {
	switch d.Mode {
	case dataplane.DetectLocalBridgeInterface:
		return iifname{name: d.Interface, neg: neg}
	case dataplane.DetectLocalInterfaceNamePrefix:
		return iifname{name: d.Interface + "*", neg: neg}
	}
	return addrMatch{dir: saddr, neg: neg, prefixes: d.CIDRs}
}

// nodePortAddrs returns the local addresses that accept NodePorts when nodePortAddresses
// is not match-all: the addresses of this family inside its CIDRs, never a loopback
// address (nftables mode has no localhost NodePorts).
func nodePortAddrs(f *family, cidrs []netip.Prefix, local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		a = a.Unmap()
		if (a.Is4() != (f.addrLn == 4)) || a.IsLoopback() {
			continue
		}
		for _, c := range cidrs {
			if c.Contains(a) {
				out = append(out, a)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// endpointMapUdata is the userdata nft 1.0 writes for a map declared "typeof numgen
// random mod 1048576 : ip daddr . th dport" (ip6 daddr for IPv6; th, not tcp, because TCP,
// UDP and SCTP Services share the maps). Without it nft cannot print
// an integer-keyed map, nor load a rule that uses one, so `nft list ruleset` output
// would not load back. The kernel ignores it. TLVs (type, length, value), values
// host-order: key byte order (host), data byte order, the key's typeof (expression
// numgen: mode random, modulus endpointBlockSize, offset 0), the data's typeof (a concatenation of
// payload ip/ip6 daddr and payload th dport), data interval (no).
func endpointMapUdata(f *family) []byte {
	ipDesc, daddrField := byte(12), byte(12) // nft's proto_ip and its daddr template
	if f.addrLn == 16 {
		ipDesc, daddrField = 13, 9 // proto_ip6 and its daddr template
	}
	return []byte{
		0, 4, 1, 0, 0, 0, // NFTNL_UDATA_SET_KEYBYTEORDER: host
		1, 4, 0, 0, 0, 0, // NFTNL_UDATA_SET_DATABYTEORDER
		3, 26, // NFTNL_UDATA_SET_KEY_TYPEOF
		0, 4, 23, 0, 0, 0, // expression: numgen
		1, 18, 0, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0x10, 0, 2, 4, 0, 0, 0, 0, // random, mod 2^20 (host order), offset 0
		4, 52, // NFTNL_UDATA_SET_DATA_TYPEOF
		0, 4, 13, 0, 0, 0, // expression: concatenation
		1, 44,
		0, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, ipDesc, 0, 0, 0, 1, 4, daddrField, 0, 0, 0, // payload ip(6) daddr
		1, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, 11, 0, 0, 0, 1, 4, 2, 0, 0, 0, // payload th dport
		6, 4, 0, 0, 0, 0, // NFTNL_UDATA_SET_DATA_INTERVAL
	}
}
