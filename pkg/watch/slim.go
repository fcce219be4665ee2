package watch

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// slim drops what sluice never reads before an object enters an informer cache: the cache
// is the only copy sluice keeps, so at 10 000 Services this is most of the process's
// memory. managedFields and ownerReferences go from every object (upstream drops
// managedFields too); annotations go except the ones sluice reads (a kubectl
// last-applied-configuration alone can be larger than the rest of the object); an
// EndpointSlice is cached as a cachedSlice, which keeps only the labels that name its
// Service, its trigger time, and of each endpoint only what endpoint selection reads (its
// targetRef, a full object reference per endpoint, was the largest part of a slice); a
// Service keeps only its name, namespace, resourceVersion, the label and annotations the
// model reads, and loses its selector and status conditions, and is cached as a
// cachedService; Node status keeps only what the proxy uses. Lists are cut
// to their length: the API decoder appends an element at a time, so a slice of 10
// endpoints arrives with room for 16.
//
// The informer hands slim the object it just decoded, so changing it in place is safe.
// A cachedSlice comes back unchanged (a store may apply the transform again).
func slim(obj any) (any, error) {
	switch obj.(type) {
	case *cachedSlice, *cachedService:
		return obj, nil // already slimmed
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
	}
	switch o := obj.(type) {
	case *v1.Service:
		o.ObjectMeta = metav1.ObjectMeta{
			Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion,
			Annotations: keepKeys(o.Annotations, AnnotationScheduler, AnnotationTrafficCounters),
			Labels:      keepKeys(o.Labels, LabelServiceProxyName),
		}
		o.Spec.Selector = nil
		o.Spec.Ports = exactLength(o.Spec.Ports)
		o.Status.Conditions = nil
		return compactService(o), nil
	case *discoveryv1.EndpointSlice:
		return compactSlice(o), nil
	case *v1.Node:
		o.Annotations = nil
		o.Status.Images = nil
		o.Status.VolumesInUse = nil
		o.Status.VolumesAttached = nil
		o.Status.Conditions = nil
		o.Status.NodeInfo = v1.NodeSystemInfo{}
		o.Status.Capacity = nil
		o.Status.Allocatable = nil
	case *networkingv1.ServiceCIDR:
		o.Annotations = nil
	}
	return obj, nil
}

// exactLength returns s in an array of its length when the decoder left spare room
// (slices.Clip only hides the room; the array keeps it).
func exactLength[T any](s []T) []T {
	if cap(s) == len(s) {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}

// keepKeys returns labels or annotations reduced to the keys in keep (nil when none is there).
func keepKeys(in map[string]string, keep ...string) map[string]string {
	var out map[string]string
	for _, k := range keep {
		if v, ok := in[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keep))
			}
			out[k] = v
		}
	}
	return out
}

// Shared values for the pointers of cached objects. Nothing writes through a cached
// object's pointers (informer caches are read-only), so objects may share them.
var (
	sharedTrue, sharedFalse = true, false
	sharedProtocols         = map[v1.Protocol]*v1.Protocol{}
	// strings interns node names, zones and port names. It is reset when it grows past
	// maxSharedStrings (names of nodes long gone), which only costs sharing.
	stringsMu        sync.Mutex
	strings_         = map[string]*string{}
	maxSharedStrings = 1 << 16
)

func init() {
	for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		sharedProtocols[p] = &p
	}
}

func sharedProtocol(p *v1.Protocol) *v1.Protocol {
	if p == nil {
		return nil
	}
	if s, ok := sharedProtocols[*p]; ok {
		return s
	}
	return p
}

// sharedValue returns a string equal to s, shared with every other caller's.
func sharedValue(s string) string { return *sharedString(&s) }

func sharedString(s *string) *string {
	if s == nil {
		return nil
	}
	stringsMu.Lock()
	defer stringsMu.Unlock()
	if p, ok := strings_[*s]; ok {
		return p
	}
	if len(strings_) >= maxSharedStrings {
		clear(strings_)
	}
	strings_[*s] = s
	return s
}
