package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// This file is the contract between the model and every backend. Backends see only these
// types, never a v1.Service or an EndpointSlice.
//
// Values reachable from a NodeState are immutable once published: the tracker replaces a
// *ServicePort when its Service or endpoints change instead of editing it in place, so a
// backend (or a debug snapshot) may keep pointers from an earlier sync and compare them.

// IPFamily is the address family one NodeState and one backend instance handle.
type IPFamily uint8

const (
	IPv4 IPFamily = 4
	IPv6 IPFamily = 6
)

// Families lists the families in the order sluice processes them.
var Families = []IPFamily{IPv4, IPv6}

// String returns "IPv4" or "IPv6", the spelling Kubernetes uses (and the ip_family metric label).
func (f IPFamily) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("IPFamily(%d)", uint8(f))
}

// FamilyOf returns the family of addr (an IPv4-mapped IPv6 address counts as IPv4).
func FamilyOf(addr netip.Addr) IPFamily {
	if addr.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Protocol is a Service port's L4 protocol.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Lower returns the protocol in lower case ("tcp"), as iptables, nft and upstream's chain hashes spell it.
func (p Protocol) Lower() string { return strings.ToLower(string(p)) }

// ServiceType mirrors v1.ServiceType for the types the proxy programs.
type ServiceType string

const (
	TypeClusterIP    ServiceType = "ClusterIP"
	TypeNodePort     ServiceType = "NodePort"
	TypeLoadBalancer ServiceType = "LoadBalancer"
)

// ServicePortName identifies one port of one Service, e.g. ns1/svc1:http over TCP.
type ServicePortName struct {
	types.NamespacedName
	// Port is the name of the port in the Service spec; "" for an unnamed (single) port.
	Port     string
	Protocol Protocol
}

// String returns "ns/name:port", or "ns/name" when the port is unnamed. It is the string
// upstream kube-proxy hashes into its iptables chain names (together with the protocol).
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return n.NamespacedName.String() + ":" + n.Port
}

// Endpoint is one backend address of a Service port, merged from all of the Service's
// EndpointSlices (duplicates removed: a non-terminating copy wins over a terminating one).
type Endpoint struct {
	IP   netip.Addr
	Port int32

	// Conditions as the EndpointSlice API defines them: Ready and Serving are true when
	// unset; Terminating is true only when set.
	Ready       bool
	Serving     bool
	Terminating bool
	// IsLocal means NodeName is this node (next to the conditions: the booleans share
	// one word, and a cluster holds an Endpoint per pod port).
	IsLocal bool

	// NodeName and Zone say where the endpoint runs.
	NodeName string
	Zone     string

	// Hints are the EndpointSlice topology hints; nil when it has none, as most
	// endpoints do (a pointer costs each endpoint 8 bytes, two lists would cost 48).
	Hints *EndpointHints
}

// EndpointHints are an endpoint's topology hints (forZones, forNodes), immutable once
// published like the rest of the model.
type EndpointHints struct {
	Zones []string
	Nodes []string
}

// ZoneHints returns the zones the endpoint is hinted for, nil when none.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the nodes the endpoint is hinted for, nil when none.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.IP, uint16(e.Port)) }

// String returns "ip:port" ("[ip]:port" for IPv6).
func (e Endpoint) String() string { return e.AddrPort().String() }

// TopologyMode is the endpoint filtering chosen from EndpointSlice hints.
type TopologyMode string

const (
	TopologyNone           TopologyMode = ""
	TopologyPreferSameZone TopologyMode = "PreferSameZone"
	TopologyPreferSameNode TopologyMode = "PreferSameNode"
)

