package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// This file turns a NodeState into StateView, its JSON form: the desired state as the
// recording backend dumps it (`sluice render`), as the daemon's debug endpoint and
// `sluice status` show it, and as e2e tests read it.
//
// The schema is part of sluice's interface; change it only additively and say so in
// StateViewSchema's history. It is deterministic: every list is sorted, so two views of
// equal states marshal to the same bytes.

// StateViewSchema names the version of the StateView JSON schema.
//
// History: "sluice.state/v1" — first version.
const StateViewSchema = "sluice.state/v1"

// StateView is the desired state of one IP family on one node, in JSON form.
type StateView struct {
	// Schema is StateViewSchema.
	Schema string `json:"schema"`
	// Family is "IPv4" or "IPv6".
	Family string   `json:"family"`
	Node   NodeView `json:"node"`
	// ServiceCIDRs are the cluster's Service ranges of this family, sorted.
	ServiceCIDRs []string `json:"serviceCIDRs"`
	// Services lists every Service port of this family, sorted by namespace, name, port
	// name and protocol.
	Services []ServicePortView `json:"services"`
	// Problems lists the bad input found in API objects, sorted by Service, object, field
	// and message.
	Problems []ProblemView `json:"problems"`
}

// NodeView is what the model knows about this node.
type NodeView struct {
	Name string `json:"name"`
	// Zone is the topology.kubernetes.io/zone label ("" when unset).
	Zone string `json:"zone"`
	// IPs are the node's addresses (both families), in the model's order: InternalIP first,
	// the first of each family being its primary.
	IPs []string `json:"ips"`
	// PodCIDRs are spec.podCIDRs.
	PodCIDRs []string `json:"podCIDRs"`
}

// ServicePortView is one port of one Service, as a backend must program it.
type ServicePortView struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// PortName is the port's name in the Service spec, "" for an unnamed port.
	PortName string `json:"portName"`
	// Protocol is "TCP", "UDP" or "SCTP".
	Protocol string `json:"protocol"`
	// Type is "ClusterIP", "NodePort" or "LoadBalancer".
	Type string `json:"type"`

	ClusterIP string `json:"clusterIP"`
	Port      int32  `json:"port"`
	// NodePort is 0 when the port has none.
	NodePort int32 `json:"nodePort"`
	// ExternalIPs, LoadBalancerVIPs and LoadBalancerSourceRanges are of this family only,
	// sorted; an empty source range list means no filtering.
	ExternalIPs              []string `json:"externalIPs"`
	LoadBalancerVIPs         []string `json:"loadBalancerVIPs"`
	LoadBalancerSourceRanges []string `json:"loadBalancerSourceRanges"`

	// SessionAffinity is "ClientIP" or "None"; AffinityTimeoutSeconds is 0 for "None".
	SessionAffinity        string `json:"sessionAffinity"`
	AffinityTimeoutSeconds int32  `json:"affinityTimeoutSeconds"`

	// ExternalTrafficPolicy is "Local" only for an externally accessible port (NodePort,
	// externalIPs or LoadBalancer VIPs) whose Service asks for it; otherwise "Cluster".
	ExternalTrafficPolicy string `json:"externalTrafficPolicy"`
	// InternalTrafficPolicy is "Local" or "Cluster".
	InternalTrafficPolicy string `json:"internalTrafficPolicy"`
	// HealthCheckNodePort is set for LoadBalancer Services with externalTrafficPolicy Local.
	HealthCheckNodePort int32 `json:"healthCheckNodePort"`
	// Scheduler is the IPVS scheduler the Service asks for ("" for the mode's default).
	Scheduler string `json:"scheduler"`
	// TrafficCounters is true when the port's traffic is counted (annotation
	// sluice.dev/traffic-counters or the node's --traffic-counters); left out when false.
	TrafficCounters bool `json:"trafficCounters,omitempty"`
	// Topology is the hint-based filtering applied to clusterEndpoints: "",
	// "PreferSameZone" or "PreferSameNode".
	Topology string `json:"topology"`
	// HasAnyEndpoints is true when a usable endpoint exists anywhere in the cluster (it
	// decides between reject and drop when the policy's list is empty).
	HasAnyEndpoints bool `json:"hasAnyEndpoints"`

	// ClusterEndpoints and LocalEndpoints are the endpoints traffic under each policy goes
	// to, sorted by IP and port. null means the port never uses that policy; [] means it
	// does, and there is no endpoint to send the traffic to.
	ClusterEndpoints []EndpointView `json:"clusterEndpoints"`
	LocalEndpoints   []EndpointView `json:"localEndpoints"`
	// AllEndpoints lists every endpoint of the port, usable or not, sorted by IP and port.
	AllEndpoints []EndpointView `json:"allEndpoints"`
}

// EndpointView is one endpoint of a Service port with its conditions.
type EndpointView struct {
	IP   string `json:"ip"`
	Port int32  `json:"port"`

	Ready       bool `json:"ready"`
	Serving     bool `json:"serving"`
	Terminating bool `json:"terminating"`

	NodeName string `json:"nodeName"`
	Zone     string `json:"zone"`
	// Local is true when the endpoint runs on this node.
	Local bool `json:"local"`

	// ZoneHints and NodeHints are the EndpointSlice hints, sorted; omitted when none.
	ZoneHints []string `json:"zoneHints,omitempty"`
	NodeHints []string `json:"nodeHints,omitempty"`
}

