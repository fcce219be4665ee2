// Package modeltest has test helpers for code that feeds the model: an in-memory
// model.Source that tests fill directly, where the daemon reads its informers' caches.
package modeltest

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Source is a model.Source over maps, safe for concurrent use.
type Source struct {
	mu       sync.Mutex
	services map[types.NamespacedName]*v1.Service
	slices   map[types.NamespacedName][]*discoveryv1.EndpointSlice
}

var _ model.Source = (*Source)(nil)

// NewSource returns an empty Source.
func NewSource() *Source {
	return &Source{services: map[types.NamespacedName]*v1.Service{}, slices: map[types.NamespacedName][]*discoveryv1.EndpointSlice{}}
}

// Put stores svc with slices as all of its EndpointSlices, replacing what was stored.
func (s *Source) Put(svc *v1.Service, slices ...*discoveryv1.EndpointSlice) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services[name] = svc
	s.slices[name] = slices
}

// Service implements model.Source.
func (s *Source) Service(name types.NamespacedName) (*v1.Service, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc, ok := s.services[name]
	return svc, ok
}

// EndpointSlices implements model.Source.
func (s *Source) EndpointSlices(name types.NamespacedName) []*discoveryv1.EndpointSlice {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slices[name]
}
