package watch

import (
	"reflect"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cachedService is what the Service informer keeps of a Service. Most Services of a large
// cluster differ only in their name, resourceVersion, cluster IPs and ports: their type,
// policies, affinity and IP families are one of a few combinations, which Services share
// (sharedSpec). Such a Service is kept in a third of a slimmed v1.Service's memory
// (BenchmarkSlimmedServiceHeap). A Service with anything more (labels or annotations
// sluice reads, external or load-balancer addresses, an affinity timeout, a ClusterIP
// without ClusterIPs...) is kept whole, slimmed, in full.
//
// The API object is built back (service) where sluice reads a Service: handlers and
// Source calls. compactService checks that the object built back equals the slimmed one
// before it keeps the compact form, so what readers get never depends on which form a
// Service is kept in. Like cachedSlice, a cachedService is immutable once cached, and the
// objects it builds share its ports and the shared spec: readers must not modify them.
type cachedService struct {
	namespace, name, resourceVersion string
	clusterIPs                       []string
	ports                            []v1.ServicePort
	// spec is the shared spec of Services of this shape, without ClusterIP(s) and ports.
	spec *v1.ServiceSpec
	// full is the slimmed Service when the compact form cannot hold it (the fields above
	// are then unused but name and namespace).
	full *v1.Service
}

// compactService converts a slimmed Service into its cached form. It keeps s's ports and
// cluster IPs; s is not used after.
func compactService(s *v1.Service) *cachedService {
	c := &cachedService{
		namespace:       sharedValue(s.Namespace),
		name:            s.Name,
		resourceVersion: s.ResourceVersion,
		clusterIPs:      exactLength(s.Spec.ClusterIPs),
		ports:           exactLength(s.Spec.Ports),
		spec:            sharedSpec(&s.Spec),
	}
	for i := range c.ports {
		p := &c.ports[i]
		p.Name = sharedValue(p.Name)
		p.Protocol = v1.Protocol(sharedValue(string(p.Protocol)))
		p.AppProtocol = sharedString(p.AppProtocol)
	}
	s.Spec.ClusterIPs, s.Spec.Ports = c.clusterIPs, c.ports
	if !reflect.DeepEqual(c.service(), s) {
		return &cachedService{namespace: c.namespace, name: s.Name, full: s}
	}
	return c
}

// service builds the API object back: a fresh object sharing c's ports, cluster IPs and
// shared spec (or the slimmed Service itself when it was kept in full).
func (c *cachedService) service() *v1.Service {
	if c.full != nil {
		return c.full
	}
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion},
		Spec:       *c.spec,
	}
	s.Spec.ClusterIPs, s.Spec.Ports = c.clusterIPs, c.ports
	if len(c.clusterIPs) > 0 {
		s.Spec.ClusterIP = c.clusterIPs[0]
	}
	return s
}

// GetObjectMeta makes a cachedService an object to client-go's cache (meta.Accessor),
// like cachedSlice's.
func (c *cachedService) GetObjectMeta() metav1.Object {
	if c.full != nil {
		return &c.full.ObjectMeta
	}
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion}
}

// asService returns the API object of a cached Service, a tombstone of one, or an API
// object as is.
func asService(obj any) (*v1.Service, bool) { return fromCache(obj, (*cachedService).service) }

// Shared specs: one per combination of the fields a shape holds, reset like the shared
// strings when it grows past maxSharedSpecs (which only costs sharing).
var (
	specsMu        sync.Mutex
	specs          = map[string]*v1.ServiceSpec{}
	maxSharedSpecs = 1 << 10
)

// sharedSpec returns the shared spec holding spec's type, traffic policies, affinity and IP
// families (and nothing else).
func sharedSpec(spec *v1.ServiceSpec) *v1.ServiceSpec {
	var key strings.Builder
	field := func(s string) { key.WriteString(s); key.WriteByte(0) }
	optional := func(s *string) {
		if s == nil {
			key.WriteByte(1)
		} else {
			field(*s)
		}
	}
	field(string(spec.Type))
	field(string(spec.SessionAffinity))
	field(string(spec.ExternalTrafficPolicy))
	optional((*string)(spec.InternalTrafficPolicy))
	optional((*string)(spec.IPFamilyPolicy))
	if spec.IPFamilies == nil {
		key.WriteByte(1)
	}
	for _, f := range spec.IPFamilies {
		field(string(f))
	}
	specsMu.Lock()
	defer specsMu.Unlock()
	if s, ok := specs[key.String()]; ok {
		return s
	}
	if len(specs) >= maxSharedSpecs {
		clear(specs)
	}
	s := &v1.ServiceSpec{
		Type:                  spec.Type,
		SessionAffinity:       spec.SessionAffinity,
		ExternalTrafficPolicy: spec.ExternalTrafficPolicy,
		InternalTrafficPolicy: spec.InternalTrafficPolicy,
		IPFamilyPolicy:        spec.IPFamilyPolicy,
		IPFamilies:            exactLength(spec.IPFamilies),
	}
	specs[key.String()] = s
	return s
}
