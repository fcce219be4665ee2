package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// elemDef is one element of a static set or verdict map.
type elemDef struct {
	set string
	key string // raw key bytes, as the kernel stores them
	// value is the verdict of a map element in nft syntax ("goto service-...", "drop"),
	// "" for a set element.
	value   string
	comment string
}

// serviceObjects is everything one Service (all its ports) puts in the table.
type serviceObjects struct {
	chains []chainDef
	sets   []setDef // per-endpoint affinity sets
	elems  []elemDef
	// slots are the chains that keep their endpoints in an endpoint map; the planner
	// allocates their slots, then adds the elements.
	slots []slotUse
}

// slotUse is one chain's endpoints, to be put in the ranges of its block of an endpoint
// map (term.set; the planner allocates the block and sets term.base).
type slotUse struct {
	chain string
	term  *dnatMap
	eps   []model.Endpoint // range i holds eps[i]
}

// buildService computes the objects of one Service from its ports, or an error when the
// input cannot be programmed safely (it is then left as it is in the kernel and reported).
func buildService(c *layoutConfig, nodeIP netip.Addr, ports []*model.ServicePort) (*serviceObjects, error) {
	out := &serviceObjects{}
	for _, sp := range ports {
		if err := validateServicePort(c.f, sp); err != nil {
			return nil, fmt.Errorf("port %q/%s: %w", sp.Name.Port, sp.Name.Protocol, err)
		}
		buildServicePort(c, nodeIP, sp, out)
	}
	return out, nil
}

func validateServicePort(f *family, sp *model.ServicePort) error {
	switch sp.Name.Protocol {
	case model.TCP, model.UDP, model.SCTP:
	default:
		return fmt.Errorf("unsupported protocol %q", sp.Name.Protocol)
	}
	inFamily := func(a netip.Addr) bool { return a.IsValid() && (a.Unmap().Is4() == (f.addrLn == 4)) }
	if !inFamily(sp.ClusterIP) {
		return fmt.Errorf("clusterIP %v is not an %v address", sp.ClusterIP, f.model)
	}
	if sp.Port < 1 || sp.Port > 65535 {
		return fmt.Errorf("port %d out of range", sp.Port)
	}
	if sp.NodePort < 0 || sp.NodePort > 65535 {
		return fmt.Errorf("nodePort %d out of range", sp.NodePort)
	}
	for _, list := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerVIPs} {
		for _, a := range list {
			if !inFamily(a) {
				return fmt.Errorf("address %v is not an %v address", a, f.model)
			}
		}
	}
	for _, p := range sp.LoadBalancerSourceRanges {
		if !p.IsValid() || !inFamily(p.Addr()) {
			return fmt.Errorf("source range %v is not an %v prefix", p, f.model)
		}
	}
	for _, eps := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, ep := range eps {
			if !inFamily(ep.IP) || ep.Port < 1 || ep.Port > 65535 {
				return fmt.Errorf("endpoint %v is not a usable %v endpoint", ep, f.model)
			}
		}
	}
	if sp.AffinityTimeoutSeconds < 0 {
		return fmt.Errorf("session affinity timeout %d is negative", sp.AffinityTimeoutSeconds)
	}
	return nil
}

// buildServicePort follows upstream's per-service logic (syncProxyRules in
// pkg/proxy/nftables), so that the same Service yields the same chains and elements.
//
// The chains, their rules and the verdict map elements pointing at them depend on the
// Service's spec only, never on how many endpoints it has: adding a rule or a
// jump/goto element makes the kernel validate the whole table at commit, which costs
// milliseconds at 10 000 Services, while endpoints come and go every second in a
// large cluster. The endpoints are data (ranges of an endpoint map, see
// endpointRules); a policy chain without endpoints finds no range and lets the packet
// through untranslated, to the filter-stage checks (frontends), which drop (Local policy,
// none on this node) or reject (none anywhere) it as upstream does. Those decisions
// are data too: "drop" elements of the no-endpoint verdict maps, and elements of the
// reject sets (not upstream's "goto reject-chain" map elements, whose addition would
// validate the table).
func buildServicePort(c *layoutConfig, nodeIP netip.Addr, sp *model.ServicePort, out *serviceObjects) {
	b := newPortBuild(c, sp, out)
	b.hairpin()
	b.frontends()
	b.externalChain()
	b.firewallChain(nodeIP)
	b.affinityChains()
	b.endpointChains()
	b.packetCounters()
}

