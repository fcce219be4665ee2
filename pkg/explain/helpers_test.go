package explain

// Conventions of the tests: this node is node-a (zone-a, IP 172.18.0.2, pod CIDR
// 10.244.1.0/24); node-b is 172.18.0.3 with pods in 10.244.2.0/24; the cluster CIDR is
// 10.244.0.0/16; ClusterIPs are in 10.96.0.0/16, LoadBalancer IPs in 192.0.2.0/24,
// externalIPs in 198.51.100.0/24; the external client is 203.0.113.7.

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

var (
	nodeA = model.NodeInfo{
		Name: "node-a", Zone: "zone-a",
		IPs:      []netip.Addr{netip.MustParseAddr("172.18.0.2")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
	}
	externalClient = netip.MustParseAddr("203.0.113.7")
	podA0          = netip.MustParseAddr("10.244.1.10")
	podB0          = netip.MustParseAddr("10.244.2.10")
	nodeAIP        = netip.MustParseAddr("172.18.0.2")
	nodeBIP        = netip.MustParseAddr("172.18.0.3")
)

// defaultConfig is iptables mode with a ClusterCIDR detector and NodePorts on every local
// address.
func defaultConfig() Config {
	return Config{
		Mode:              dataplane.ModeIPTables,
		NodePortAddresses: dataplane.NodePortAddresses{MatchAll: true},
		LocalDetector: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR,
			CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		LocalhostNodePorts: true,
	}
}

// ep is one endpoint of a test Service: a pod IP on a node, with conditions.
type ep struct {
	ip, node                    string
	ready, serving, terminating bool
	zoneHints, nodeHints        []string
}

func ready(ip, node string) ep { return ep{ip: ip, node: node, ready: true, serving: true} }
func servingTerminating(ip, node string) ep {
	return ep{ip: ip, node: node, serving: true, terminating: true}
}
func terminatingGone(ip, node string) ep { return ep{ip: ip, node: node, terminating: true} }
func notReady(ip, node string) ep        { return ep{ip: ip, node: node} }

func (e ep) zones(z ...string) ep { e.zoneHints = z; return e }
func (e ep) nodes(n ...string) ep { e.nodeHints = n; return e }

// svc describes a test Service with one TCP port 80 -> 8080.
type svc struct {
	name        string
	typ         v1.ServiceType
	clusterIP   string
	nodePort    int32
	lbIPs       []string
	externalIPs []string
	ranges      []string
	etpLocal    bool
	itpLocal    bool
	affinity    bool
	eps         []ep
}

func (s svc) objects() (*v1.Service, *discoveryv1.EndpointSlice) {
	typ := s.typ
	if typ == "" {
		typ = v1.ServiceTypeClusterIP
	}
	service := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: s.name},
		Spec: v1.ServiceSpec{
			Type: typ, ClusterIP: s.clusterIP, ClusterIPs: []string{s.clusterIP},
			Ports:                    []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: s.nodePort}},
			ExternalIPs:              s.externalIPs,
			LoadBalancerSourceRanges: s.ranges,
		},
	}
	if s.etpLocal {
		service.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		if typ == v1.ServiceTypeLoadBalancer {
			service.Spec.HealthCheckNodePort = s.nodePort + 1000
		}
	}
	if s.itpLocal {
		service.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if s.affinity {
		service.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		service.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	}
	for _, ip := range s.lbIPs {
		service.Status.LoadBalancer.Ingress = append(service.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: s.name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: s.name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for _, e := range s.eps {
		d := discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready), Serving: ptr.To(e.serving), Terminating: ptr.To(e.terminating)},
			NodeName:   ptr.To(e.node),
			Zone:       ptr.To("zone-" + e.node[len(e.node)-1:]),
		}
		if len(e.zoneHints) > 0 || len(e.nodeHints) > 0 {
			d.Hints = hints(e.zoneHints, e.nodeHints)
		}
		slice.Endpoints = append(slice.Endpoints, d)
	}
	return service, slice
}

// hints are an endpoint's hints for the zones and nodes.
func hints(zones, nodes []string) *discoveryv1.EndpointHints {
	h := &discoveryv1.EndpointHints{}
	for _, z := range zones {
		h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
	}
	for _, n := range nodes {
		h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: n})
	}
	return h
}

// stateOf computes node-a's IPv4 state view for the Services, as the daemon would.
func stateOf(t testing.TB, svcs ...svc) *model.StateView {
	t.Helper()
	var services []*v1.Service
	var slices []*discoveryv1.EndpointSlice
	for _, s := range svcs {
		service, slice := s.objects()
		services = append(services, service)
		slices = append(slices, slice)
	}
	states := model.Compute(services, slices, nodeA, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, model.Options{Families: []model.IPFamily{model.IPv4}})
	v := states[model.IPv4].View()
	if len(v.Problems) > 0 {
		t.Fatalf("test Services have problems: %+v", v.Problems)
	}
	return &v
}

func pkt(src netip.Addr, dst string) Packet {
	return Packet{Source: src, Destination: netip.MustParseAddrPort(dst), Protocol: model.TCP}
}
