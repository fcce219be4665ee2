package model

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestComputeBuildsOneStatePerFamily(t *testing.T) {
	services := []*v1.Service{
		makeService("a", withClusterIPs("172.30.0.1", "fd00:30::1")),
		makeService("b", withClusterIPs("172.30.0.2")),
		makeService("bad", withClusterIPs("172.30.0.3"), withPorts(v1.ServicePort{Name: "x", Port: 0})),
		nil,
	}
	unlabelled := makeSlice("a", "stray", IPv4, 9999, makeEndpoint("10.0.0.99"))
	unlabelled.Labels = nil
	slices := []*discoveryv1.EndpointSlice{
		makeSlice("a", "a-v4", IPv4, 8080, makeEndpoint("10.0.0.1")),
		makeSlice("a", "a-v6", IPv6, 8080, makeEndpoint("fd00:10::1")),
		makeSlice("b", "b-v4", IPv4, 8081, makeEndpoint("10.0.0.2")),
		unlabelled,
		nil,
	}
	cidrs := prefixes("172.30.0.0/16", "fd00:30::/64")
	states := Compute(services, slices, testNode, cidrs, Options{})

	v4, v6 := states[IPv4], states[IPv6]
	if len(states) != 2 || v4 == nil || v6 == nil {
		t.Fatalf("states %v", states)
	}
	if d := diff(prefixes("172.30.0.0/16"), v4.ServiceCIDRs); d != "" {
		t.Errorf("IPv4 ServiceCIDRs: %s", d)
	}
	if d := diff(prefixes("fd00:30::/64"), v6.ServiceCIDRs); d != "" {
		t.Errorf("IPv6 ServiceCIDRs: %s", d)
	}
	got := map[string][]string{}
	for _, st := range []*NodeState{v4, v6} {
		for name, sp := range st.Services {
			got[st.Family.String()+" "+name.String()] = endpointStrings(sp.AllEndpoints)
		}
	}
	want := map[string][]string{
		"IPv4 ns/a:p80": {"10.0.0.1:8080"},
		"IPv6 ns/a:p80": {"[fd00:10::1]:8080"},
		"IPv4 ns/b:p80": {"10.0.0.2:8081"},
	}
	if d := diff(want, got); d != "" {
		t.Errorf("ports (-want +got):\n%s", d)
	}
	if len(v4.Problems[nn("bad")]) != 1 || len(v6.Problems) != 0 {
		t.Errorf("problems: v4 %v, v6 %v", v4.Problems, v6.Problems)
	}
	if v4.Node.Name != "node-a" {
		t.Errorf("node %+v", v4.Node)
	}

	only4 := Compute(services, slices, testNode, cidrs, Options{Families: []IPFamily{IPv4}})
	if len(only4) != 1 || only4[IPv4] == nil {
		t.Errorf("Options.Families ignored: %v", only4)
	}
}
