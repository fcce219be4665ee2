package explain

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// This file re-evaluates the model's endpoint selection (pkg/model/select.go, documented in
// pkg/model/README.md "Selection") endpoint by endpoint, to say why each one is or is not a
// candidate. TestSelectionMatchesModel checks on random states that the candidates are
// exactly the model's lists: if the model's rules change, that test fails until this file
// follows.

// Policy names the endpoint list a packet is sent to.
type Policy string

const (
	// PolicyCluster is the list for traffic under Cluster policy: ready endpoints anywhere
	// (narrowed by topology hints), else serving+terminating ones.
	PolicyCluster Policy = "Cluster"
	// PolicyLocal is the list for traffic under Local policy: this node's ready endpoints,
	// else this node's serving+terminating ones.
	PolicyLocal Policy = "Local"
)

// Reason says why an endpoint is, or is not, a candidate of a Selection.
type Reason string

// Reasons of candidates.
const (
	// ReasonReady: a ready endpoint, allowed by the policy and topology.
	ReasonReady Reason = "Ready"
	// ReasonServingTerminating: no endpoint of the list is ready, so serving+terminating
	// endpoints are used (they still accept new connections while draining).
	ReasonServingTerminating Reason = "ServingTerminatingFallback"
)

// Reasons of excluded endpoints.
const (
	// ReasonNotReady: not ready and not terminating (a pod failing its readiness probe,
	// or starting). Only terminating endpoints are ever a fallback.
	ReasonNotReady Reason = "NotReady"
	// ReasonTerminatingNotServing: terminating and no longer serving.
	ReasonTerminatingNotServing Reason = "TerminatingNotServing"
	// ReasonTerminatingWhileReady: terminating but still serving; used only when no
	// endpoint of the list is ready, and some are.
	ReasonTerminatingWhileReady Reason = "TerminatingWhileReadyExist"
	// ReasonOtherZone: ready, but its zone hints are for other zones while the Service is
	// under PreferSameZone topology on this node.
	ReasonOtherZone Reason = "OtherZone"
	// ReasonOtherNode: ready, but its node hints are for other nodes while the Service is
	// under PreferSameNode topology on this node.
	ReasonOtherNode Reason = "OtherNodeHinted"
	// ReasonNotLocal: runs on another node, and the Local policy only uses this node's
	// endpoints.
	ReasonNotLocal Reason = "NotLocal"
)

// EndpointDecision is one endpoint of a Service port and what a Selection made of it.
type EndpointDecision struct {
	Endpoint  model.EndpointView `json:"endpoint"`
	Candidate bool               `json:"candidate"`
	Reason    Reason             `json:"reason"`
	// Detail says the same as Reason in words, with this endpoint's specifics.
	Detail string `json:"detail"`
}

// Selection is one policy's endpoint list for a Service port, with a decision for every
// endpoint of the port (in AllEndpoints order: sorted by IP and port).
type Selection struct {
	Policy Policy `json:"policy"`
	// Topology is the hint-based filtering in effect ("", "PreferSameZone",
	// "PreferSameNode"); only the Cluster list is ever narrowed by it.
	Topology string `json:"topology"`
	// TopologyDetail says why that topology mode was chosen, or why hints were ignored;
	// "" when no endpoint carries hints.
	TopologyDetail string `json:"topologyDetail,omitempty"`
	// Fallback is true when no endpoint of the list is ready, so the serving+terminating
	// ones are used.
	Fallback  bool               `json:"fallback"`
	Decisions []EndpointDecision `json:"endpoints"`
}

// Candidates returns the endpoints the list holds, in AllEndpoints order; never nil.
func (s *Selection) Candidates() []model.EndpointView {
	out := []model.EndpointView{}
	for _, d := range s.Decisions {
		if d.Candidate {
			out = append(out, d.Endpoint)
		}
	}
	return out
}

// Select re-evaluates one policy's list of sp on node, with a reason for every endpoint.
func Select(sp *model.ServicePortView, node model.NodeView, policy Policy) Selection {
	if policy == PolicyLocal {
		return selectLocal(sp)
	}
	return selectCluster(sp, node)
}