// portBuild is what the phases of buildServicePort share about one Service port.
type portBuild struct {
	c       *layoutConfig
	f       *family
	sp      *model.ServicePort
	out     *serviceObjects
	names   serviceChainNames
	proto   uint8
	port    uint16
	comment string

	hasEndpoints bool
	affinity     bool
	reachable    []*model.Endpoint
	usesFirewall bool
	// The chain ClusterIP traffic goes to, and whether it has endpoints to go to.
	internalChain string
	hasInternal   bool
	// The chain the external chain ends in, and whether it has endpoints to go to.
	externalPolicyChain string
	hasExternal         bool
}

func newPortBuild(c *layoutConfig, sp *model.ServicePort, out *serviceObjects) *portBuild {
	b := &portBuild{
		c: c, f: c.f, sp: sp, out: out,
		names:        chainNamesFor(sp.Name),
		proto:        protoNumber(sp.Name.Protocol),
		port:         uint16(sp.Port),
		comment:      truncateComment(sp.Name.String()),
		hasEndpoints: sp.HasAnyEndpoints,
		affinity:     sp.AffinityTimeoutSeconds > 0,
		reachable:    reachableEndpoints(sp),
		usesFirewall: len(sp.LoadBalancerVIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0,
	}
	clusterHas := sp.UsesClusterEndpoints() && len(sp.ClusterEndpoints) > 0
	localHas := sp.UsesLocalEndpoints() && len(sp.LocalEndpoints) > 0
	b.internalChain, b.hasInternal = b.names.cluster, b.hasEndpoints && clusterHas
	if sp.InternalPolicyLocal {
		b.internalChain, b.hasInternal = b.names.local, b.hasEndpoints && localHas
	}
	b.externalPolicyChain, b.hasExternal = b.names.cluster, b.hasEndpoints && clusterHas
	if sp.ExternalPolicyLocal {
		b.externalPolicyChain, b.hasExternal = b.names.local, b.hasEndpoints && localHas
	}
	return b
}

// add adds an element to one of the fixed sets or maps.
func (b *portBuild) add(set, key, value string, withComment bool) {
	e := elemDef{set: set, key: key, value: value}
	if withComment {
		e.comment = b.comment
	}
	b.out.elems = append(b.out.elems, e)
}

// ipKey is the address . protocol . port key of one of the port's addresses.
func (b *portBuild) ipKey(a netip.Addr) string { return keyAddrProtoPort(b.f, a, b.proto, b.port) }

// noEndpoints adds what stops traffic that has no endpoint to go to.
func (b *portBuild) noEndpoints(vmap, rejectSet, key string) {
	if b.hasEndpoints {
		b.add(vmap, key, "drop", true)
	} else {
		b.add(rejectSet, key, "", true)
	}
}

// hairpin: a pod reaching itself through the Service must be masqueraded, or its reply
// would never be un-DNATed.
func (b *portBuild) hairpin() {
	for _, ep := range b.reachable {
		if ep.IsLocal {
			b.out.elems = append(b.out.elems, elemDef{set: hairpinConnectionsSet,
				key: keyHairpin(b.f, ep.IP, b.proto, uint16(ep.Port))})
		}
	}
}

// frontends: the elements that send the port's ClusterIP, external IPs, LB IPs and
// NodePort to its chains, or drop or reject them without endpoints.
func (b *portBuild) frontends() {
	sp, names := b.sp, b.names
	b.add(clusterIPsSet, keyAddr(b.f, sp.ClusterIP), "", false)
	b.add(serviceIPsMap, b.ipKey(sp.ClusterIP), "goto "+b.internalChain, false)
	if !b.hasInternal {
		b.noEndpoints(noEndpointServicesMap, rejectServicesSet, b.ipKey(sp.ClusterIP))
	}
	for _, eip := range sp.ExternalIPs {
		b.add(serviceIPsMap, b.ipKey(eip), "goto "+names.external, false)
		if !b.hasExternal {
			b.noEndpoints(noEndpointServicesMap, rejectServicesSet, b.ipKey(eip))
		}
	}
	for _, lb := range sp.LoadBalancerVIPs {
		b.add(serviceIPsMap, b.ipKey(lb), "goto "+names.external, false)
		if b.usesFirewall {
			b.add(firewallIPsMap, b.ipKey(lb), "goto "+names.firewall, false)
		}
		if !b.hasExternal {
			b.noEndpoints(noEndpointServicesMap, rejectServicesSet, b.ipKey(lb))
		}
	}
	if sp.NodePort != 0 {
		npKey := keyProtoPort(b.proto, uint16(sp.NodePort))
		// NodePorts are not subject to loadBalancerSourceRanges (upstream behaviour).
		b.add(serviceNodePortsMap, npKey, "goto "+names.external, false)
		if !b.hasExternal {
			b.noEndpoints(noEndpointNodePortsMap, rejectNodePortsSet, npKey)
		}
	}
}

// externalChain: masquerade under Cluster policy; under Local policy keep the client
// address, except for traffic from pods and from the node itself, which is sent to all
// endpoints as if it had gone out to a load balancer and come back.
func (b *portBuild) externalChain() {
	sp, c, f, names, out := b.sp, b.c, b.f, b.names, b.out
	if !sp.ExternallyAccessible() {
		return
	}
	var rules []rule
	if !sp.ExternalPolicyLocal {
		rules = append(rules, rule{terms: []term{markSetOr{c.mark}}, comment: "masquerade"})
	} else {
		// An externally accessible port always has the Cluster chain (see
		// UsesClusterEndpoints); when it has no endpoints, neither has the Local one.
		shortCircuit := names.cluster
		if !c.localDetector.IsNoOp() {
			rules = append(rules, rule{terms: []term{localMatch(f, c.localDetector, false), gotoChain(shortCircuit)},
				comment: "short-circuit pod traffic"})
		}
		rules = append(rules, rule{terms: []term{fibLocal{saddr}, markSetOr{c.mark}}, comment: "masquerade local traffic"})
		rules = append(rules, rule{terms: []term{fibLocal{saddr}, gotoChain(shortCircuit)},
			comment: "short-circuit local traffic"})
	}
	rules = append(rules, rule{terms: []term{gotoChain(b.externalPolicyChain)}})
	out.chains = append(out.chains, chainDef{name: names.external, rules: counted(sp, rules)})
}

// firewallChain drops what comes to an LB IP from outside its source ranges.
func (b *portBuild) firewallChain(nodeIP netip.Addr) {
	sp, names, out := b.sp, b.names, b.out
	if !b.usesFirewall {
		return
	}
	sources := slices.Clone(sp.LoadBalancerSourceRanges)
	allowFromNode := false
	for _, p := range sp.LoadBalancerSourceRanges {
		if nodeIP.IsValid() && p.Contains(nodeIP) {
			allowFromNode = true
		}
	}
	// A VIP often is a local address too; a request from the node to it then comes
	// back with the VIP as its source, and must be let through.
	if allowFromNode {
		for _, lb := range sp.LoadBalancerVIPs {
			sources = append(sources, netip.PrefixFrom(lb, lb.BitLen()))
		}
	}
	out.chains = append(out.chains, chainDef{name: names.firewall, rules: []rule{{
		terms: []term{addrMatch{dir: saddr, neg: true, prefixes: sources, braces: true}, dropVerdict},
	}}})
}

// affinityChains: with session affinity, one chain per endpoint records the client in the
// endpoint's affinity set.
func (b *portBuild) affinityChains() {
	sp, f, proto, out := b.sp, b.f, b.proto, b.out
	if !b.affinity {
		return
	}
	timeout := time.Duration(sp.AffinityTimeoutSeconds) * time.Second
	for _, ep := range b.reachable {
		base := endpointNameBase(sp.Name, ep.AddrPort())
		// "dynamic" must be set: some kernels add it to a set that the datapath
		// updates, and a later "add" without it would then fail as a change of flags.
		out.sets = append(out.sets, setDef{name: affinitySetPrefix + base,
			flags: unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL, keyType: f.addrType,
			keyLen: uint32(f.addrLn), timeout: timeout})
		out.chains = append(out.chains, chainDef{name: endpointChainPrefix + base, rules: []rule{
			{terms: []term{updateSaddr{affinitySetPrefix + base}}},
			{terms: []term{l4proto{proto}, dnatTo{ep.AddrPort()}}},
		}})
	}
}

// endpointChains: the policy chains, which DNAT to a range of an endpoint map.
func (b *portBuild) endpointChains() {
	sp, f, names, proto, out, affinity := b.sp, b.f, b.names, b.proto, b.out, b.affinity
	if sp.UsesClusterEndpoints() {
		out.chains = append(out.chains, chainDef{name: names.cluster, rules: counted(sp, endpointRules(f, sp, proto, names.cluster, sp.ClusterEndpoints, affinity, out))})
	}
	if sp.UsesLocalEndpoints() {
		out.chains = append(out.chains, chainDef{name: names.local, rules: counted(sp, endpointRules(f, sp, proto, names.local, sp.LocalEndpoints, affinity, out))})
	}
}

// counted puts a traffic counter first in a path chain of a Counted port. The path
// chains are nat chains, which netfilter runs for the first packet of a connection only:
// the counter's packets are the path's new connections (README, "Traffic counters").
// Its own rule, so that the other rules are the same with or without it.
func counted(sp *model.ServicePort, rules []rule) []rule {
	if !sp.Counted {
		return rules
	}
	return append([]rule{{terms: []term{counterTerm{}}}}, rules...)
}

// packetCounters: a Counted port's packet counter chains, one counter each, and the
// elements of the packet counter maps that lead to them. A connection's packets count on
// one path, by the address the client sent them to: the ClusterIP on the path its
// internal policy picks, an external IP, LoadBalancer IP or NodePort on "external"
// (README, "Traffic counters").
func (b *portBuild) packetCounters() {
	sp := b.sp
	if !sp.Counted {
		return
	}
	internal, external := packetChains(sp)
	counter := []rule{{terms: []term{counterTerm{}}}}
	b.out.chains = append(b.out.chains, chainDef{name: internal.Chain, rules: counter})
	b.add(packetCountersMap, b.ipKey(sp.ClusterIP), "goto "+internal.Chain, false)
	if !sp.ExternallyAccessible() {
		return
	}
	b.out.chains = append(b.out.chains, chainDef{name: external.Chain, rules: counter})
	for _, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerVIPs) {
		b.add(packetCountersMap, b.ipKey(a), "goto "+external.Chain, false)
	}
	if sp.NodePort != 0 {
		b.add(packetCountersNodePortMap, keyProtoPort(b.proto, uint16(sp.NodePort)), "goto "+external.Chain, false)
	}
}

