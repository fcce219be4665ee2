package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// endpointScratch holds one ComputeService call's parsed EndpointSlices. It is pooled:
// parsing into fresh slices cost several allocations per Service, which at 10 000
// Services is most of a cold start and, through the garbage collector, of every sync.
type endpointScratch struct {
	chosen []*discoveryv1.EndpointSlice
	slices []parsedSlice
	// ports and endpoints back every parsedSlice's ranges.
	ports     []slicePort
	endpoints []Endpoint
}

// parsedSlice is one EndpointSlice of the right family: ranges of the scratch's ports and
// of its endpoints (valid ones only, Port unset).
type parsedSlice struct {
	portsFrom, portsTo int
	epsFrom, epsTo     int
}

// slicePort is one valid port of an EndpointSlice.
type slicePort struct {
	name     string
	protocol Protocol
	port     int32
}

// maxPooledEndpoints bounds the scratch kept in the pool, so that one huge Service does not
// pin its buffer for the life of the process.
const maxPooledEndpoints = 4096

var scratchPool = sync.Pool{New: func() any { return new(endpointScratch) }}

func getScratch() *endpointScratch { return scratchPool.Get().(*endpointScratch) }

// release clears the scratch (it must not keep API strings alive) and pools it.
func (sc *endpointScratch) release() {
	clear(sc.chosen)
	clear(sc.endpoints)
	clear(sc.ports)
	sc.chosen, sc.slices, sc.ports, sc.endpoints = sc.chosen[:0], sc.slices[:0], sc.ports[:0], sc.endpoints[:0]
	if cap(sc.endpoints) <= maxPooledEndpoints && cap(sc.chosen) <= maxPooledEndpoints {
		scratchPool.Put(sc)
	}
}

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

// parseSlices parses the EndpointSlices of service that hold family's addresses into sc.
// Slices are taken in name order so that the result never depends on the order the caller
// (an informer index, a list) happened to give them in.
func (sc *endpointScratch) parseSlices(service types.NamespacedName, all []*discoveryv1.EndpointSlice, family IPFamily, node NodeInfo, problems *problemList) {
	want := addressTypeOf(family)
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
		sc.chosen = append(sc.chosen, s)
	}
	if len(sc.chosen) > 1 {
		slices.SortStableFunc(sc.chosen, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	}
	for _, s := range sc.chosen {
		sc.parseSlice(s, family, node, problems)
	}
}

// sliceObject names a slice in a Problem.
func sliceObject(s *discoveryv1.EndpointSlice) string {
	return "EndpointSlice " + s.Namespace + "/" + s.Name
}

// parseSlice parses the ports and endpoints of one slice into sc; invalid ones are left out.
func (sc *endpointScratch) parseSlice(s *discoveryv1.EndpointSlice, family IPFamily, node NodeInfo, problems *problemList) {
	p := parsedSlice{portsFrom: len(sc.ports), epsFrom: len(sc.endpoints)}
	for i := range s.Ports {
		sp := &s.Ports[i]
		field := path{"ports", i}
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
			problems.add(sliceObject(s), field.at(".protocol"), "unknown protocol %s; port ignored", quote(proto))
			continue
		}
		if sp.Port == nil || !validPort(*sp.Port) {
			// A nil port would mean "all ports", which no proxy implements.
			port := "unset"
			if sp.Port != nil {
				port = fmt.Sprint(*sp.Port)
			}
			problems.add(sliceObject(s), field.at(".port"), "%s is not a valid port; port ignored", port)
			continue
		}
		if slices.ContainsFunc(sc.ports[p.portsFrom:], func(o slicePort) bool { return o.name == name && o.protocol == protocol }) {
			problems.add(sliceObject(s), field.at(".name"), "another port is named %s for %s; port ignored", quote(name), protocol)
			continue
		}
		sc.ports = append(sc.ports, slicePort{name: name, protocol: protocol, port: *sp.Port})
	}
	p.portsTo = len(sc.ports)
	if p.portsTo == p.portsFrom {
		return // no usable port: the endpoints cannot be used either
	}

	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		if len(ep.Addresses) == 0 {
			problems.add(sliceObject(s), path{"endpoints", i}.at(".addresses"), "endpoint has no address; ignored")
			continue
		}
		// Like upstream, only the first address is used: the API says they are fungible.
		addr, err := parseIP(ep.Addresses[0])
		if err != nil {
			problems.add(sliceObject(s), path{"endpoints", i}.at(".addresses[0]"), "%v; endpoint ignored", err)
			continue
		}
		if FamilyOf(addr) != family {
			problems.add(sliceObject(s), path{"endpoints", i}.at(".addresses[0]"), "%s is not an %s address; endpoint ignored", addr, family)
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
			zones := hintNames(h.ForZones, func(z discoveryv1.ForZone) string { return z.Name })
			nodes := hintNames(h.ForNodes, func(n discoveryv1.ForNode) string { return n.Name })
			if len(zones)+len(nodes) > 0 {
				e.Hints = &EndpointHints{Zones: zones, Nodes: nodes}
			}
		}
		sc.endpoints = append(sc.endpoints, e)
	}
	p.epsTo = len(sc.endpoints)
	if p.epsTo > p.epsFrom {
		sc.slices = append(sc.slices, p)
	}
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
// resolved named target ports into numbers), sorted by ip:port, one per ip:port. The result
// is freshly allocated, sized exactly, and shares nothing with the scratch.
func (sc *endpointScratch) forPort(name string, protocol Protocol) []Endpoint {
	n := 0
	for _, ps := range sc.slices {
		if _, ok := sc.portOf(ps, name, protocol); ok {
			n += ps.epsTo - ps.epsFrom
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]Endpoint, 0, n)
	for _, ps := range sc.slices {
		port, ok := sc.portOf(ps, name, protocol)
		if !ok {
			continue
		}
		for _, e := range sc.endpoints[ps.epsFrom:ps.epsTo] {
			e.Port = port
			out = append(out, e)
		}
	}
	// Clipped, so that an append by a reader reallocates instead of writing into the
	// array ClusterEndpoints may share.
	return slices.Clip(dedupeEndpoints(out))
}

// portOf returns the number of the slice port named name over protocol.
func (sc *endpointScratch) portOf(ps parsedSlice, name string, protocol Protocol) (int32, bool) {
	for _, sp := range sc.ports[ps.portsFrom:ps.portsTo] {
		if sp.name == name && sp.protocol == protocol {
			return sp.port, true
		}
	}
	return 0, false
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