// selectCluster: ready endpoints allowed by topology; if there are none, the serving and
// terminating ones.
func selectCluster(sp *model.ServicePortView, node model.NodeView) Selection {
	all := sp.AllEndpoints
	mode, modeDetail := topologyOf(all, node)
	s := Selection{Policy: PolicyCluster, Topology: string(mode), TopologyDetail: modeDetail}
	decideAll(&s, all,
		func(e *model.EndpointView) bool { return e.Ready && allowedByTopology(e, mode, node) },
		func(e *model.EndpointView, primary int) (bool, Reason, string) {
			switch {
			case !s.Fallback && e.Ready && allowedByTopology(e, mode, node):
				switch mode {
				case model.TopologyPreferSameZone:
					return true, ReasonReady, "ready, hinted for this node's zone " + node.Zone
				case model.TopologyPreferSameNode:
					return true, ReasonReady, "ready, hinted for this node"
				}
				return true, ReasonReady, "ready"
			case !s.Fallback && e.Ready && mode == model.TopologyPreferSameZone:
				return false, ReasonOtherZone, fmt.Sprintf("ready, but hinted for zone %s, not this node's zone %s (PreferSameZone)", listOr(e.ZoneHints), node.Zone)
			case !s.Fallback && e.Ready && mode == model.TopologyPreferSameNode:
				return false, ReasonOtherNode, fmt.Sprintf("ready, but hinted for node %s, not this node %s (PreferSameNode)", listOr(e.NodeHints), node.Name)
			}
			return conditionDecision(e, s.Fallback, primary, "")
		})
	return s
}

// selectLocal: this node's ready endpoints; if there are none, this node's serving and
// terminating ones. Topology never narrows it.
func selectLocal(sp *model.ServicePortView) Selection {
	s := Selection{Policy: PolicyLocal}
	decideAll(&s, sp.AllEndpoints,
		func(e *model.EndpointView) bool { return e.Local && e.Ready },
		func(e *model.EndpointView, primary int) (bool, Reason, string) {
			switch {
			case !e.Local:
				if e.NodeName == "" {
					return false, ReasonNotLocal, "no nodeName, so not on this node; Local policy uses only this node's endpoints"
				}
				return false, ReasonNotLocal, fmt.Sprintf("on node %s; Local policy uses only this node's endpoints", e.NodeName)
			case !s.Fallback && e.Ready:
				return true, ReasonReady, "ready, on this node"
			}
			return conditionDecision(e, s.Fallback, primary, " on this node")
		})
	return s
}

// decideAll fills s.Fallback and s.Decisions, one decision per endpoint of all in order.
// The list falls back to serving+terminating endpoints when none is primary (ready and
// allowed by the policy); decide runs after s.Fallback is set and is told the number of
// primary endpoints.
func decideAll(s *Selection, all []model.EndpointView, isPrimary func(*model.EndpointView) bool,
	decide func(e *model.EndpointView, primary int) (bool, Reason, string)) {
	primary := 0
	for i := range all {
		if isPrimary(&all[i]) {
			primary++
		}
	}
	s.Fallback = primary == 0
	for i := range all {
		e := &all[i]
		d := EndpointDecision{Endpoint: *e}
		d.Candidate, d.Reason, d.Detail = decide(e, primary)
		s.Decisions = append(s.Decisions, d)
	}
}

// conditionDecision decides an endpoint by its conditions alone: in a fallback list the
// serving+terminating ones are candidates; otherwise every not-ready endpoint is out.
// readyCount is the number of ready endpoints of the list, where says which ("" or
// " on this node").
func conditionDecision(e *model.EndpointView, fallback bool, readyCount int, where string) (bool, Reason, string) {
	switch {
	case e.Terminating && !e.Serving:
		return false, ReasonTerminatingNotServing, "terminating and no longer serving"
	case e.Terminating && fallback:
		return true, ReasonServingTerminating, "terminating but still serving; used because no endpoint" + where + " is ready"
	case e.Terminating:
		return false, ReasonTerminatingWhileReady, fmt.Sprintf("terminating (still serving); used only when no endpoint%s is ready, and %d %s", where, readyCount, isAre(readyCount))
	case e.Serving:
		return false, ReasonNotReady, "not ready (serving but not terminating: only terminating endpoints are a fallback)"
	}
	return false, ReasonNotReady, "not ready"
}

