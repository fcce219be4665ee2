package explain

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestSelectionMatchesModel is the guarantee that an explanation can never disagree with
// what the daemon programs: on random Services and EndpointSlices (conditions set, unset or
// contradictory, endpoints on this node, other nodes or none, zone and node hints on some,
// all or none of them, a node with or without a zone), Select's candidates must be exactly
// the model's ClusterEndpoints and LocalEndpoints, and its topology mode the model's.
func TestSelectionMatchesModel(t *testing.T) {
	// seen counts reasons, topology modes, fallbacks and verdicts, so that the test fails
	// if the generator stops producing some case.
	seen := map[string]int{}
	defer func() {
		want := []string{"topology:", "topology:PreferSameZone", "topology:PreferSameNode", "fallback:true", "fallback:false",
			"verdict:" + string(CauseEndpoints), "verdict:" + string(CauseNoEndpoints), "verdict:" + string(CauseNoLocalEndpoints), "verdict:" + string(CauseSourceRange)}
		for _, r := range []Reason{ReasonReady, ReasonServingTerminating, ReasonNotReady, ReasonTerminatingNotServing,
			ReasonTerminatingWhileReady, ReasonOtherZone, ReasonOtherNode, ReasonNotLocal} {
			want = append(want, "reason:"+string(r))
		}
		for _, w := range want {
			if seen[w] == 0 {
				t.Errorf("the random states never produced %s", w)
			}
		}
		t.Logf("coverage: %v", seen)
	}()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		for i := range 200 {
			node := nodeA
			if rng.IntN(4) == 0 {
				node.Zone = ""
			}
			svc, slices := randomService(rng, i)
			states := model.Compute([]*v1.Service{svc}, slices, node, nil, model.Options{Families: []model.IPFamily{model.IPv4}})
			view := states[model.IPv4].View()
			for j := range view.Services {
				sp := &view.Services[j]
				where := fmt.Sprintf("seed %d case %d %s", seed, i, sp.String())
				if sp.ClusterEndpoints != nil {
					sel := Select(sp, view.Node, PolicyCluster)
					assertSameEndpoints(t, where+" Cluster", sel.Candidates(), sp.ClusterEndpoints)
					if sel.Topology != sp.Topology {
						t.Errorf("%s: topology %q, the model's %q", where, sel.Topology, sp.Topology)
					}
					assertDecisionsCoverAll(t, where, sel, sp)
					count(seen, sel)
				}
				if sp.LocalEndpoints != nil {
					sel := Select(sp, view.Node, PolicyLocal)
					assertSameEndpoints(t, where+" Local", sel.Candidates(), sp.LocalEndpoints)
					assertDecisionsCoverAll(t, where, sel, sp)
					count(seen, sel)
				}
				checkRandomPackets(t, rng, where, &view, sp, seen)
			}
		}
	}
}

// checkRandomPackets explains packets to every address of sp from every kind of source,
// in every mode, and checks the verdict against the model's lists.
func checkRandomPackets(t *testing.T, rng *rand.Rand, where string, view *model.StateView, sp *model.ServicePortView, seen map[string]int) {
	t.Helper()
	type target struct {
		dst string
		via Via
	}
	targets := []target{{fmt.Sprintf("%s:%d", sp.ClusterIP, sp.Port), ViaClusterIP}}
	if sp.NodePort != 0 {
		targets = append(targets, target{fmt.Sprintf("172.18.0.2:%d", sp.NodePort), ViaNodePort})
	}
	for _, lb := range sp.LoadBalancerVIPs {
		targets = append(targets, target{fmt.Sprintf("%s:%d", lb, sp.Port), ViaLoadBalancerIP})
	}
	sources := []netip.Addr{externalClient, podA0, podB0, nodeAIP}
	for _, mode := range []dataplane.Mode{dataplane.ModeIPTables, dataplane.ModeNFTables, dataplane.ModeIPVS} {
		cfg := defaultConfig()
		cfg.Mode = mode
		tg := targets[rng.IntN(len(targets))]
		src := sources[rng.IntN(len(sources))]
		p := pkt(src, tg.dst)
		p.Protocol = model.Protocol(sp.Protocol)
		e := Explain(view, cfg, p)
		w := fmt.Sprintf("%s %s %s->%s", where, mode, src, tg.dst)
		seen["verdict:"+string(e.Verdict.Cause)]++
		if e.Match == nil || e.Match.Via != tg.via {
			t.Errorf("%s: matched %+v, want via %s", w, e.Match, tg.via)
			continue
		}
		if e.Verdict.Cause == CauseSourceRange {
			continue
		}
		var list []model.EndpointView
		switch e.Policy.Applied {
		case PolicyCluster:
			list = sp.ClusterEndpoints
		case PolicyLocal:
			list = sp.LocalEndpoints
		}
		if list == nil {
			t.Errorf("%s: policy %s applied, but the model does not use that list", w, e.Policy.Applied)
			continue
		}
		if got, want := strings.Join(e.Candidates, ","), strings.Join(ipsOf(list), ","); got != want {
			t.Errorf("%s: candidates %s, the model's %s list %s", w, got, e.Policy.Applied, want)
		}
		switch {
		case !sp.HasAnyEndpoints && e.Verdict.Action != ActionReject:
			t.Errorf("%s: no endpoints anywhere but verdict %+v", w, e.Verdict)
		case sp.HasAnyEndpoints && len(list) == 0 && e.Verdict.Action == ActionDNAT:
			t.Errorf("%s: empty list but verdict %+v", w, e.Verdict)
		case len(list) > 0 && e.Verdict.Action != ActionDNAT:
			t.Errorf("%s: %d candidates but verdict %+v", w, len(list), e.Verdict)
		}
	}
}

