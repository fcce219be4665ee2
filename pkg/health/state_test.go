package health

import (
	"maps"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestHealthCheckInputsFromState(t *testing.T) {
	ep := func(ip string, port int32, local, ready, terminating bool) model.Endpoint {
		return model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, IsLocal: local, Ready: ready, Serving: ready || terminating, Terminating: terminating}
	}
	lb := types.NamespacedName{Namespace: "ns1", Name: "lb"}
	other := types.NamespacedName{Namespace: "ns1", Name: "cluster"}
	st := model.NewNodeState(model.IPv4, model.NodeInfo{Name: "node-a"})
	st.SetService(lb, []*model.ServicePort{
		{
			Name: model.ServicePortName{NamespacedName: lb, Port: "http", Protocol: model.TCP}, Type: model.TypeLoadBalancer,
			HealthCheckNodePort: 30100,
			AllEndpoints: []model.Endpoint{
				ep("10.1.0.1", 80, true, true, false),
				ep("10.1.0.2", 80, true, false, true),  // terminating: not counted
				ep("10.1.0.3", 80, false, true, false), // remote: not counted
				ep("10.1.0.4", 80, true, false, false), // not ready: not counted
			},
		},
		{
			Name: model.ServicePortName{NamespacedName: lb, Port: "https", Protocol: model.TCP}, Type: model.TypeLoadBalancer,
			HealthCheckNodePort: 30100,
			AllEndpoints: []model.Endpoint{
				ep("10.1.0.1", 443, true, true, false), // same pod as above: one endpoint
				ep("10.1.0.5", 443, true, true, false),
			},
		},
	}, nil)
	st.SetService(other, []*model.ServicePort{{
		Name:         model.ServicePortName{NamespacedName: other, Protocol: model.UDP},
		Type:         model.TypeClusterIP,
		AllEndpoints: []model.Endpoint{ep("10.1.0.9", 53, true, true, false)},
	}}, nil)

	if got, want := HealthCheckNodePorts(st), map[types.NamespacedName]int32{lb: 30100}; !maps.Equal(got, want) {
		t.Errorf("HealthCheckNodePorts = %v, want %v", got, want)
	}
	if got, want := LocalReadyEndpoints(st), map[types.NamespacedName]int{lb: 2, other: 1}; !maps.Equal(got, want) {
		t.Errorf("LocalReadyEndpoints = %v, want %v", got, want)
	}
}