// ServicePort is everything one backend needs to program for one port of one Service in one
// IP family. Addresses are already filtered to the family of the NodeState holding it.
type ServicePort struct {
	Name ServicePortName
	Type ServiceType

	ClusterIP netip.Addr
	Port      int32
	// NodePort is 0 when the Service has none.
	NodePort int32
	// ExternalIPs are spec.externalIPs of this family (empty when the AllowServiceExternalIPs
	// gate is off).
	ExternalIPs []netip.Addr
	// LoadBalancerVIPs are status.loadBalancer.ingress[].ip of this family whose ipMode is
	// unset or VIP; hostname-only and ipMode Proxy entries are left out.
	LoadBalancerVIPs []netip.Addr
	// LoadBalancerSourceRanges of this family, trimmed and parsed. Empty means no filtering
	// (a range covering the whole family, such as 0.0.0.0/0, also normalises to empty).
	LoadBalancerSourceRanges []netip.Prefix

	// AffinityTimeoutSeconds is sessionAffinityConfig.clientIP.timeoutSeconds when
	// sessionAffinity is ClientIP, and 0 when the Service has no session affinity.
	AffinityTimeoutSeconds int32

	// ExternalPolicyLocal is true when the Service is externally accessible (NodePort,
	// LoadBalancer VIPs or externalIPs) and externalTrafficPolicy is Local.
	ExternalPolicyLocal bool
	// InternalPolicyLocal is true when internalTrafficPolicy is Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort is set for LoadBalancer Services with externalTrafficPolicy Local.
	HealthCheckNodePort int32

	// Scheduler is the IPVS scheduler requested by the Service's annotation
	// (ipvs.sluice.dev/scheduler), "" for the mode's default. Other backends ignore it.
	Scheduler string
	// Counted asks the backend to count this port's new connections, packets and bytes
	// (annotation sluice.dev/traffic-counters, Options.TrafficCounters). Off by default;
	// a port not counted is programmed exactly as before counters existed.
	Counted bool

	// AllEndpoints lists every endpoint of this port, usable or not, sorted by ip:port. The
	// conntrack reconciler and the diagnostics read it; traffic uses the lists below.
	AllEndpoints []Endpoint
	// ClusterEndpoints are the endpoints for traffic under Cluster policy: ready ones
	// (filtered by topology), or if there are none the serving+terminating ones. nil when
	// the port never uses Cluster policy.
	ClusterEndpoints []Endpoint
	// LocalEndpoints are the endpoints for traffic under Local policy: this node's ready
	// ones, or if there are none its serving+terminating ones. nil when the port never uses
	// Local policy.
	LocalEndpoints []Endpoint
	// HasAnyEndpoints is true when a usable (ready, or serving+terminating) endpoint exists
	// anywhere in the cluster. It decides between reject (no endpoints at all) and drop
	// (endpoints exist, but none that this traffic policy may use).
	HasAnyEndpoints bool
	// Topology is the hint-based filtering applied to ClusterEndpoints.
	Topology TopologyMode
}

// ExternallyAccessible reports whether traffic can reach this port other than through its
// ClusterIP: a NodePort, an externalIP or a LoadBalancer VIP.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerVIPs) > 0
}

// UsesClusterEndpoints reports whether some traffic to this port is under Cluster policy.
// An externally accessible port always needs them, even with externalTrafficPolicy Local:
// external traffic from pods or from the node itself is short-circuited to the Cluster
// endpoints (upstream's UsesClusterEndpoints does the same).
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || sp.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether some traffic to this port is under Local policy.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || (sp.ExternallyAccessible() && sp.ExternalPolicyLocal)
}

// LocalReadyEndpoints counts this node's ready (not terminating) endpoints: the figure a
// healthCheckNodePort server reports.
func (sp *ServicePort) LocalReadyEndpoints() int {
	n := 0
	for i := range sp.AllEndpoints {
		if ep := &sp.AllEndpoints[i]; ep.IsLocal && ep.Ready && !ep.Terminating {
			n++
		}
	}
	return n
}

// NodeInfo is what the model knows about the node sluice runs on.
type NodeInfo struct {
	Name string
	// Zone is the topology.kubernetes.io/zone label, "" when unset.
	Zone string
	// IPs are the node's addresses from status.addresses (InternalIP first, then
	// ExternalIP), both families; the first of each family is that family's primary.
	IPs []netip.Addr
	// PodCIDRs are spec.podCIDRs.
	PodCIDRs []netip.Prefix
}

// IPsOf returns the node IPs of one family, primary first.
func (n NodeInfo) IPsOf(f IPFamily) []netip.Addr {
	var out []netip.Addr
	for _, ip := range n.IPs {
		if FamilyOf(ip) == f {
			out = append(out, ip)
		}
	}
	return out
}

