// Package modeltest has test helpers for code that feeds the model: an in-memory
// model.Source that tests fill directly, where the daemon reads its informers' caches.
//
// It does not import package model, so that the model's own tests can use it too (an
// import of model here would be a cycle for them); model's tests check that Source
// implements model.Source.
package modeltest

import (
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Source is a model.Source over maps, safe for concurrent use: Services by name and
// EndpointSlices indexed by their Service (the kubernetes.io/service-name label), like the
// informer indexers it stands in for. EndpointSlices comes back in no particular order, as
// from an informer.
type Source struct {
	mu        sync.RWMutex
	services  map[types.NamespacedName]*v1.Service
	slices    map[types.NamespacedName]*discoveryv1.EndpointSlice // by namespace/slice name
	byService map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice
}

// NewSource returns an empty Source.
func NewSource() *Source {
	return &Source{
		services:  map[types.NamespacedName]*v1.Service{},
		slices:    map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		byService: map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{},
	}
}

// Service implements model.Source.
func (s *Source) Service(name types.NamespacedName) (*v1.Service, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	svc, ok := s.services[name]
	return svc, ok
}

// EndpointSlices implements model.Source.
func (s *Source) EndpointSlices(name types.NamespacedName) []*discoveryv1.EndpointSlice {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*discoveryv1.EndpointSlice
	for _, sl := range s.byService[name] {
		out = append(out, sl)
	}
	return out
}

// Slice returns the EndpointSlice of that namespace and name (nil if there is none).
func (s *Source) Slice(key types.NamespacedName) *discoveryv1.EndpointSlice {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.slices[key]
}

// Put stores svc with slices as all of its EndpointSlices, replacing what was stored. The
// slices must carry svc's name in their kubernetes.io/service-name label.
func (s *Source) Put(svc *v1.Service, slices ...*discoveryv1.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setService(keyOf(svc), svc)
	for _, old := range s.byService[keyOf(svc)] {
		s.setSlice(keyOf(old), nil)
	}
	for _, sl := range slices {
		s.setSlice(keyOf(sl), sl)
	}
}

// PutService stores svc and returns the object it replaced (nil if new).
func (s *Source) PutService(svc *v1.Service) *v1.Service {
	return locked(s, func() *v1.Service { return s.setService(keyOf(svc), svc) })
}

// DeleteService removes a Service and returns it (nil if there was none).
func (s *Source) DeleteService(name types.NamespacedName) *v1.Service {
	return locked(s, func() *v1.Service { return s.setService(name, nil) })
}

// PutSlice stores sl and returns the object it replaced (nil if new).
func (s *Source) PutSlice(sl *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	return locked(s, func() *discoveryv1.EndpointSlice { return s.setSlice(keyOf(sl), sl) })
}

// DeleteSlice removes the EndpointSlice of that namespace and name and returns it (nil if
// there was none).
func (s *Source) DeleteSlice(key types.NamespacedName) *discoveryv1.EndpointSlice {
	return locked(s, func() *discoveryv1.EndpointSlice { return s.setSlice(key, nil) })
}

// locked runs f holding s's write lock.
func locked[T any](s *Source, f func() T) T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return f()
}

// keyOf is an object's namespace and name.
func keyOf(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

// All returns every Service and EndpointSlice, each list sorted by name.
func (s *Source) All() ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedByName(s.services), sortedByName(s.slices)
}

// sortedByName returns the objects of m sorted by name (nil if m is empty).
func sortedByName[T interface{ GetName() string }](m map[types.NamespacedName]T) []T {
	var out []T
	for _, o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// setService stores svc under name, or removes the entry when svc is nil, and returns what
// was there. The caller holds s.mu.
func (s *Source) setService(name types.NamespacedName, svc *v1.Service) *v1.Service {
	old := s.services[name]
	if svc == nil {
		delete(s.services, name)
	} else {
		s.services[name] = svc
	}
	return old
}

// setSlice stores sl under key, or removes the entry when sl is nil, keeps the index by
// Service up to date and returns what was there. The caller holds s.mu.
func (s *Source) setSlice(key types.NamespacedName, sl *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	old := s.slices[key]
	if name, ok := serviceOf(old); ok {
		delete(s.byService[name], old.Name)
		if len(s.byService[name]) == 0 {
			delete(s.byService, name)
		}
	}
	if sl == nil {
		delete(s.slices, key)
		return old
	}
	s.slices[key] = sl
	if name, ok := serviceOf(sl); ok {
		if s.byService[name] == nil {
			s.byService[name] = map[string]*discoveryv1.EndpointSlice{}
		}
		s.byService[name][sl.Name] = sl
	}
	return old
}

// serviceOf is model.ServiceNameOf (which this package cannot import): the Service a slice
// belongs to, false for nil or a slice without the label.
func serviceOf(sl *discoveryv1.EndpointSlice) (types.NamespacedName, bool) {
	if sl == nil || sl.Labels[discoveryv1.LabelServiceName] == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: sl.Namespace, Name: sl.Labels[discoveryv1.LabelServiceName]}, true
}