// packetChains returns a Counted port's packet counter chains: the ClusterIP's (path
// cluster, or local under internalTrafficPolicy Local) and the external addresses'.
func packetChains(sp *model.ServicePort) (internal, external dataplane.ChainPath) {
	base := servicePortNameBase(sp.Name)
	internal = dataplane.ChainPath{Chain: countClusterChainPrefix + base, Path: dataplane.PathCluster, EveryPacket: true}
	if sp.InternalPolicyLocal {
		internal = dataplane.ChainPath{Chain: countLocalChainPrefix + base, Path: dataplane.PathLocal, EveryPacket: true}
	}
	external = dataplane.ChainPath{Chain: countExternalChainPrefix + base, Path: dataplane.PathExternal, EveryPacket: true}
	return internal, external
}

// countedChains returns the chains of a Counted port that carry a counter, and their paths.
func countedChains(sp *model.ServicePort) []dataplane.ChainPath {
	names := chainNamesFor(sp.Name)
	var out []dataplane.ChainPath
	if sp.UsesClusterEndpoints() {
		out = append(out, dataplane.ChainPath{Chain: names.cluster, Path: dataplane.PathCluster})
	}
	if sp.UsesLocalEndpoints() {
		out = append(out, dataplane.ChainPath{Chain: names.local, Path: dataplane.PathLocal})
	}
	internal, external := packetChains(sp)
	out = append(out, internal)
	if sp.ExternallyAccessible() {
		out = append(out, dataplane.ChainPath{Chain: names.external, Path: dataplane.PathExternal}, external)
	}
	return out
}

