package ipvs

import (
	"net/netip"
	"slices"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// What one Service asks of the kernel, computed without touching it.

// planEnv is what a Service's kernel objects depend on besides the Service: the node's
// addresses and the configuration. It changes only on full syncs.
type planEnv struct {
	family model.IPFamily
	// scheduler is the configured default scheduler (ipvs.scheduler).
	scheduler string
	// nodePortIPs are the addresses NodePort virtual servers listen on: the node's addresses
	// of this family (nodePortAddresses applied), never loopback or link-local ones, and never
	// the dummy device's.
	nodePortIPs []netip.Addr
	// localAddrs are every address on a link other than the dummy device. An externalIP or
	// LoadBalancer IP among them is already local and is not bound to the dummy device.
	localAddrs map[netip.Addr]bool
	// nodeIP is the family's primary node IP: a loadBalancerSourceRanges entry that contains
	// it also admits the node itself.
	nodeIP netip.Addr
}

// desiredVS is one virtual server a Service needs.
type desiredVS struct {
	key    vsKey
	params vsParams
	// bind asks for key.Addr on the dummy device.
	bind bool
	// realServers are the endpoints, sorted, without duplicates (weight 1 each).
	realServers []netip.AddrPort
	// port is the Service port it serves, for logs and errors.
	port model.ServicePortName
	// udpLike is true for UDP and SCTP: real servers leave at once, without draining.
	udpLike bool
}

// setMember is one ipset entry a Service needs.
type setMember struct {
	set   ipsetID
	entry setEntry
}

// outFilterRule is one KUBE-IPVS-OUT-FILTER drop: node-originated traffic to a LoadBalancer
// IP whose source ranges do not include the node.
type outFilterRule struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

// serviceRecord is everything one Service (all its ports of this family) needs.
type serviceRecord struct {
	vss       []desiredVS // sorted by key, unique
	members   []setMember
	outFilter []outFilterRule
}

// vs returns the desired virtual server with key k, or nil.
func (r *serviceRecord) vs(k vsKey) *desiredVS {
	if r == nil {
		return nil
	}
	i, ok := slices.BinarySearchFunc(r.vss, k, func(d desiredVS, k vsKey) int { return compareVSKeys(d.key, k) })
	if !ok {
		return nil
	}
	return &r.vss[i]
}

// buildRecord computes a Service's record from its ports. It is pure.
//
// Real servers per frontend (see docs/ipvs.md for the differences from upstream):
//   - ClusterIP: the Local endpoints when internalTrafficPolicy is Local (none: the virtual
//     server has no real server and IPVS answers "port unreachable"; for TCP it goes into
//     setNoEndpointsTCP, whose filter rule answers with a reset first), else the Cluster ones.
//   - NodePorts, externalIPs and LoadBalancer IPs: the Cluster endpoints, or with
//     externalTrafficPolicy Local the Local ones; when there is no Local one, the Cluster ones
//     (upstream's fallback, which keeps the Service working for pods and for the node) and
//     the frontend goes into setNoLocalEndpoints, whose firewall rule drops the same traffic
//     from anywhere else.
func buildRecord(ports []*model.ServicePort, env *planEnv) *serviceRecord {
	b := &recordBuilder{env: env, r: &serviceRecord{}, seen: map[vsKey]bool{}}
	for _, sp := range ports {
		pb, ok := b.port(sp)
		if !ok {
			continue
		}
		pb.hairpin()
		pb.clusterIP()
		pb.externalIPs()
		pb.loadBalancers()
		pb.nodePorts()
		if sp.HealthCheckNodePort != 0 {
			b.member(setHealthCheckNodePort, setEntry{Port: uint16(sp.HealthCheckNodePort)})
		}
	}
	slices.SortFunc(b.r.vss, func(a, b desiredVS) int { return compareVSKeys(a.key, b.key) })
	return b.r
}

// recordBuilder collects one Service's record while buildRecord walks its ports.
type recordBuilder struct {
	env  *planEnv
	r    *serviceRecord
	seen map[vsKey]bool // virtual servers already added: the first port to claim a frontend wins
}

// addVS adds a virtual server unless its address or port is unusable or it is already there.
func (b *recordBuilder) addVS(sp *model.ServicePort, addr netip.Addr, port int32, bind bool, eps []netip.AddrPort, params vsParams) {
	k := vsKey{Proto: sp.Name.Protocol, Addr: addr, Port: uint16(port)}
	if !addr.IsValid() || port <= 0 || port > 65535 || b.seen[k] {
		return
	}
	b.seen[k] = true
	if len(eps) == 0 && sp.Name.Protocol == model.TCP {
		b.member(setNoEndpointsTCP, setEntry{IP: addr, Proto: protoNumber(model.TCP), Port: uint16(port)})
	}
	b.r.vss = append(b.r.vss, desiredVS{
		key: k, params: params, bind: bind, realServers: eps, port: sp.Name,
		udpLike: sp.Name.Protocol != model.TCP,
	})
}

// member adds an entry to an ipset, normalised for the set's type.
func (b *recordBuilder) member(set ipsetID, e setEntry) {
	b.r.members = append(b.r.members, setMember{set: set, entry: e.normalize(ipsets[set].typ)})
}

// portBuild is what one Service port's frontends share: the virtual server parameters and
// the real servers behind internal and external traffic.
type portBuild struct {
	*recordBuilder
	sp         *model.ServicePort
	proto      uint8
	params     vsParams
	internalRS []netip.AddrPort
	externalRS []netip.AddrPort
	// noLocal: externalTrafficPolicy Local, no local endpoint, but endpoints elsewhere.
	noLocal bool
}

// port decides a port's scheduling and real servers; false for a protocol IPVS cannot serve.
func (b *recordBuilder) port(sp *model.ServicePort) (*portBuild, bool) {
	proto := protoNumber(sp.Name.Protocol)
	if proto == 0 {
		return nil, false
	}
	params := vsParams{Scheduler: b.env.scheduler}
	if sp.Scheduler != "" {
		params.Scheduler = sp.Scheduler
	}
	if sp.AffinityTimeoutSeconds > 0 {
		params.Flags |= flagPersistent
		params.Timeout = uint32(sp.AffinityTimeoutSeconds)
	}
	if params.Scheduler == "mh" {
		params.Flags |= flagSched2
	}

	internal := sp.ClusterEndpoints
	if sp.InternalPolicyLocal {
		internal = sp.LocalEndpoints
	}
	external := sp.ClusterEndpoints
	noLocal := false
	if sp.ExternalPolicyLocal {
		external = sp.LocalEndpoints
		if len(external) == 0 {
			external = sp.ClusterEndpoints
			// Without any endpoint the virtual server has no real server and IPVS
			// refuses everyone; only endpoints elsewhere call for the drop.
			noLocal = sp.HasAnyEndpoints
		}
	}
	return &portBuild{
		recordBuilder: b, sp: sp, proto: proto, params: params,
		internalRS: realServers(internal, b.env.family),
		externalRS: realServers(external, b.env.family),
		noLocal:    noLocal,
	}, true
}

// hairpin: a local endpoint reaching itself through the Service is masqueraded.
func (p *portBuild) hairpin() {
	for _, ep := range p.sp.AllEndpoints {
		if ep.IsLocal && validEndpoint(ep, p.env.family) {
			p.member(setLoopBack, setEntry{IP: ep.IP, Proto: p.proto, Port: uint16(ep.Port), IP2: ep.IP})
		}
	}
}

func (p *portBuild) clusterIP() {
	sp := p.sp
	if sp.ClusterIP.IsValid() && model.FamilyOf(sp.ClusterIP) == p.env.family {
		p.member(setClusterIP, setEntry{IP: sp.ClusterIP, Proto: p.proto, Port: uint16(sp.Port)})
		p.addVS(sp, sp.ClusterIP, sp.Port, true, p.internalRS, p.params)
	}
}

func (p *portBuild) externalIPs() {
	p.externalAddrs(p.sp.ExternalIPs, func(_ netip.Addr, e setEntry) {
		if p.sp.ExternalPolicyLocal {
			p.member(setExternalIPLocal, e)
		} else {
			p.member(setExternalIP, e)
		}
		if p.noLocal {
			p.member(setNoLocalEndpoints, e)
		}
	})
}

func (p *portBuild) loadBalancers() {
	p.externalAddrs(p.sp.LoadBalancerVIPs, func(ip netip.Addr, e setEntry) {
		p.member(setLoadBalancer, e)
		if p.sp.ExternalPolicyLocal {
			p.member(setLoadBalancerLocal, e)
		}
		if p.noLocal {
			p.member(setNoLocalEndpoints, e)
		}
		if len(p.sp.LoadBalancerSourceRanges) > 0 {
			p.member(setLoadBalancerFW, e)
			p.sourceRanges(ip)
		}
	})
}

// externalAddrs programs every address of addrs in the port's family: sets puts the
// address's entry in its ipsets (what tells an externalIP from a LoadBalancer VIP), then
// the address gets its virtual server.
func (p *portBuild) externalAddrs(addrs []netip.Addr, sets func(ip netip.Addr, e setEntry)) {
	sp := p.sp
	for _, ip := range addrs {
		if model.FamilyOf(ip) != p.env.family {
			continue
		}
		sets(ip, setEntry{IP: ip, Proto: p.proto, Port: uint16(sp.Port)})
		p.addVS(sp, ip, sp.Port, !p.env.localAddrs[ip], p.externalRS, p.params)
	}
}

// sourceRanges lets a LoadBalancer IP's allowed source ranges through its firewall.
func (p *portBuild) sourceRanges(ip netip.Addr) {
	sp := p.sp
	allowNode := false
	for _, cidr := range sp.LoadBalancerSourceRanges {
		if model.FamilyOf(cidr.Addr()) != p.env.family {
			continue
		}
		p.member(setLoadBalancerSourceCIDR, setEntry{IP: ip, Proto: p.proto, Port: uint16(sp.Port), Net: cidr})
		if p.env.nodeIP.IsValid() && cidr.Contains(p.env.nodeIP) {
			allowNode = true
		}
	}
	if allowNode {
		// Traffic from the node to an LB IP it holds leaves with the LB IP as source.
		p.member(setLoadBalancerSourceIP, setEntry{IP: ip, Proto: p.proto, Port: uint16(sp.Port), IP2: ip})
	} else {
		p.r.outFilter = append(p.r.outFilter, outFilterRule{addr: ip, proto: sp.Name.Protocol, port: uint16(sp.Port)})
	}
}

func (p *portBuild) nodePorts() {
	sp := p.sp
	if sp.NodePort == 0 || len(p.env.nodePortIPs) == 0 {
		return
	}
	np := uint16(sp.NodePort)
	switch sp.Name.Protocol {
	case model.TCP, model.UDP:
		all, local := setNodePortTCP, setNodePortLocalTCP
		if sp.Name.Protocol == model.UDP {
			all, local = setNodePortUDP, setNodePortLocalUDP
		}
		p.member(all, setEntry{Port: np})
		if sp.ExternalPolicyLocal {
			p.member(local, setEntry{Port: np})
		}
	case model.SCTP:
		// bitmap:port has no protocol, so SCTP NodePorts are per node IP.
		for _, ip := range p.env.nodePortIPs {
			p.member(setNodePortSCTP, setEntry{IP: ip, Proto: p.proto, Port: np})
			if sp.ExternalPolicyLocal {
				p.member(setNodePortLocalSCTP, setEntry{IP: ip, Proto: p.proto, Port: np})
			}
		}
	}
	for _, ip := range p.env.nodePortIPs {
		if p.noLocal {
			p.member(setNoLocalEndpoints, setEntry{IP: ip, Proto: p.proto, Port: np})
		}
		p.addVS(sp, ip, sp.NodePort, false, p.externalRS, p.params)
	}
}

func validEndpoint(ep model.Endpoint, family model.IPFamily) bool {
	return ep.IP.IsValid() && model.FamilyOf(ep.IP) == family && ep.Port > 0 && ep.Port <= 65535
}

// realServers turns endpoints into sorted, unique real server addresses.
func realServers(eps []model.Endpoint, family model.IPFamily) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		if validEndpoint(ep, family) {
			out = append(out, netip.AddrPortFrom(ep.IP.Unmap(), uint16(ep.Port)))
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}
