package model

import (
	"net/netip"
	"testing"
)

// ep builds an endpoint 10.0.0.<n>:80 from a compact description.
type ep struct {
	n                           byte
	local                       bool
	ready, serving, terminating bool
	zones, nodes                []string
}

func (e ep) endpoint() Endpoint {
	node := "node-b"
	if e.local {
		node = testNode.Name
	}
	out := Endpoint{
		IP: netip.AddrFrom4([4]byte{10, 0, 0, e.n}), Port: 80,
		Ready: e.ready, Serving: e.serving, Terminating: e.terminating,
		NodeName: node, IsLocal: e.local,
	}
	if len(e.zones)+len(e.nodes) > 0 {
		out.Hints = &EndpointHints{Zones: e.zones, Nodes: e.nodes}
	}
	return out
}

func ready(n byte) ep { return ep{n: n, ready: true, serving: true} }

func (e ep) onThisNode() ep { e.local = true; return e }

func (e ep) servingTerminating() ep { e.ready, e.serving, e.terminating = false, true, true; return e }

func (e ep) notServingTerminating() ep {
	e.ready, e.serving, e.terminating = false, false, true
	return e
}

func (e ep) hintZones(z ...string) ep { e.zones = z; return e }

func (e ep) hintNodes(n ...string) ep { e.nodes = n; return e }

