package explain

import (
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ServiceExplanation says how this node treats every port of one Service in one family:
// which endpoints each policy in use chose, why the others were left out, and what each
// kind of client gets.
type ServiceExplanation struct {
	Node      string            `json:"node"`
	Family    string            `json:"family"`
	Mode      string            `json:"mode"`
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Ports     []PortExplanation `json:"ports"`
	// Problems is the bad input the model found in the Service's objects.
	Problems []model.ProblemView `json:"problems,omitempty"`
}

// PortExplanation is one port of the Service.
type PortExplanation struct {
	Port model.ServicePortView `json:"port"`
	// Selections are the endpoint lists the port uses (Cluster, Local or both).
	Selections []Selection `json:"selections"`
	// Traffic lists what each kind of client gets (loadBalancerSourceRanges aside: see
	// Explain for one source).
	Traffic []TrafficCase `json:"traffic"`
}

// TrafficCase is the fate of one kind of traffic to the port.
type TrafficCase struct {
	// From describes the client and the address it uses, e.g. "outside the cluster, via
	// NodePort or LoadBalancer IP".
	From       string   `json:"from"`
	Via        Via      `json:"via"`
	Source     string   `json:"source"`
	Policy     Policy   `json:"policy"`
	Candidates []string `json:"candidates"`
	Verdict    Verdict  `json:"verdict"`
}

// ExplainService explains every port of namespace/name in state; ok is false when the
// Service has no port in this family.
func ExplainService(state *model.StateView, cfg Config, namespace, name string) (ServiceExplanation, bool) {
	se := ServiceExplanation{Node: state.Node.Name, Family: state.Family, Mode: string(modeOf(cfg)), Namespace: namespace, Name: name}
	for _, p := range state.Problems {
		if p.Namespace == namespace && p.Name == name {
			se.Problems = append(se.Problems, p)
		}
	}
	for i := range state.Services {
		sp := &state.Services[i]
		if sp.Namespace != namespace || sp.Name != name {
			continue
		}
		pe := PortExplanation{Port: *sp}
		if sp.ClusterEndpoints != nil {
			pe.Selections = append(pe.Selections, Select(sp, state.Node, PolicyCluster))
		}
		if sp.LocalEndpoints != nil {
			pe.Selections = append(pe.Selections, Select(sp, state.Node, PolicyLocal))
		}
		add := func(from string, via Via, kind SourceKind) {
			r := route(state, sp, cfg, via, kind)
			source := string(kind)
			if kind == "" {
				source = "any"
			}
			pe.Traffic = append(pe.Traffic, TrafficCase{From: from, Via: via, Source: source,
				Policy: r.Policy.Applied, Candidates: r.Candidates, Verdict: r.Verdict})
		}
		add("any client, via the ClusterIP", ViaClusterIP, "")
		if externallyAccessible(sp) {
			via := externalVia(sp)
			add("outside the cluster, via "+externalAddresses(sp), via, SourceExternal)
			if sp.ExternalTrafficPolicy == "Local" {
				add("a pod, via "+externalAddresses(sp), via, SourcePod)
				add("this node itself, via "+externalAddresses(sp), via, SourceNode)
			}
		}
		se.Ports = append(se.Ports, pe)
	}
	return se, len(se.Ports) > 0
}

func externallyAccessible(sp *model.ServicePortView) bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerVIPs) > 0
}

// externalVia is the first external kind of address the port has (the policy is the same
// for all of them).
func externalVia(sp *model.ServicePortView) Via {
	switch {
	case len(sp.LoadBalancerVIPs) > 0:
		return ViaLoadBalancerIP
	case len(sp.ExternalIPs) > 0:
		return ViaExternalIP
	}
	return ViaNodePort
}

// externalAddresses names the port's external addresses, e.g. "NodePort or LoadBalancer IP".
func externalAddresses(sp *model.ServicePortView) string {
	var kinds []string
	if sp.NodePort != 0 {
		kinds = append(kinds, "NodePort")
	}
	if len(sp.ExternalIPs) > 0 {
		kinds = append(kinds, "externalIP")
	}
	if len(sp.LoadBalancerVIPs) > 0 {
		kinds = append(kinds, "LoadBalancer IP")
	}
	return listOr(kinds)
}