func count(seen map[string]int, sel Selection) {
	seen["topology:"+sel.Topology]++
	seen[fmt.Sprintf("fallback:%v", sel.Fallback)]++
	for _, d := range sel.Decisions {
		seen["reason:"+string(d.Reason)]++
	}
}

func assertSameEndpoints(t *testing.T, where string, got, want []model.EndpointView) {
	t.Helper()
	if g, w := strings.Join(ipsOf(got), ","), strings.Join(ipsOf(want), ","); g != w {
		t.Errorf("%s: candidates [%s], the model's [%s]", where, g, w)
	}
}

// assertDecisionsCoverAll checks every endpoint has exactly one decision with a reason.
func assertDecisionsCoverAll(t *testing.T, where string, sel Selection, sp *model.ServicePortView) {
	t.Helper()
	if len(sel.Decisions) != len(sp.AllEndpoints) {
		t.Errorf("%s: %d decisions for %d endpoints", where, len(sel.Decisions), len(sp.AllEndpoints))
		return
	}
	for i, d := range sel.Decisions {
		if d.Endpoint.IP != sp.AllEndpoints[i].IP || d.Reason == "" || d.Detail == "" {
			t.Errorf("%s: decision %d %+v is incomplete or out of order", where, i, d)
		}
	}
}

// randomService returns one Service (random type and policies, one or two ports) and one
// or two EndpointSlices with random endpoints.
func randomService(rng *rand.Rand, i int) (*v1.Service, []*discoveryv1.EndpointSlice) {
	types := []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer}
	typ := types[rng.IntN(len(types))]
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)},
		Spec: v1.ServiceSpec{
			Type:      typ,
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if rng.IntN(3) == 0 {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)})
	}
	if typ != v1.ServiceTypeClusterIP {
		for j := range svc.Spec.Ports {
			svc.Spec.Ports[j].NodePort = int32(30000 + j)
		}
	}
	if typ == v1.ServiceTypeLoadBalancer {
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}}
		if rng.IntN(3) == 0 {
			svc.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		}
	}
	if rng.IntN(2) == 0 {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
	if rng.IntN(3) == 0 {
		svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}

	maybe := func() *bool {
		switch rng.IntN(5) {
		case 0:
			return nil
		case 1, 2:
			return ptr.To(true)
		}
		return ptr.To(false)
	}
	subset := func(from ...string) []string {
		var out []string
		for _, s := range from {
			if rng.IntN(2) == 0 {
				out = append(out, s)
			}
		}
		return out
	}
	nodes := []string{"node-a", "node-b", "node-c", ""}
	hintMode := rng.IntN(4) // 0: none, 1: zones on most, 2: nodes on most, 3: both on most
	var out []*discoveryv1.EndpointSlice
	for s := range 1 + rng.IntN(2) {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc-%d-%d", i, s), Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)},
				{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To[int32](5353)},
			},
		}
		for range rng.IntN(7) {
			node := nodes[rng.IntN(len(nodes))]
			d := discoveryv1.Endpoint{
				// Few addresses, so that duplicates across slices happen.
				Addresses:  []string{fmt.Sprintf("10.244.%d.%d", 1+rng.IntN(2), 10+rng.IntN(6))},
				Conditions: discoveryv1.EndpointConditions{Ready: maybe(), Serving: maybe(), Terminating: maybe()},
			}
			if node != "" {
				d.NodeName = ptr.To(node)
				d.Zone = ptr.To("zone-" + node[len(node)-1:])
			}
			if hintMode > 0 && rng.IntN(6) > 0 {
				var zones, nodes []string
				if hintMode&1 != 0 {
					zones = subset("zone-a", "zone-b")
				}
				if hintMode&2 != 0 {
					nodes = subset("node-a", "node-b")
				}
				d.Hints = hints(zones, nodes)
			}
			slice.Endpoints = append(slice.Endpoints, d)
		}
		out = append(out, slice)
	}
	return svc, slices.Clip(out)
}
