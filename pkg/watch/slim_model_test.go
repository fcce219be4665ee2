package watch

import (
	"net/netip"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestSlimKeepsWhatTheModelReads: Services and EndpointSlices that use every field the model
// reads (dual-stack, every Service type and policy, affinity, external and load-balancer
// addresses, source ranges, the scheduler and traffic-counters annotations, hints, every endpoint condition,
// several slices and ports) give the same NodeStates, problems included, slimmed or not; the
// tracker's own reads (the Service a slice belongs to, its trigger time) are kept too.
func TestSlimKeepsWhatTheModelReads(t *testing.T) {
	meta := func(name string, labels, annotations map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "7", Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: name}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "m"}},
		}
	}
	services := []*v1.Service{{
		ObjectMeta: meta("lb", map[string]string{"app": "lb"}, map[string]string{AnnotationScheduler: "sh", "other": "x"}),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "lb"},
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053},
				{Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9, NodePort: 30009},
				{Name: "bad", Protocol: "ICMP", Port: 1},
			},
			ExternalIPs:              []string{"192.0.2.1", "2001:db8::1", "not-an-ip"},
			LoadBalancerSourceRanges: []string{"198.51.100.0/24", " 2001:db8:1::/48", "bad"},
			ExternalTrafficPolicy:    v1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:      32000,
			SessionAffinity:          v1.ServiceAffinityClientIP,
			SessionAffinityConfig:    &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}},
		},
		Status: v1.ServiceStatus{
			LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
				{IP: "203.0.113.1"}, {IP: "203.0.113.2", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}, {IP: "2001:db8:2::1"}, {Hostname: "lb.example"},
			}},
			Conditions: []metav1.Condition{{Type: "x"}},
		},
	}, {
		ObjectMeta: meta("local", map[string]string{"app": "local"}, map[string]string{AnnotationTrafficCounters: "true"}),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.11", ClusterIPs: []string{"10.96.0.11"},
			Ports:                 []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 443}},
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyLocal),
		},
	}, {
		ObjectMeta: meta("other-proxy", map[string]string{LabelServiceProxyName: "other"}, nil),
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.12", ClusterIPs: []string{"10.96.0.12"},
			Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 80}}},
	}, {
		ObjectMeta: meta("np", nil, map[string]string{AnnotationTrafficCounters: "false"}),
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.13",
			Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30013}}},
	}, {
		// Services as the API server returns most of them: kept in the compact form.
		ObjectMeta: meta("plain", map[string]string{"app": "plain"}, nil),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.14", ClusterIPs: []string{"10.96.0.14", "fd00:96::14"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyPreferDualStack),
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster), SessionAffinity: v1.ServiceAffinityNone,
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")},
				{Name: "grpc", Protocol: v1.ProtocolTCP, Port: 81, AppProtocol: ptr.To("grpc"), TargetPort: intstr.FromInt32(9000)}},
		},
	}, {
		ObjectMeta: meta("plain-np", nil, nil),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeNodePort, ClusterIP: "fd00:96::15", ClusterIPs: []string{"fd00:96::15"},
			IPFamilies: []v1.IPFamily{v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicySingleStack),
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 32001,
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster), SessionAffinity: v1.ServiceAffinityNone,
			Ports: []v1.ServicePort{{Name: "udp", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053}},
		},
	}}

	endpoint := func(addr, node, zone string, ready, serving, terminating *bool, hints *discoveryv1.EndpointHints) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating},
			Hostname:   ptr.To("host"), TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p"},
			NodeName: ptr.To(node), Zone: ptr.To(zone), Hints: hints,
			DeprecatedTopology: map[string]string{"a": "b"},
		}
	}
	zoneHints := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}}
	yes, no := ptr.To(true), ptr.To(false)
	slices := []*discoveryv1.EndpointSlice{{
		ObjectMeta: meta("lb-v4", map[string]string{discoveryv1.LabelServiceName: "lb", discoveryv1.LabelManagedBy: "c"},
			map[string]string{AnnotationTriggerTime: "2026-12-02T00:00:00Z", "other": "x"}),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("http")},
			{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](5353)},
			{Name: ptr.To("sctp"), Protocol: ptr.To(v1.ProtocolSCTP), Port: ptr.To[int32](9999)},
		},
		Endpoints: []discoveryv1.Endpoint{
			endpoint("10.244.0.1", "node-a", "z1", nil, nil, nil, zoneHints),
			endpoint("10.244.0.2", "node-b", "z2", no, yes, yes, zoneHints),
			endpoint("10.244.0.3", "node-b", "z2", no, no, yes, nil),
			endpoint("10.244.0.4", "node-c", "z1", yes, yes, no, zoneHints),
			endpoint("bad", "node-a", "z1", nil, nil, nil, nil),
		},
	}, {
		ObjectMeta:  meta("lb-v4-2", map[string]string{discoveryv1.LabelServiceName: "lb"}, nil),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8081)}},
		Endpoints:   []discoveryv1.Endpoint{endpoint("10.244.1.1", "node-a", "z1", yes, nil, nil, nil)},
	}, {
		ObjectMeta:  meta("lb-v6", map[string]string{discoveryv1.LabelServiceName: "lb"}, nil),
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{endpoint("fd00:244::1", "node-a", "z1", nil, nil, nil, zoneHints)},
	}, {
		ObjectMeta:  meta("local-1", map[string]string{discoveryv1.LabelServiceName: "local"}, nil),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](8443)}},
		Endpoints: []discoveryv1.Endpoint{
			endpoint("10.244.2.1", "node-a", "z1", nil, nil, nil, nil),
			endpoint("10.244.2.2", "node-b", "z1", nil, nil, nil, nil),
		},
	}, {
		ObjectMeta:  meta("np-headless", map[string]string{discoveryv1.LabelServiceName: "np", v1.IsHeadlessService: ""}, nil),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](80)}},
		Endpoints:   []discoveryv1.Endpoint{endpoint("10.244.3.1", "node-a", "z1", nil, nil, nil, nil)},
	}}

	node := model.NodeInfo{Name: "node-a", Zone: "z1", IPs: []netip.Addr{netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("fd00::1")}}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	slimServices := slimAll(t, services, func(o any) *v1.Service { return o.(*cachedService).service() })
	slimSlices := slimAll(t, slices, func(o any) *discoveryv1.EndpointSlice { return o.(*cachedSlice).endpointSlice() })
	for _, opts := range []model.Options{{}, {IgnoreExternalIPs: true}, {TrafficCounters: model.TrafficCountersAll}} {
		want := model.Compute(services, slices, node, cidrs, opts)
		got := model.Compute(slimServices, slimSlices, node, cidrs, opts)
		if !reflect.DeepEqual(got, want) {
			for f := range want {
				if !reflect.DeepEqual(got[f], want[f]) {
					t.Errorf("options %+v, %s: slimmed objects give\n%+v\nwant\n%+v", opts, f, got[f], want[f])
				}
			}
		}
		if len(want[model.IPv4].Services) == 0 || len(want[model.IPv6].Services) == 0 {
			t.Fatalf("the fixture programs nothing: %+v", want)
		}
	}
	for i, s := range slices {
		wantName, wantOK := model.ServiceNameOf(s)
		gotName, gotOK := model.ServiceNameOf(slimSlices[i])
		if wantName != gotName || wantOK != gotOK {
			t.Errorf("slice %s: Service %v %v, want %v %v", s.Name, gotName, gotOK, wantName, wantOK)
		}
		if got, want := slimSlices[i].Annotations[AnnotationTriggerTime], s.Annotations[AnnotationTriggerTime]; got != want {
			t.Errorf("slice %s: trigger time %q, want %q", s.Name, got, want)
		}
	}
}

// slimAll slims a copy of every object and reads each back through back.
func slimAll[T interface{ DeepCopy() T }](t *testing.T, objs []T, back func(any) T) []T {
	t.Helper()
	var out []T
	for _, o := range objs {
		slimmed, err := slim(o.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, back(slimmed))
	}
	return out
}
