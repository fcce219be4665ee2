package model

import "slices"

// selectEndpoints fills the endpoint lists of sp that depend on traffic policy and topology
// (ClusterEndpoints, LocalEndpoints, HasAnyEndpoints, Topology) from sp.AllEndpoints.
//
// Usable endpoints are the ready ones or, when there are none, the serving+terminating ones
// (so that a rolling update of the last pods keeps traffic flowing while they drain). The
// Cluster and Local lists fall back independently: Local may use terminating endpoints on
// this node while Cluster still has ready ones elsewhere.
//
// Topology hints only narrow the ready Cluster endpoints, and only when the hints cover
// every ready endpoint and at least one is meant for this node (or zone); otherwise the
// hints are ignored rather than risking a node with nothing to send to.
func selectEndpoints(sp *ServicePort, node NodeInfo) {
	all := sp.AllEndpoints
	for i := range all {
		if usable(&all[i]) {
			sp.HasAnyEndpoints = true
			break
		}
	}

	if sp.UsesClusterEndpoints() {
		sp.Topology = topologyMode(all, node)
		sp.ClusterEndpoints = filterEndpoints(all, func(e *Endpoint) bool {
			return e.Ready && availableForTopology(e, sp.Topology, node)
		})
		if len(sp.ClusterEndpoints) == 0 {
			sp.ClusterEndpoints = filterEndpoints(all, servingTerminating)
		}
	}
	if sp.UsesLocalEndpoints() {
		sp.LocalEndpoints = filterEndpoints(all, func(e *Endpoint) bool { return e.IsLocal && e.Ready })
		if len(sp.LocalEndpoints) == 0 {
			sp.LocalEndpoints = filterEndpoints(all, func(e *Endpoint) bool { return e.IsLocal && servingTerminating(e) })
		}
	}
}

// usable reports whether traffic may be sent to e under some policy.
func usable(e *Endpoint) bool { return e.Ready || servingTerminating(e) }

func servingTerminating(e *Endpoint) bool { return e.Serving && e.Terminating }

// topologyMode chooses the hint-based filtering for the Cluster endpoints. Only ready
// endpoints count: terminating ones are a fallback that topology never narrows.
func topologyMode(all []Endpoint, node NodeInfo) TopologyMode {
	hasReady := false
	allNodeHints, forThisNode := true, false
	allZoneHints, forThisZone := true, false
	for i := range all {
		e := &all[i]
		if !e.Ready {
			continue
		}
		hasReady = true
		if len(e.NodeHints()) == 0 {
			allNodeHints = false
		} else if node.Name != "" && slices.Contains(e.NodeHints(), node.Name) {
			forThisNode = true
		}
		if len(e.ZoneHints()) == 0 {
			allZoneHints = false
		} else if node.Zone != "" && slices.Contains(e.ZoneHints(), node.Zone) {
			forThisZone = true
		}
	}
	switch {
	case !hasReady:
		return TopologyNone
	case allNodeHints && forThisNode:
		return TopologyPreferSameNode
	case allZoneHints && forThisZone:
		return TopologyPreferSameZone
	}
	return TopologyNone
}

// availableForTopology reports whether e may receive this node's traffic under mode.
func availableForTopology(e *Endpoint, mode TopologyMode, node NodeInfo) bool {
	switch mode {
	case TopologyPreferSameNode:
		return slices.Contains(e.NodeHints(), node.Name)
	case TopologyPreferSameZone:
		return slices.Contains(e.ZoneHints(), node.Zone)
	}
	return true
}

// filterEndpoints returns the endpoints keep accepts, never nil. When it accepts all of
// them the result shares all's array: published endpoint lists are immutable, and most
// ports have every endpoint ready, so this saves a copy of the largest lists.
func filterEndpoints(all []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	n := 0
	for i := range all {
		if keep(&all[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return []Endpoint{}
	case len(all):
		return all
	}
	out := make([]Endpoint, 0, n)
	for i := range all {
		if keep(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out
}