// topologyOf chooses the hint-based filtering as the model does (only ready endpoints
// count) and says why in words.
func topologyOf(all []model.EndpointView, node model.NodeView) (model.TopologyMode, string) {
	var ready int
	var nodeHints, zoneHints hintTally
	anyHints := false
	for i := range all {
		e := &all[i]
		if len(e.NodeHints) > 0 || len(e.ZoneHints) > 0 {
			anyHints = true
		}
		if !e.Ready {
			continue
		}
		ready++
		nodeHints.add(e, e.NodeHints, node.Name)
		zoneHints.add(e, e.ZoneHints, node.Zone)
	}
	switch {
	case ready == 0:
		if anyHints {
			return model.TopologyNone, "hints ignored: no endpoint is ready (topology narrows ready endpoints only)"
		}
		return model.TopologyNone, ""
	case nodeHints.with == ready && nodeHints.forThis > 0:
		return model.TopologyPreferSameNode, fmt.Sprintf("PreferSameNode: every ready endpoint has node hints and %d %s for this node %s", nodeHints.forThis, isAre(nodeHints.forThis), node.Name)
	case zoneHints.with == ready && zoneHints.forThis > 0:
		return model.TopologyPreferSameZone, fmt.Sprintf("PreferSameZone: every ready endpoint has zone hints and %d %s for this node's zone %s", zoneHints.forThis, isAre(zoneHints.forThis), node.Zone)
	case !anyHints:
		return model.TopologyNone, ""
	}
	var why []string
	if w := nodeHints.ignored(ready, "node", node.Name, "this node's name is unknown", "this node"); w != "" {
		why = append(why, w)
	}
	if w := zoneHints.ignored(ready, "zone", node.Zone, "this node has no topology.kubernetes.io/zone label", "this node's zone"); w != "" {
		why = append(why, w)
	}
	if len(why) == 0 {
		why = append(why, "hints only on endpoints that are not ready")
	}
	return model.TopologyNone, strings.Join(why, "; ")
}

// hintTally counts the ready endpoints' hints of one kind (node or zone) against this
// node's value of that kind (its name or its zone).
type hintTally struct {
	// with counts the endpoints with hints of the kind, forThis those hinted for this
	// node's value.
	with, forThis int
	// firstWithout is the first endpoint without hints of the kind.
	firstWithout string
}

func (t *hintTally) add(e *model.EndpointView, hints []string, this string) {
	if len(hints) == 0 {
		if t.firstWithout == "" {
			t.firstWithout = addrPort(e)
		}
		return
	}
	t.with++
	if this != "" && slices.Contains(hints, this) {
		t.forThis++
	}
}

// ignored says why the hints of kind were not used, "" when no ready endpoint has any.
// unknown says that this node has no value of the kind; thisName names it.
func (t *hintTally) ignored(ready int, kind, this, unknown, thisName string) string {
	switch {
	case t.with == 0:
		return ""
	case t.with < ready:
		return kind + " hints ignored: ready endpoint " + t.firstWithout + " has none"
	case this == "":
		return kind + " hints ignored: " + unknown
	}
	return kind + " hints ignored: none is for " + thisName + " " + this
}

func allowedByTopology(e *model.EndpointView, mode model.TopologyMode, node model.NodeView) bool {
	switch mode {
	case model.TopologyPreferSameNode:
		return slices.Contains(e.NodeHints, node.Name)
	case model.TopologyPreferSameZone:
		return slices.Contains(e.ZoneHints, node.Zone)
	}
	return true
}

func addrPort(e *model.EndpointView) string {
	if strings.Contains(e.IP, ":") {
		return fmt.Sprintf("[%s]:%d", e.IP, e.Port)
	}
	return fmt.Sprintf("%s:%d", e.IP, e.Port)
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// listOr renders hints as "a", "a or b", "a, b or c".
func listOr(items []string) string {
	switch len(items) {
	case 0:
		return "(none)"
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}