// reachableEndpoints returns every endpoint either list may send traffic to, once.
// Local endpoints are usually a subset of the cluster ones; the lists are only merged
// when they are not.
func reachableEndpoints(sp *model.ServicePort) []*model.Endpoint {
	out := make([]*model.Endpoint, 0, len(sp.ClusterEndpoints)+len(sp.LocalEndpoints))
	for i := range sp.ClusterEndpoints {
		out = append(out, &sp.ClusterEndpoints[i])
	}
	if len(sp.LocalEndpoints) == 0 {
		return out
	}
	var seen map[netip.AddrPort]bool
	if len(out) > 16 {
		seen = make(map[netip.AddrPort]bool, len(out))
		for _, ep := range out {
			seen[ep.AddrPort()] = true
		}
	}
	for i := range sp.LocalEndpoints {
		ep := &sp.LocalEndpoints[i]
		ap := ep.AddrPort()
		var dup bool
		if seen != nil {
			dup = seen[ap]
		} else {
			dup = slices.ContainsFunc(out, func(o *model.Endpoint) bool { return o.AddrPort() == ap })
		}
		if !dup {
			out = append(out, ep)
		}
	}
	return out
}

// cascadeMax is the largest endpoint count of a Service with session affinity picked
// by a cascade of rules ("numgen random mod (N-i) 0 goto endpoint-i") rather than an
// anonymous verdict map. A rule using an anonymous map costs, when added, a scan of every
// set of the table (the kernel names an anonymous set by parsing the names of all the
// others), which makes a large table load in quadratic time; a cascade costs a rule per
// endpoint and evaluates N/2 of them, on average, on the first packet of a connection.
const cascadeMax = 64

