package model_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// The view tests live in package model_test so that they use only the exported API, as
// the debug endpoint, `sluice status` and the e2e tests do.

func viewTestState(reverse bool) *model.NodeState {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	web := types.NamespacedName{Namespace: "ns1", Name: "web"}
	dns := types.NamespacedName{Namespace: "kube-system", Name: "dns"}

	local := model.Endpoint{IP: a("10.1.0.10"), Port: 8443, Ready: true, Serving: true, NodeName: "node-a", Zone: "z1", IsLocal: true, Hints: &model.EndpointHints{Zones: []string{"z2", "z1"}}}
	remote := model.Endpoint{IP: a("10.1.0.9"), Port: 8443, Ready: true, Serving: true, NodeName: "node-b", Zone: "z2"}
	dying := model.Endpoint{IP: a("10.1.0.200"), Port: 8443, Serving: true, Terminating: true, NodeName: "node-a", Zone: "z1", IsLocal: true}
	all := []model.Endpoint{local, remote, dying}
	cluster := []model.Endpoint{local, remote}
	if reverse {
		all = []model.Endpoint{dying, remote, local}
		cluster = []model.Endpoint{remote, local}
	}

	st := model.NewNodeState(model.IPv4, model.NodeInfo{
		Name: "node-a", Zone: "z1",
		IPs:      []netip.Addr{a("192.168.0.10"), a("fd00::10")},
		PodCIDRs: []netip.Prefix{p("10.1.0.0/24")},
	})
	st.ServiceCIDRs = []netip.Prefix{p("10.96.0.0/16"), p("10.0.0.0/24")}
	webPort := &model.ServicePort{
		Name: model.ServicePortName{NamespacedName: web, Port: "https", Protocol: model.TCP},
		Type: model.TypeLoadBalancer, ClusterIP: a("10.96.0.20"), Port: 443, NodePort: 31443,
		ExternalIPs:              []netip.Addr{a("203.0.113.9"), a("203.0.113.7")},
		LoadBalancerVIPs:         []netip.Addr{a("198.51.100.1")},
		LoadBalancerSourceRanges: []netip.Prefix{p("198.51.100.0/24"), p("192.0.2.0/24")},
		AffinityTimeoutSeconds:   10800,
		ExternalPolicyLocal:      true,
		HealthCheckNodePort:      32000,
		AllEndpoints:             all,
		ClusterEndpoints:         cluster,
		LocalEndpoints:           []model.Endpoint{local},
		HasAnyEndpoints:          true,
		Topology:                 model.TopologyPreferSameZone,
	}
	dnsPort := &model.ServicePort{
		Name: model.ServicePortName{NamespacedName: dns, Port: "dns", Protocol: model.UDP},
		Type: model.TypeClusterIP, ClusterIP: a("10.96.0.10"), Port: 53,
		InternalPolicyLocal: true,
		// Internal Local policy and nothing local: traffic is dropped; Cluster is unused.
		LocalEndpoints: []model.Endpoint{},
	}
	problems := []model.Problem{
		{Service: web, Object: "Service", Field: "spec.externalIPs[2]", Message: "not an IP address"},
		{Service: web, Object: "EndpointSlice ns1/web-abc", Field: "endpoints[0].addresses[0]", Message: "not an IP address"},
	}
	if reverse {
		st.SetService(dns, []*model.ServicePort{dnsPort}, nil)
		st.SetService(web, []*model.ServicePort{webPort}, []model.Problem{problems[1], problems[0]})
	} else {
		st.SetService(web, []*model.ServicePort{webPort}, problems)
		st.SetService(dns, []*model.ServicePort{dnsPort}, nil)
	}
	return st
}

// testdata/state-view.json is the view of viewTestState(false), indented by two spaces,
// without a final newline.

func TestStateViewJSON(t *testing.T) {
	got, err := json.MarshalIndent(viewTestState(false).View(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/state-view.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("view JSON differs from testdata/state-view.json; got:\n%s", got)
	}
}

func TestStateViewIsDeterministic(t *testing.T) {
	// The same state built in another order (insertion, endpoint and problem order) must
	// give the same bytes, every time (map iteration order varies between calls).
	want, _ := json.Marshal(viewTestState(false).View())
	for i := range 20 {
		got, _ := json.Marshal(viewTestState(i%2 == 1).View())
		if string(got) != string(want) {
			t.Fatalf("view %d differs:\n got %s\nwant %s", i, got, want)
		}
	}
}

func TestStateViewRoundTripsAndFinds(t *testing.T) {
	b, _ := json.Marshal(viewTestState(false).View())
	var v model.StateView
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	sp := v.Find("ns1", "web", "https", model.TCP)
	if sp == nil {
		t.Fatal("Find did not find ns1/web:https/TCP")
	}
	if sp.String() != "ns1/web:https/TCP" || len(sp.LocalEndpoints) != 1 || sp.HealthCheckNodePort != 32000 {
		t.Errorf("round-tripped port %s: %+v", sp, sp)
	}
	if v.Find("ns1", "web", "https", model.UDP) != nil {
		t.Error("Find matched the wrong protocol")
	}
}

func TestEmptyStateViewHasEmptyLists(t *testing.T) {
	b, _ := json.Marshal(model.NewNodeState(model.IPv6, model.NodeInfo{Name: "n"}).View())
	want := `{"schema":"sluice.state/v1","family":"IPv6","node":{"name":"n","zone":"","ips":[],"podCIDRs":[]},"serviceCIDRs":[],"services":[],"problems":[]}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}
