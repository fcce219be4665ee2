package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// parsedSlice is one EndpointSlice of the right family, parsed once for all Service ports.
type parsedSlice struct {
	ports []slicePort
	// endpoints are the slice's valid endpoints with Port unset.
	endpoints []Endpoint
}

// slicePort is one valid port of an EndpointSlice.
type slicePort struct {
	name     string
	protocol Protocol
	port     int32
}

// serviceEndpoints holds the parsed EndpointSlices of one Service, in slice-name order.
type serviceEndpoints []parsedSlice

// addressTypeOf returns the EndpointSlice address type holding family's addresses.
func addressTypeOf(family IPFamily) discoveryv1.AddressType {
	if family == IPv6 {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// ServiceNameOf returns the Service an EndpointSlice belongs to (its namespace and its
// kubernetes.io/service-name label), false when the label is missing or empty.
func ServiceNameOf(slice *discoveryv1.EndpointSlice) (types.NamespacedName, bool) {
	name := slice.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: slice.Namespace, Name: name}, true
}

// parseSlices parses the EndpointSlices of service that hold family's addresses. Slices
// are taken in name order so that the result never depends on the order the caller (an
// informer index, a list) happened to give them in.
func parseSlices(service types.NamespacedName, all []*discoveryv1.EndpointSlice, family IPFamily, node NodeInfo, problems *problemList) serviceEndpoints {
	want := addressTypeOf(family)
	var chosen []*discoveryv1.EndpointSlice
	for _, s := range all {
		if s == nil || s.AddressType != want {
			continue // other families, FQDN
		}
		if name, ok := ServiceNameOf(s); !ok || name != service {
			continue // not this Service's: the caller's index is stale or wrong
		}
		if _, headless := s.Labels[v1.IsHeadlessService]; headless {
			continue // upstream's informer never sees these
		}
		chosen = append(chosen, s)
	}
	if len(chosen) == 0 {
		return nil
	}
	if len(chosen) > 1 {
		slices.SortStableFunc(chosen, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	}
	out := make(serviceEndpoints, 0, len(chosen))
	for _, s := range chosen {
		p := parseSlice(s, family, node, problems)
		if len(p.ports) > 0 && len(p.endpoints) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// parseSlice parses the ports and endpoints of one slice; invalid ones are left out.
func parseSlice(s *discoveryv1.EndpointSlice, family IPFamily, node NodeInfo, problems *problemList) parsedSlice {
	object := "EndpointSlice " + s.Namespace + "/" + s.Name
	var p parsedSlice
	for i := range s.Ports {
		sp := &s.Ports[i]
		field := fmt.Sprintf("ports[%d]", i)
		var name string
		if sp.Name != nil {
			name = *sp.Name // nil is the API default, ""
		}
		proto := ""
		if sp.Protocol != nil {
			proto = string(*sp.Protocol)
		}
		protocol, ok := parseProtocol(proto)
		if !ok {
			problems.add(object, field+".protocol", "unknown protocol %s; port ignored", quote(proto))
			continue
		}
		if sp.Port == nil || !validPort(*sp.Port) {
			// A nil port would mean "all ports", which no proxy implements.
			port := "unset"
			if sp.Port != nil {
				port = fmt.Sprint(*sp.Port)
			}
			problems.add(object, field+".port", "%s is not a valid port; port ignored", port)
			continue
		}
		if slices.ContainsFunc(p.ports, func(o slicePort) bool { return o.name == name && o.protocol == protocol }) {
			problems.add(object, field+".name", "another port is named %s for %s; port ignored", quote(name), protocol)
			continue
		}
		p.ports = append(p.ports, slicePort{name: name, protocol: protocol, port: *sp.Port})
	}
	if len(p.ports) == 0 {
		return p
	}

	p.endpoints = make([]Endpoint, 0, len(s.Endpoints))
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		if len(ep.Addresses) == 0 {
			problems.add(object, fmt.Sprintf("endpoints[%d].addresses", i), "endpoint has no address; ignored")
			continue
		}
		// Like upstream, only the first address is used: the API says they are fungible.
		addr, err := parseIP(ep.Addresses[0])
		if err != nil {
			problems.add(object, fmt.Sprintf("endpoints[%d].addresses[0]", i), "%v; endpoint ignored", err)
			continue
		}
		if FamilyOf(addr) != family {
			problems.add(object, fmt.Sprintf("endpoints[%d].addresses[0]", i), "%s is not an %s address; endpoint ignored", addr, family)
			continue
		}
		e := Endpoint{
			IP:          addr,
			Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
			Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
			Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
		}
		if ep.NodeName != nil {
			e.NodeName = *ep.NodeName
			e.IsLocal = node.Name != "" && e.NodeName == node.Name
		}
		if ep.Zone != nil {
			e.Zone = *ep.Zone
		}
		if h := ep.Hints; h != nil {
			e.ZoneHints = hintNames(h.ForZones, func(z discoveryv1.ForZone) string { return z.Name })
			e.NodeHints = hintNames(h.ForNodes, func(n discoveryv1.ForNode) string { return n.Name })
		}
		p.endpoints = append(p.endpoints, e)
	}
	return p
}

// hintNames returns the names of hints, nil when there are none.
func hintNames[H any](hints []H, name func(H) string) []string {
	if len(hints) == 0 {
		return nil
	}
	out := make([]string, len(hints))
	for i, h := range hints {
		out[i] = name(h)
	}
	return out
}

// forPort returns the endpoints of the Service port named name over protocol: the endpoints
// of every slice port with that name and protocol (the EndpointSlice controller has already
// resolved named target ports into numbers), sorted by ip:port, one per ip:port.
func (se serviceEndpoints) forPort(name string, protocol Protocol) []Endpoint {
	type candidate struct {
		slice, port int
	}
	n := 0
	var matches [8]candidate
	found := matches[:0]
	for si := range se {
		for pi, sp := range se[si].ports {
			if sp.name == name && sp.protocol == protocol {
				found = append(found, candidate{si, pi})
				n += len(se[si].endpoints)
				break // parseSlice dropped duplicate names
			}
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]Endpoint, 0, n)
	for _, c := range found {
		port := se[c.slice].ports[c.port].port
		for _, e := range se[c.slice].endpoints {
			e.Port = port
			out = append(out, e)
		}
	}
	// Clipped, so that an append by a reader reallocates instead of writing into the
	// array ClusterEndpoints may share.
	return slices.Clip(dedupeEndpoints(out))
}

// dedupeEndpoints sorts endpoints by ip:port and keeps one per ip:port. The same address
// appears twice when an endpoint moves between slices (briefly in both) or when the pod
// network reuses a terminating pod's IP: a non-terminating copy wins, then a ready one,
// then a serving one, then the first in slice-name order (the sort is stable).
func dedupeEndpoints(eps []Endpoint) []Endpoint {
	slices.SortStableFunc(eps, func(a, b Endpoint) int {
		if c := compareEndpointAddr(&a, &b); c != 0 {
			return c
		}
		return cmp.Compare(endpointRank(&b), endpointRank(&a))
	})
	return slices.CompactFunc(eps, func(a, b Endpoint) bool { return compareEndpointAddr(&a, &b) == 0 })
}

// compareEndpointAddr orders endpoints by address, then port (numerically).
func compareEndpointAddr(a, b *Endpoint) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	return cmp.Compare(a.Port, b.Port)
}

// endpointRank orders duplicate copies of one ip:port; the highest wins.
func endpointRank(e *Endpoint) int {
	r := 0
	if !e.Terminating {
		r += 4
	}
	if e.Ready {
		r += 2
	}
	if e.Serving {
		r++
	}
	return r
}
