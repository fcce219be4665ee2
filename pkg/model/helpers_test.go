package model

// Test conventions:
//   - this node is "node-a" in zone "zone-a", with IPs 192.168.0.10 and fd00:192::10;
//     other nodes are node-b (zone-b) and node-c (zone-a);
//   - Services live in namespace "ns"; ClusterIPs are 172.30.0.0/16 and fd00:30::/64;
//   - endpoints (pods) are 10.0.0.0/8 and fd00:10::/64;
//   - externalIPs and LoadBalancer VIPs are 203.0.113.0/24 and 2001:db8::/32.

import (
	"net/netip"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

const testNS = "ns"

var testNode = NodeInfo{
	Name: "node-a",
	Zone: "zone-a",
	IPs:  []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:192::10")},
}

func nn(name string) types.NamespacedName { return types.NamespacedName{Namespace: testNS, Name: name} }

// makeService returns a ClusterIP Service 172.30.0.1 with one TCP port "p80" (80), changed by mods.
func makeService(name string, mods ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "172.30.0.1",
			ClusterIPs: []string{"172.30.0.1"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "p80", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(svc)
	}
	return svc
}

func withType(t v1.ServiceType) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Type = t }
}

func withClusterIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIP = ips[0]
		s.Spec.ClusterIPs = ips
		s.Spec.IPFamilies = nil
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, v1.IPv6Protocol)
			} else {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, v1.IPv4Protocol)
			}
		}
	}
}

func withPorts(ports ...v1.ServicePort) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

// makeSlice returns an EndpointSlice of Service svc with one TCP port "p80" (port), changed by mods.
func makeSlice(svc, name string, family IPFamily, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNS, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: addressTypeOf(family),
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p80"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

// makeEndpoint returns a ready endpoint on node-b, changed by mods.
func makeEndpoint(ip string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node-b"), Zone: ptr.To("zone-b")}
	for _, m := range mods {
		m(&ep)
	}
	return ep
}

func onNode(node, zone string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName, e.Zone = ptr.To(node), ptr.To(zone) }
}

// conditions sets ready, serving, terminating.
func conditions(ready, serving, terminating bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
	}
}

var terminatingServing = conditions(false, true, true)
var terminatingNotServing = conditions(false, false, true)

// zoneHints adds zone hints to an endpoint.
func zoneHints(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		h := hintsOf(e)
		for _, z := range zones {
			h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

// nodeHints adds node hints to an endpoint.
func nodeHints(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		h := hintsOf(e)
		for _, n := range nodes {
			h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// hintsOf returns e's hints, giving it empty ones first if it has none.
func hintsOf(e *discoveryv1.Endpoint) *discoveryv1.EndpointHints {
	if e.Hints == nil {
		e.Hints = &discoveryv1.EndpointHints{}
	}
	return e.Hints
}

// Short names for the tables of addresses and CIDRs.
var (
	addrs    = modeltest.Addrs
	prefixes = modeltest.Prefixes
)

// endpointStrings renders endpoints as "ip:port" for compact comparisons; nil stays nil.
func endpointStrings(eps []Endpoint) []string {
	if eps == nil {
		return nil
	}
	out := []string{}
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}

// The model's tests use the Source of modeltest, like the packages that feed the model.
var _ Source = (*modeltest.Source)(nil)

// diff is cmp.Diff that compares netip values with ==.
func diff(want, got any) string {
	return cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}))
}
