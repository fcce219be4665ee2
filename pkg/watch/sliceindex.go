package watch

import (
	"slices"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// sliceIndex holds the cached EndpointSlices by the Service their
// kubernetes.io/service-name label names. client-go's indexer did this with a set of keys
// per Service, 316 bytes per Service of 10 000 (a map each); this is a list of the cached
// slices themselves, about 70. The slice handler keeps it, before it tells the sink.
type sliceIndex struct {
	mu        sync.RWMutex
	byService map[types.NamespacedName][]*cachedSlice
}

func (x *sliceIndex) init() { x.byService = map[types.NamespacedName][]*cachedSlice{} }

// update replaces the slice old (nil, a cachedSlice or a tombstone of one) by cur (nil or a
// cachedSlice). Slices without a Service name are not indexed.
func (x *sliceIndex) update(old, cur any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if o, ok := deletedObject[*cachedSlice](old); ok {
		x.remove(o)
	}
	if c, ok := cur.(*cachedSlice); ok {
		x.remove(c) // the update of a slice the index missed the removal of
		if c.serviceName != "" {
			name := types.NamespacedName{Namespace: c.namespace, Name: c.serviceName}
			x.byService[name] = append(x.byService[name], c)
		}
	}
}

// remove drops the slice of s's namespace and name from the list of s's Service. Holds mu.
func (x *sliceIndex) remove(s *cachedSlice) {
	if s.serviceName == "" {
		return
	}
	name := types.NamespacedName{Namespace: s.namespace, Name: s.serviceName}
	list := x.byService[name]
	i := slices.IndexFunc(list, func(c *cachedSlice) bool { return c.name == s.name })
	switch {
	case i < 0:
		return
	case len(list) == 1:
		delete(x.byService, name)
		return
	}
	// A new array: slicesOf's callers may still read the old one.
	x.byService[name] = slices.Delete(slices.Clone(list), i, i+1)
}

// slicesOf returns the API objects of the Service's slices, built afresh.
func (x *sliceIndex) slicesOf(name types.NamespacedName) []*discoveryv1.EndpointSlice {
	x.mu.RLock()
	list := x.byService[name]
	x.mu.RUnlock()
	out := make([]*discoveryv1.EndpointSlice, 0, len(list))
	for _, c := range list {
		out = append(out, c.endpointSlice())
	}
	return out
}