// endpointRules picks one endpoint per new connection.
//
// Without session affinity: "dnat to numgen random mod 2^20 offset B map @endpoints-XX",
// whatever the number of endpoints (none, one or many). The chain owns the block
// B..B+2^20-1 of one of endpointMaps shared interval maps (chosen by a hash of the chain
// name); its N endpoints are N ranges splitting the block evenly. Every endpoint change
// (a move, one more, one less, the first, the last) is then a change of map elements,
// never of a rule. That matters at scale: adding any rule, or a verdict map element that
// jumps to a chain, makes the kernel validate the whole table at commit (milliseconds at
// 10 000 Services), while changing a data map element does not. Why shared maps and not
// one per Service (or upstream's anonymous map in the rule): the kernel keeps a table's
// sets in a list and finds them by name, or names an anonymous one by parsing every
// other name, so 10 000 per-Service sets make a load quadratic; and a rule binding a map
// from a new chain makes the kernel check every element of the map, so a single shared
// map would be quadratic too. With 256 maps both costs stay small.
//
// With session affinity: the client's recent endpoint first, then a cascade (or an
// anonymous verdict map above cascadeMax) over the endpoint chains; its endpoint changes
// rewrite rules.
func endpointRules(f *family, sp *model.ServicePort, proto byte, chain string, eps []model.Endpoint, affinity bool, out *serviceObjects) []rule {
	n := len(eps)
	if !affinity {
		// The model's endpoint list itself (immutable once published): the backend's
		// records keep it rather than a copy of every endpoint.
		out.slots = append(out.slots, slotUse{chain: chain, term: &dnatMap{set: endpointMapOf(chain)}, eps: eps})
		use := &out.slots[len(out.slots)-1]
		return []rule{{terms: []term{l4proto{proto}, use.term}}}
	}
	if n == 0 {
		return nil
	}
	rules := make([]rule, 0, 2*n)
	chains := make([]string, n)
	for i, ep := range eps {
		base := endpointNameBase(sp.Name, ep.AddrPort())
		chains[i] = endpointChainPrefix + base
		rules = append(rules, rule{terms: []term{addrInSet{dir: saddr, set: affinitySetPrefix + base}, gotoChain(chains[i])}})
	}
	if n > cascadeMax {
		return append(rules, rule{terms: []term{numgenVmap{chains}}})
	}
	for i := range chains {
		if i == n-1 {
			rules = append(rules, rule{terms: []term{gotoChain(chains[i])}})
		} else {
			rules = append(rules, rule{terms: []term{numgenIsZero{n - i}, gotoChain(chains[i])}})
		}
	}
	return rules
}

