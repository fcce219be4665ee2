package watch

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cachedSlice is what the EndpointSlice informer keeps of a slice: the fields the model and
// the tracker read, in a third of the memory of a slimmed discoveryv1.EndpointSlice
// (BenchmarkSlimmedSliceHeap). At 10 000 Services the slices are the largest part of the
// process's heap, and Go's collector lets the heap grow to twice what is live, so every
// byte kept here counts twice in the process's RSS.
//
// The API object is built back (endpointSlice) where sluice reads a slice: handlers and
// Source calls, once per changed slice and sync. What it gives back differs from the
// slimmed object only in what no reader uses: metadata other than name, namespace,
// resourceVersion, the service-name and headless labels and the trigger-time annotation,
// and an endpoint's addresses after its first (the model, like upstream, uses only the
// first: the API says they are fungible).
//
// A cachedSlice is immutable once in the cache; the objects it builds share its ports and
// its shared strings, so their readers must not modify them (Source's contract).
type cachedSlice struct {
	namespace, name, resourceVersion string
	// serviceName, headless and triggerTime are the values of the kubernetes.io/service-name
	// label, the service.kubernetes.io/headless label and the
	// endpoints.kubernetes.io/last-change-trigger-time annotation; present says which exist.
	serviceName, headless, triggerTime string
	present                            presentBits
	addressType                        discoveryv1.AddressType
	ports                              []discoveryv1.EndpointPort
	endpoints                          []cachedEndpoint
}

type presentBits uint8

const (
	hasServiceName presentBits = 1 << iota
	hasHeadless
	hasTriggerTime
)

// cachedEndpoint is one endpoint: its first address, its conditions and its topology.
// nodeName and zone point to shared strings (sharedString).
type cachedEndpoint struct {
	address  string
	flags    endpointFlags
	nodeName *string
	zone     *string
	hints    *discoveryv1.EndpointHints
}

// endpointFlags holds whether the endpoint has an address and each condition as the API
// gave it: unset, true or false (unset has a meaning of its own for each condition).
type endpointFlags uint8

const (
	hasAddress endpointFlags = 1 << iota
	readySet
	readyTrue
	servingSet
	servingTrue
	terminatingSet
	terminatingTrue
)

// compactSlice converts a slice the API decoder built into its cached form. It keeps s's
// ports (sharing their names and protocols) and endpoint strings; s is not used after.
func compactSlice(s *discoveryv1.EndpointSlice) *cachedSlice {
	c := &cachedSlice{
		namespace:       sharedValue(s.Namespace),
		name:            s.Name,
		resourceVersion: s.ResourceVersion,
		addressType:     s.AddressType,
		ports:           exactLength(s.Ports),
	}
	if v, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
		c.serviceName, c.present = v, c.present|hasServiceName
	}
	if v, ok := s.Labels[LabelHeadless]; ok {
		c.headless, c.present = v, c.present|hasHeadless
	}
	if v, ok := s.Annotations[AnnotationTriggerTime]; ok {
		c.triggerTime, c.present = v, c.present|hasTriggerTime
	}
	for i := range c.ports {
		p := &c.ports[i]
		p.Name = sharedString(p.Name)
		p.Protocol = sharedProtocol(p.Protocol)
	}
	if len(s.Endpoints) > 0 {
		c.endpoints = make([]cachedEndpoint, len(s.Endpoints))
	}
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		ce := &c.endpoints[i]
		if len(ep.Addresses) > 0 {
			ce.address, ce.flags = ep.Addresses[0], hasAddress
		}
		ce.flags |= conditionFlags(ep.Conditions.Ready, readySet, readyTrue) |
			conditionFlags(ep.Conditions.Serving, servingSet, servingTrue) |
			conditionFlags(ep.Conditions.Terminating, terminatingSet, terminatingTrue)
		ce.nodeName = sharedString(ep.NodeName)
		ce.zone = sharedString(ep.Zone)
		ce.hints = ep.Hints
	}
	return c
}

func conditionFlags(b *bool, set, isTrue endpointFlags) endpointFlags {
	switch {
	case b == nil:
		return 0
	case *b:
		return set | isTrue
	}
	return set
}

func (f endpointFlags) condition(set, isTrue endpointFlags) *bool {
	if f&set == 0 {
		return nil
	}
	if f&isTrue != 0 {
		return &sharedTrue
	}
	return &sharedFalse
}

// endpointSlice builds the API object back: a fresh object whose endpoints' addresses
// and whose maps are its own, sharing c's ports and shared strings.
func (c *cachedSlice) endpointSlice() *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion},
		AddressType: c.addressType,
		Ports:       c.ports,
	}
	if c.present&(hasServiceName|hasHeadless) != 0 {
		s.Labels = make(map[string]string, 2)
		if c.present&hasServiceName != 0 {
			s.Labels[discoveryv1.LabelServiceName] = c.serviceName
		}
		if c.present&hasHeadless != 0 {
			s.Labels[LabelHeadless] = c.headless
		}
	}
	if c.present&hasTriggerTime != 0 {
		s.Annotations = map[string]string{AnnotationTriggerTime: c.triggerTime}
	}
	if len(c.endpoints) == 0 {
		return s
	}
	s.Endpoints = make([]discoveryv1.Endpoint, len(c.endpoints))
	// One array holds every endpoint's address.
	addresses := make([]string, len(c.endpoints))
	for i := range c.endpoints {
		ce := &c.endpoints[i]
		ep := &s.Endpoints[i]
		if ce.flags&hasAddress != 0 {
			addresses[i] = ce.address
			ep.Addresses = addresses[i : i+1 : i+1]
		}
		ep.Conditions = discoveryv1.EndpointConditions{
			Ready:       ce.flags.condition(readySet, readyTrue),
			Serving:     ce.flags.condition(servingSet, servingTrue),
			Terminating: ce.flags.condition(terminatingSet, terminatingTrue),
		}
		ep.NodeName, ep.Zone, ep.Hints = ce.nodeName, ce.zone, ce.hints
	}
	return s
}

// GetObjectMeta makes a cachedSlice an object to client-go's cache (meta.Accessor), which
// keys, indexes and compares resourceVersions through it. The metadata is built on each
// call; nothing the cache does through it is kept.
func (c *cachedSlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion}
}

// asEndpointSlice returns the API object of a cached slice, a tombstone of one, or an API
// object as is.
func asEndpointSlice(obj any) (*discoveryv1.EndpointSlice, bool) {
	return fromCache(obj, (*cachedSlice).endpointSlice)
}

// fromCache returns the API object (T) built from a cached form (C), from a tombstone of
// one, or obj itself when it is a T (or a tombstone of one).
func fromCache[C, T any](obj any, build func(C) T) (T, bool) {
	if c, ok := deletedObject[C](obj); ok {
		return build(c), true
	}
	return deletedObject[T](obj)
}