func TestEndpointSelection(t *testing.T) {
	type policy struct {
		internalLocal, externalLocal, nodePort bool
	}
	none := []string(nil) // list not used by this port
	empty := []string{}   // list used, nothing usable
	tests := []struct {
		name         string
		policy       policy
		node         *NodeInfo
		endpoints    []ep
		wantCluster  []string
		wantLocal    []string
		wantAny      bool
		wantTopology TopologyMode
	}{
		{
			name:        "no endpoints: empty Cluster list and no endpoints anywhere",
			wantCluster: empty, wantLocal: none,
		},
		{
			name:        "ready endpoints preferred over serving-terminating",
			endpoints:   []ep{ready(1), ready(2).servingTerminating(), ready(3)},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.3:80"}, wantLocal: none, wantAny: true,
		},
		{
			name:        "Cluster falls back to serving-terminating when none is ready",
			endpoints:   []ep{ready(1).servingTerminating(), ready(2).notServingTerminating()},
			wantCluster: []string{"10.0.0.1:80"}, wantLocal: none, wantAny: true,
		},
		{
			name:        "hasAnyEndpoints false when only non-serving terminating endpoints",
			endpoints:   []ep{ready(1).notServingTerminating(), {n: 2}},
			wantCluster: empty, wantLocal: none, wantAny: false,
		},
		{
			name:        "iTP Local: only local ready endpoints, no Cluster list",
			policy:      policy{internalLocal: true},
			endpoints:   []ep{ready(1), ready(2).onThisNode()},
			wantCluster: none, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
		},
		{
			name:        "iTP Local without local endpoints still knows endpoints exist elsewhere",
			policy:      policy{internalLocal: true},
			endpoints:   []ep{ready(1)},
			wantCluster: none, wantLocal: empty, wantAny: true,
		},
		{
			name:        "local ready preferred over local serving-terminating",
			policy:      policy{internalLocal: true},
			endpoints:   []ep{ready(1).onThisNode().servingTerminating(), ready(2).onThisNode()},
			wantCluster: none, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
		},
		{
			name:        "local falls back to serving-terminating independently of cluster",
			policy:      policy{externalLocal: true, nodePort: true},
			endpoints:   []ep{ready(1), ready(2).onThisNode().servingTerminating()},
			wantCluster: []string{"10.0.0.1:80"}, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
		},
		{
			name:        "eTP Local externally accessible port uses both lists",
			policy:      policy{externalLocal: true, nodePort: true},
			endpoints:   []ep{ready(1), ready(2).onThisNode()},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
		},
		{
			name:        "iTP and eTP Local on a NodePort still has Cluster endpoints for the short-circuit",
			policy:      policy{internalLocal: true, externalLocal: true, nodePort: true},
			endpoints:   []ep{ready(1), ready(2).onThisNode()},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
		},
		{
			name:   "PreferSameZone keeps the endpoints hinted for this zone",
			policy: policy{},
			endpoints: []ep{
				ready(1).hintZones("zone-a"), ready(2).hintZones("zone-b"), ready(3).hintZones("zone-b", "zone-a"),
			},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.3:80"}, wantLocal: none, wantAny: true,
			wantTopology: TopologyPreferSameZone,
		},
		{
			name:        "PreferSameZone ignored when an endpoint lacks hints",
			endpoints:   []ep{ready(1).hintZones("zone-a"), ready(2)},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: none, wantAny: true,
		},
		{
			name:        "PreferSameZone ignored when no endpoint is hinted for this zone",
			endpoints:   []ep{ready(1).hintZones("zone-b"), ready(2).hintZones("zone-c")},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: none, wantAny: true,
		},
		{
			name:        "PreferSameZone ignored when the node has no zone",
			node:        &NodeInfo{Name: "node-a"},
			endpoints:   []ep{ready(1).hintZones(""), ready(2).hintZones("zone-a")},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: none, wantAny: true,
		},
		{
			name: "PreferSameNode wins over zone",
			endpoints: []ep{
				ready(1).hintZones("zone-a").hintNodes("node-a"), ready(2).hintZones("zone-a").hintNodes("node-c"),
			},
			wantCluster: []string{"10.0.0.1:80"}, wantLocal: none, wantAny: true,
			wantTopology: TopologyPreferSameNode,
		},
		{
			name: "PreferSameNode ignored when an endpoint lacks node hints: zone hints apply",
			endpoints: []ep{
				ready(1).hintZones("zone-a").hintNodes("node-a"), ready(2).hintZones("zone-b"), ready(3).hintZones("zone-a"),
			},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.3:80"}, wantLocal: none, wantAny: true,
			wantTopology: TopologyPreferSameZone,
		},
		{
			name:        "PreferSameNode ignored when no endpoint is hinted for this node",
			endpoints:   []ep{ready(1).hintNodes("node-b"), ready(2).hintNodes("node-c")},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: none, wantAny: true,
		},
		{
			name: "topology looks only at ready endpoints",
			endpoints: []ep{
				ready(1).hintZones("zone-a"), ready(2).hintZones("zone-b"), ready(3).servingTerminating(),
			},
			wantCluster: []string{"10.0.0.1:80"}, wantLocal: none, wantAny: true,
			wantTopology: TopologyPreferSameZone,
		},
		{
			name:   "topology does not narrow local endpoints",
			policy: policy{externalLocal: true, nodePort: true},
			endpoints: []ep{
				ready(1).hintZones("zone-a"), ready(2).onThisNode().hintZones("zone-b"),
			},
			wantCluster: []string{"10.0.0.1:80"}, wantLocal: []string{"10.0.0.2:80"}, wantAny: true,
			wantTopology: TopologyPreferSameZone,
		},
		{
			name:        "no topology when only terminating endpoints remain",
			endpoints:   []ep{ready(1).servingTerminating().hintZones("zone-b"), ready(2).servingTerminating().hintZones("zone-a")},
			wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"}, wantLocal: none, wantAny: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode
			if tc.node != nil {
				node = *tc.node
			}
			sp := &ServicePort{InternalPolicyLocal: tc.policy.internalLocal, ExternalPolicyLocal: tc.policy.externalLocal}
			if tc.policy.nodePort {
				sp.NodePort = 30080
			}
			for _, e := range tc.endpoints {
				sp.AllEndpoints = append(sp.AllEndpoints, e.endpoint())
			}
			selectEndpoints(sp, node)
			if d := diff(tc.wantCluster, endpointStrings(sp.ClusterEndpoints)); d != "" {
				t.Errorf("ClusterEndpoints (-want +got):\n%s", d)
			}
			if d := diff(tc.wantLocal, endpointStrings(sp.LocalEndpoints)); d != "" {
				t.Errorf("LocalEndpoints (-want +got):\n%s", d)
			}
			if sp.HasAnyEndpoints != tc.wantAny {
				t.Errorf("HasAnyEndpoints = %v", sp.HasAnyEndpoints)
			}
			if sp.Topology != tc.wantTopology {
				t.Errorf("Topology = %q, want %q", sp.Topology, tc.wantTopology)
			}
		})
	}
}

func TestClusterEndpointsShareAllEndpointsWhenAllAreUsable(t *testing.T) {
	sp := &ServicePort{AllEndpoints: []Endpoint{ready(1).endpoint(), ready(2).endpoint()}}
	selectEndpoints(sp, testNode)
	if &sp.ClusterEndpoints[0] != &sp.AllEndpoints[0] {
		t.Error("ClusterEndpoints copied although it equals AllEndpoints")
	}
}
