package model

import "slices"

// Equal reports whether sp and o program the same thing. The tracker uses it to drop
// no-op updates (informer resyncs, changes to fields the proxy ignores); it is what
// reflect.DeepEqual would say, without reflection. TestServicePortEqualCoversEveryField
// fails when a field is added to ServicePort or Endpoint and not compared here.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	if sp == o {
		return true
	}
	if sp == nil || o == nil {
		return false
	}
	return sp.Name == o.Name &&
		sp.Type == o.Type &&
		sp.ClusterIP == o.ClusterIP &&
		sp.Port == o.Port &&
		sp.NodePort == o.NodePort &&
		slices.Equal(sp.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(sp.LoadBalancerVIPs, o.LoadBalancerVIPs) &&
		slices.Equal(sp.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		sp.AffinityTimeoutSeconds == o.AffinityTimeoutSeconds &&
		sp.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		sp.InternalPolicyLocal == o.InternalPolicyLocal &&
		sp.HealthCheckNodePort == o.HealthCheckNodePort &&
		sp.Scheduler == o.Scheduler &&
		sp.Counted == o.Counted &&
		sp.HasAnyEndpoints == o.HasAnyEndpoints &&
		sp.Topology == o.Topology &&
		endpointsEqual(sp.AllEndpoints, o.AllEndpoints) &&
		endpointsEqual(sp.ClusterEndpoints, o.ClusterEndpoints) &&
		endpointsEqual(sp.LocalEndpoints, o.LocalEndpoints)
}

// endpointsEqual compares endpoint lists; nil and empty differ (nil means "not used").
func endpointsEqual(a, b []Endpoint) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	if len(a) > 0 && &a[0] == &b[0] {
		return true // the same array: lists are immutable once published
	}
	for i := range a {
		if !a[i].Equal(&b[i]) {
			return false
		}
	}
	return true
}

// Equal reports whether e and o are the same endpoint with the same conditions and hints.
// Every field but Hints is comparable, so one comparison covers them (and any added
// later); the hints are compared by value.
func (e *Endpoint) Equal(o *Endpoint) bool {
	a, b := *e, *o
	a.Hints, b.Hints = nil, nil
	return a == b &&
		slices.Equal(e.ZoneHints(), o.ZoneHints()) &&
		slices.Equal(e.NodeHints(), o.NodeHints())
}