// Element keys, encoded as the kernel stores them: each part of a concatenation padded
// to a multiple of four bytes, addresses and ports in network order.

func keyAddr(f *family, a netip.Addr) string { return string(f.addrBytes(a)) }

func keyAddrProtoPort(f *family, a netip.Addr, proto byte, port uint16) string {
	b := f.addrBytes(a)
	b = append(b, proto, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
	return string(b)
}

func keyProtoPort(proto byte, port uint16) string {
	return string([]byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0})
}

func keyHairpin(f *family, a netip.Addr, proto byte, port uint16) string {
	b := f.addrBytes(a)
	b = append(b, f.addrBytes(a)...)
	b = append(b, proto, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
	return string(b)
}

// renderKey shows a key of a set or map in nft syntax.
func renderKey(f *family, set, key string) string {
	b := []byte(key)
	addr := func(i int) string {
		if i+f.addrLn > len(b) {
			return "?"
		}
		a, _ := netip.AddrFromSlice(b[i : i+f.addrLn])
		return a.String()
	}
	protoPort := func(i int) string {
		if i+8 > len(b) {
			return "?"
		}
		return protoName(b[i]) + " . " + itoa(int(b[i+4])<<8|int(b[i+5]))
	}
	switch set {
	case clusterIPsSet, nodePortIPsSet:
		return addr(0)
	case hairpinConnectionsSet:
		return addr(0) + " . " + addr(f.addrLn) + " . " + protoPort(2*f.addrLn)
	case serviceIPsMap, firewallIPsMap, noEndpointServicesMap, rejectServicesSet, packetCountersMap:
		return addr(0) + " . " + protoPort(f.addrLn)
	case serviceNodePortsMap, noEndpointNodePortsMap, rejectNodePortsSet, packetCountersNodePortMap:
		return protoPort(0)
	}
	if isEndpointMap(set) {
		switch len(b) {
		case 8: // a range [lo, hi): nft writes "lo-(hi-1)"
			lo, hi := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
			return strconv.FormatUint(uint64(lo), 10) + "-" + strconv.FormatUint(uint64(hi)-1, 10)
		case 4:
			return strconv.FormatUint(uint64(binary.BigEndian.Uint32(b)), 10)
		case 5:
			return "end " + strconv.FormatUint(uint64(binary.BigEndian.Uint32(b)), 10)
		}
	}
	return fmt.Sprintf("0x%x", b)
}

// renderValue shows an element value in nft syntax: a verdict as it is, raw data (an
// endpoint map's value) as address . port.
func renderValue(f *family, value string) string {
	if !strings.HasPrefix(value, "=") {
		return value
	}
	b := []byte(value[1:])
	if len(b) != f.addrLn+4 {
		return fmt.Sprintf("0x%x", b)
	}
	a, _ := netip.AddrFromSlice(b[:f.addrLn])
	return a.String() + " . " + itoa(int(b[f.addrLn])<<8|int(b[f.addrLn+1]))
}