// ProblemView is bad input found in an API object.
type ProblemView struct {
	// Namespace and Name name the Service the problem belongs to.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Object names the object holding the bad field, e.g. "Service".
	Object  string `json:"object"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// View returns the JSON form of s. It does not modify s, and equal states give equal
// views.
func (s *NodeState) View() StateView {
	v := StateView{
		Schema: StateViewSchema,
		Family: s.Family.String(),
		Node: NodeView{
			Name:     s.Node.Name,
			Zone:     s.Node.Zone,
			IPs:      formatted(s.Node.IPs, nil),
			PodCIDRs: formatted(s.Node.PodCIDRs, nil),
		},
		ServiceCIDRs: formatted(s.ServiceCIDRs, comparePrefixes),
		Services:     make([]ServicePortView, 0, len(s.Services)),
		Problems:     []ProblemView{},
	}
	for _, sp := range s.Services {
		v.Services = append(v.Services, sp.View())
	}
	slices.SortFunc(v.Services, func(a, b ServicePortView) int {
		return cmp.Or(
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.PortName, b.PortName),
			cmp.Compare(a.Protocol, b.Protocol),
		)
	})
	for _, problems := range s.Problems {
		for _, p := range problems {
			v.Problems = append(v.Problems, ProblemView{
				Namespace: p.Service.Namespace, Name: p.Service.Name,
				Object: p.Object, Field: p.Field, Message: p.Message,
			})
		}
	}
	slices.SortFunc(v.Problems, func(a, b ProblemView) int {
		return cmp.Or(
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Object, b.Object),
			cmp.Compare(a.Field, b.Field),
			cmp.Compare(a.Message, b.Message),
		)
	})
	return v
}

// View returns the JSON form of one Service port.
func (sp *ServicePort) View() ServicePortView {
	v := ServicePortView{
		Namespace:                sp.Name.Namespace,
		Name:                     sp.Name.Name,
		PortName:                 sp.Name.Port,
		Protocol:                 string(sp.Name.Protocol),
		Type:                     string(sp.Type),
		Port:                     sp.Port,
		NodePort:                 sp.NodePort,
		ExternalIPs:              formatted(sp.ExternalIPs, netip.Addr.Compare),
		LoadBalancerVIPs:         formatted(sp.LoadBalancerVIPs, netip.Addr.Compare),
		LoadBalancerSourceRanges: formatted(sp.LoadBalancerSourceRanges, comparePrefixes),
		SessionAffinity:          "None",
		AffinityTimeoutSeconds:   sp.AffinityTimeoutSeconds,
		ExternalTrafficPolicy:    policyName(sp.ExternalPolicyLocal),
		InternalTrafficPolicy:    policyName(sp.InternalPolicyLocal),
		HealthCheckNodePort:      sp.HealthCheckNodePort,
		Scheduler:                sp.Scheduler,
		TrafficCounters:          sp.Counted,
		Topology:                 string(sp.Topology),
		HasAnyEndpoints:          sp.HasAnyEndpoints,
		ClusterEndpoints:         endpointViews(sp.ClusterEndpoints),
		LocalEndpoints:           endpointViews(sp.LocalEndpoints),
		AllEndpoints:             endpointViews(sp.AllEndpoints),
	}
	if v.AllEndpoints == nil {
		v.AllEndpoints = []EndpointView{}
	}
	if sp.ClusterIP.IsValid() {
		v.ClusterIP = sp.ClusterIP.String()
	}
	if sp.AffinityTimeoutSeconds > 0 {
		v.SessionAffinity = "ClientIP"
	}
	return v
}

// Find returns the view of one Service port, or nil. portName is "" for an unnamed port.
func (v *StateView) Find(namespace, name, portName string, protocol Protocol) *ServicePortView {
	for i := range v.Services {
		sp := &v.Services[i]
		if sp.Namespace == namespace && sp.Name == name && sp.PortName == portName && sp.Protocol == string(protocol) {
			return sp
		}
	}
	return nil
}

func policyName(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

// endpointViews converts eps, keeping nil as nil (the policy is unused) and empty as
// empty (the policy is used, with no endpoint).
func endpointViews(eps []Endpoint) []EndpointView {
	if eps == nil {
		return nil
	}
	// Sort by address and port (numerically, as the model does), whatever order eps is in.
	sorted := slices.Clone(eps)
	slices.SortStableFunc(sorted, func(a, b Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	out := make([]EndpointView, 0, len(sorted))
	for _, ep := range sorted {
		out = append(out, EndpointView{
			IP:          ep.IP.String(),
			Port:        ep.Port,
			Ready:       ep.Ready,
			Serving:     ep.Serving,
			Terminating: ep.Terminating,
			NodeName:    ep.NodeName,
			Zone:        ep.Zone,
			Local:       ep.IsLocal,
			ZoneHints:   sortedStrings(ep.ZoneHints()),
			NodeHints:   sortedStrings(ep.NodeHints()),
		})
	}
	return out
}

func sortedStrings(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return out
}

// formatted returns the String of every x, first sorted by compare unless compare is nil;
// never nil.
func formatted[T fmt.Stringer](xs []T, compare func(a, b T) int) []string {
	if compare != nil {
		xs = slices.Clone(xs)
		slices.SortFunc(xs, compare)
	}
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

// comparePrefixes orders prefixes by address, then length.
func comparePrefixes(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// String returns the port's key as "ns/name:port/PROTOCOL" ("ns/name/PROTOCOL" when the
// port is unnamed), for messages about a ServicePortView.
func (v *ServicePortView) String() string {
	var b strings.Builder
	b.WriteString(v.Namespace + "/" + v.Name)
	if v.PortName != "" {
		b.WriteString(":" + v.PortName)
	}
	b.WriteString("/" + v.Protocol)
	return b.String()
}
