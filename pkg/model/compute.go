package model

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Compute returns the whole node's state, one NodeState per family of opts, from every
// Service and EndpointSlice of the cluster. Service names must be unique (a later duplicate
// replaces an earlier one); slices without the kubernetes.io/service-name label are ignored.
//
// It is what `sluice render` and tests use, and the reference the Tracker must agree with:
// after the Tracker has drained every change, its states are equal to Compute's on the
// same objects.
func Compute(services []*v1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo, serviceCIDRs []netip.Prefix, opts Options) map[IPFamily]*NodeState {
	bySvc := make(map[types.NamespacedName][]*discoveryv1.EndpointSlice, len(services))
	for _, s := range slices {
		if s == nil {
			continue
		}
		if name, ok := ServiceNameOf(s); ok {
			bySvc[name] = append(bySvc[name], s)
		}
	}
	states := make(map[IPFamily]*NodeState, len(opts.families()))
	for _, family := range opts.families() {
		st := NewNodeState(family, node)
		st.ServiceCIDRs = serviceCIDRsOf(serviceCIDRs, family)
		states[family] = st
	}
	for _, svc := range services {
		if svc == nil {
			continue
		}
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		for family, st := range states {
			ports, problems := ComputeService(svc, bySvc[name], node, family, opts)
			st.SetService(name, ports, problems)
		}
	}
	return states
}

// serviceCIDRsOf returns the prefixes of family, nil when there are none.
func serviceCIDRsOf(cidrs []netip.Prefix, family IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range cidrs {
		if p.IsValid() && FamilyOf(p.Addr()) == family {
			out = append(out, p)
		}
	}
	return out
}
