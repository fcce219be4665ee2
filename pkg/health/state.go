package health

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// HealthCheckNodePorts returns, for SyncServices, the healthCheckNodePort of every Service
// in state that has one (LoadBalancer Services with externalTrafficPolicy Local).
func HealthCheckNodePorts(state *model.NodeState) map[types.NamespacedName]int32 {
	out := map[types.NamespacedName]int32{}
	for name, sp := range state.Services {
		if sp.HealthCheckNodePort != 0 {
			out[name.NamespacedName] = sp.HealthCheckNodePort
		}
	}
	return out
}

// LocalReadyEndpoints returns, for SyncEndpoints, the number of this node's ready, not
// terminating, endpoints of every Service in state that has any. Like upstream, it counts
// distinct IPs across all ports of the Service: a pod serving both 80 and 443 is one
// endpoint, not two.
func LocalReadyEndpoints(state *model.NodeState) map[types.NamespacedName]int {
	ips := map[types.NamespacedName]map[netip.Addr]struct{}{}
	for name, sp := range state.Services {
		for i := range sp.AllEndpoints {
			ep := &sp.AllEndpoints[i]
			if !ep.IsLocal || !ep.Ready || ep.Terminating {
				continue
			}
			set := ips[name.NamespacedName]
			if set == nil {
				set = map[netip.Addr]struct{}{}
				ips[name.NamespacedName] = set
			}
			set[ep.IP] = struct{}{}
		}
	}
	out := make(map[types.NamespacedName]int, len(ips))
	for name, set := range ips {
		out[name] = len(set)
	}
	return out
}
