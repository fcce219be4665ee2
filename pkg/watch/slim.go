package watch

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// slim drops what sluice never reads before an object enters an informer cache: the cache
// is the only copy sluice keeps, so at 10 000 Services this is most of the process's
// memory. managedFields and ownerReferences go from every object (upstream drops
// managedFields too); annotations go except the ones sluice reads (a kubectl
// last-applied-configuration alone can be larger than the rest of the object); an
// EndpointSlice keeps only the labels that name its Service, and of each endpoint only what
// endpoint selection reads (its targetRef, a full object reference per endpoint, is the
// largest part of a slice); a Service loses its selector and status conditions; Node status
// keeps only what the proxy uses.
//
// The informer hands slim the object it just decoded, so changing it in place is safe.
func slim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
	}
	switch o := obj.(type) {
	case *v1.Service:
		o.Annotations = keepAnnotations(o.Annotations, AnnotationScheduler)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discoveryv1.EndpointSlice:
		o.Annotations = keepAnnotations(o.Annotations, AnnotationTriggerTime)
		o.Labels = keepLabels(o.Labels, discoveryv1.LabelServiceName, v1.IsHeadlessService)
		for i := range o.Endpoints {
			ep := &o.Endpoints[i]
			ep.TargetRef = nil
			ep.Hostname = nil
			ep.DeprecatedTopology = nil
		}
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

// keepLabels returns in reduced to the keys in keep (nil when none is there).
func keepLabels(in map[string]string, keep ...string) map[string]string {
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

func keepAnnotations(in map[string]string, keep string) map[string]string {
	v, ok := in[keep]
	if !ok {
		return nil
	}
	return map[string]string{keep: v}
}
