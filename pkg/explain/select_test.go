package explain

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestSelectGivesEveryEndpointAReason(t *testing.T) {
	type want struct {
		candidate bool
		reason    Reason
		detail    string // a substring of the detail
	}
	tests := []struct {
		name     string
		policy   Policy
		eps      []ep
		topology model.TopologyMode
		fallback bool
		// topologyDetail is a substring of the selection's topology detail ("" for none).
		topologyDetail string
		want           map[string]want
	}{
		{
			name:   "ready endpoints are candidates, not-ready ones are out",
			policy: PolicyCluster,
			eps:    []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b"), notReady("10.244.2.11", "node-b")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "ready"},
				"10.244.2.10": {true, ReasonReady, "ready"},
				"10.244.2.11": {false, ReasonNotReady, "not ready"},
			},
		},
		{
			name:   "terminating endpoints are out while ready ones exist",
			policy: PolicyCluster,
			eps:    []ep{ready("10.244.1.10", "node-a"), servingTerminating("10.244.2.10", "node-b"), terminatingGone("10.244.2.11", "node-b")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "ready"},
				"10.244.2.10": {false, ReasonTerminatingWhileReady, "and 1 is"},
				"10.244.2.11": {false, ReasonTerminatingNotServing, "no longer serving"},
			},
		},
		{
			name:     "serving terminating endpoints are the fallback when none is ready",
			policy:   PolicyCluster,
			fallback: true,
			eps:      []ep{servingTerminating("10.244.1.10", "node-a"), terminatingGone("10.244.2.10", "node-b"), notReady("10.244.2.11", "node-b")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonServingTerminating, "no endpoint is ready"},
				"10.244.2.10": {false, ReasonTerminatingNotServing, "no longer serving"},
				"10.244.2.11": {false, ReasonNotReady, "not ready"},
			},
		},
		{
			name:   "a not-ready endpoint that says serving is still not a fallback",
			policy: PolicyCluster,
			eps:    []ep{{ip: "10.244.2.10", node: "node-b", serving: true}, ready("10.244.1.10", "node-a")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "ready"},
				"10.244.2.10": {false, ReasonNotReady, "only terminating endpoints are a fallback"},
			},
		},
		{
			name:           "other zones are out under PreferSameZone",
			policy:         PolicyCluster,
			topology:       model.TopologyPreferSameZone,
			topologyDetail: "PreferSameZone: every ready endpoint has zone hints and 1 is for this node's zone zone-a",
			eps:            []ep{ready("10.244.1.10", "node-a").zones("zone-a"), ready("10.244.2.10", "node-b").zones("zone-b", "zone-c")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "hinted for this node's zone zone-a"},
				"10.244.2.10": {false, ReasonOtherZone, "hinted for zone zone-b or zone-c, not this node's zone zone-a"},
			},
		},
		{
			name:           "other nodes are out under PreferSameNode",
			policy:         PolicyCluster,
			topology:       model.TopologyPreferSameNode,
			topologyDetail: "PreferSameNode",
			eps:            []ep{ready("10.244.1.10", "node-a").nodes("node-a").zones("zone-a"), ready("10.244.2.10", "node-b").nodes("node-b").zones("zone-a")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "hinted for this node"},
				"10.244.2.10": {false, ReasonOtherNode, "hinted for node node-b, not this node node-a"},
			},
		},
		{
			name:           "zone hints are ignored when a ready endpoint has none",
			policy:         PolicyCluster,
			topologyDetail: "zone hints ignored: ready endpoint 10.244.2.10:8080 has none",
			eps:            []ep{ready("10.244.1.10", "node-a").zones("zone-a"), ready("10.244.2.10", "node-b")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "ready"},
				"10.244.2.10": {true, ReasonReady, "ready"},
			},
		},
		{
			name:           "zone hints are ignored when none is for this zone",
			policy:         PolicyCluster,
			topologyDetail: "none is for this node's zone zone-a",
			eps:            []ep{ready("10.244.2.10", "node-b").zones("zone-b")},
			want:           map[string]want{"10.244.2.10": {true, ReasonReady, "ready"}},
		},
		{
			name:           "hints on terminating endpoints never narrow the fallback",
			policy:         PolicyCluster,
			fallback:       true,
			topologyDetail: "no endpoint is ready",
			eps:            []ep{servingTerminating("10.244.2.10", "node-b").zones("zone-b")},
			want:           map[string]want{"10.244.2.10": {true, ReasonServingTerminating, "no endpoint is ready"}},
		},
		{
			name:   "the Local list keeps this node's ready endpoints only",
			policy: PolicyLocal,
			eps:    []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b"), servingTerminating("10.244.1.11", "node-a")},
			want: map[string]want{
				"10.244.1.10": {true, ReasonReady, "on this node"},
				"10.244.1.11": {false, ReasonTerminatingWhileReady, "no endpoint on this node is ready, and 1 is"},
				"10.244.2.10": {false, ReasonNotLocal, "on node node-b"},
			},
		},
		{
			name:     "the Local list falls back alone to this node's serving terminating endpoints",
			policy:   PolicyLocal,
			fallback: true,
			eps:      []ep{ready("10.244.2.10", "node-b"), servingTerminating("10.244.1.11", "node-a")},
			want: map[string]want{
				"10.244.1.11": {true, ReasonServingTerminating, "no endpoint on this node is ready"},
				"10.244.2.10": {false, ReasonNotLocal, "Local policy uses only this node's endpoints"},
			},
		},
		{
			name:     "the Local list ignores topology hints",
			policy:   PolicyLocal,
			fallback: true,
			eps:      []ep{ready("10.244.2.10", "node-b").zones("zone-a")},
			want:     map[string]want{"10.244.2.10": {false, ReasonNotLocal, "on node node-b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := svc{name: "web", clusterIP: "10.96.0.10", eps: tt.eps, itpLocal: tt.policy == PolicyLocal}
			state := stateOf(t, s)
			sp := &state.Services[0]
			sel := Select(sp, state.Node, tt.policy)
			if sel.Policy != tt.policy || sel.Fallback != tt.fallback || sel.Topology != string(tt.topology) {
				t.Errorf("selection: policy %s fallback %v topology %q, want %s %v %q", sel.Policy, sel.Fallback, sel.Topology, tt.policy, tt.fallback, tt.topology)
			}
			if !strings.Contains(sel.TopologyDetail, tt.topologyDetail) || (tt.topologyDetail == "" && sel.TopologyDetail != "") {
				t.Errorf("topology detail %q, want it to contain %q", sel.TopologyDetail, tt.topologyDetail)
			}
			if len(sel.Decisions) != len(tt.want) {
				t.Fatalf("%d decisions, want %d: %+v", len(sel.Decisions), len(tt.want), sel.Decisions)
			}
			for _, d := range sel.Decisions {
				w, ok := tt.want[d.Endpoint.IP]
				if !ok {
					t.Errorf("unexpected endpoint %s", d.Endpoint.IP)
					continue
				}
				if d.Candidate != w.candidate || d.Reason != w.reason || !strings.Contains(d.Detail, w.detail) {
					t.Errorf("%s: candidate %v reason %s detail %q; want %v %s containing %q", d.Endpoint.IP, d.Candidate, d.Reason, d.Detail, w.candidate, w.reason, w.detail)
				}
			}
			// The candidates are the model's list, whatever the case.
			modelList := sp.ClusterEndpoints
			if tt.policy == PolicyLocal {
				modelList = sp.LocalEndpoints
			}
			if got := ipsOf(sel.Candidates()); strings.Join(got, ",") != strings.Join(ipsOf(modelList), ",") {
				t.Errorf("candidates %v, the model's list %v", got, ipsOf(modelList))
			}
		})
	}
}

func TestSelectCandidatesAreNeverNil(t *testing.T) {
	state := stateOf(t, svc{name: "empty", clusterIP: "10.96.0.10", typ: v1.ServiceTypeClusterIP})
	sel := Select(&state.Services[0], state.Node, PolicyCluster)
	if c := sel.Candidates(); c == nil || len(c) != 0 {
		t.Errorf("Candidates() = %#v, want an empty non-nil list", c)
	}
}

func ipsOf(eps []model.EndpointView) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, addrPort(&e))
	}
	return out
}