// PodCIDRsOf returns the node's pod CIDRs of one family.
func (n NodeInfo) PodCIDRsOf(f IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range n.PodCIDRs {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// Problem is bad input found in an API object. The rest of the object is still programmed;
// the problem is reported as an Event, a log line and a metric.
type Problem struct {
	Service types.NamespacedName
	// Object names the object holding the bad field, e.g. "Service" or "EndpointSlice ns/slice-abc".
	Object string
	// Field is the path of the bad field, e.g. "spec.externalIPs[1]".
	Field   string
	Message string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s %s: %s: %s", p.Object, p.Service, p.Field, p.Message)
}

// NodeState is what this node must program for one IP family.
type NodeState struct {
	Family IPFamily
	Node   NodeInfo
	// Services maps each Service port of this family to what must be programmed for it.
	Services map[ServicePortName]*ServicePort
	// ServiceCIDRs are the cluster's service ranges of this family (from ServiceCIDR objects).
	ServiceCIDRs []netip.Prefix
	// Problems found in the input, by Service.
	Problems map[types.NamespacedName][]Problem

	// byService indexes Services by Service name; see PortsOf.
	byService map[types.NamespacedName][]ServicePortName
}

// NewNodeState returns an empty state for one family.
func NewNodeState(family IPFamily, node NodeInfo) *NodeState {
	return &NodeState{
		Family:    family,
		Node:      node,
		Services:  map[ServicePortName]*ServicePort{},
		Problems:  map[types.NamespacedName][]Problem{},
		byService: map[types.NamespacedName][]ServicePortName{},
	}
}

// SetService replaces all ports of one Service (ports may be empty: the Service is gone or
// has nothing to program in this family) and its problems.
func (s *NodeState) SetService(name types.NamespacedName, ports []*ServicePort, problems []Problem) {
	for _, old := range s.byService[name] {
		delete(s.Services, old)
	}
	delete(s.byService, name)
	delete(s.Problems, name)
	if len(ports) > 0 {
		names := make([]ServicePortName, 0, len(ports))
		for _, sp := range ports {
			s.Services[sp.Name] = sp
			names = append(names, sp.Name)
		}
		slices.SortFunc(names, func(a, b ServicePortName) int {
			if c := strings.Compare(a.Port, b.Port); c != 0 {
				return c
			}
			return strings.Compare(string(a.Protocol), string(b.Protocol))
		})
		s.byService[name] = names
	}
	if len(problems) > 0 {
		s.Problems[name] = problems
	}
}

// PortsOf returns the ports of one Service in this family, in a stable order.
func (s *NodeState) PortsOf(name types.NamespacedName) []*ServicePort {
	names := s.byService[name]
	out := make([]*ServicePort, 0, len(names))
	for _, n := range names {
		out = append(out, s.Services[n])
	}
	return out
}

// ServiceNames returns the names of all Services with at least one port in this state.
func (s *NodeState) ServiceNames() sets.Set[types.NamespacedName] {
	out := sets.New[types.NamespacedName]()
	for n := range s.byService {
		out.Insert(n)
	}
	return out
}

// Clone returns a copy that shares the (immutable) ServicePorts but not the maps, so the
// copy stays valid while the tracker goes on changing the original.
func (s *NodeState) Clone() *NodeState {
	c := NewNodeState(s.Family, s.Node)
	c.ServiceCIDRs = slices.Clone(s.ServiceCIDRs)
	for k, v := range s.Services {
		c.Services[k] = v
	}
	for k, v := range s.Problems {
		c.Problems[k] = v
	}
	for k, v := range s.byService {
		c.byService[k] = v
	}
	return c
}

// Changes tells a backend what differs from the last state it applied successfully.
type Changes struct {
	// Full asks the backend to rewrite (and repair) everything it owns: the first sync,
	// after a failure, periodically, and when node-wide inputs (node IPs, zone, ServiceCIDRs)
	// changed.
	Full bool
	// Services whose Service object or endpoints changed, including deleted Services (they
	// have no ports in the state any more). Meaningful when Full is false; when Full is
	// true every Service must be treated as changed.
	Services sets.Set[types.NamespacedName]
}
