package watch

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// TestCachedServiceGivesBackTheSlimmedService: every Service comes back from the cache as
// the slimmed object (metadata cut to name, namespace, resourceVersion and what sluice
// reads), whichever form it is kept in; Services as the API server returns most of them
// are kept compact, sharing their spec's shape, and the others whole.
func TestCachedServiceGivesBackTheSlimmedService(t *testing.T) {
	decoded := func(mutate func(*v1.Service)) *v1.Service {
		s := decodedService(1)
		s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	// want is what slim keeps of decoded(mutate).
	want := func(mutate func(*v1.Service)) *v1.Service {
		s := decoded(mutate)
		s.ObjectMeta = metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion,
			Labels: keepKeys(s.Labels, LabelServiceProxyName), Annotations: keepKeys(s.Annotations, AnnotationScheduler, AnnotationTrafficCounters)}
		s.Spec.Selector = nil
		s.Spec.Ports = exactLength(s.Spec.Ports)
		s.Status.Conditions = nil
		return s
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*v1.Service)
		compact bool
	}{
		{"ClusterIP", nil, true},
		{"dual-stack ClusterIP", func(s *v1.Service) {
			s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, "fd00:96::1")
			s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
		}, true},
		{"NodePort, ETP Local", func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.Ports[1].AppProtocol = ptr.To("http")
		}, true},
		{"without a cluster IP yet", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }, true},
		{"scheduler annotation", func(s *v1.Service) { s.Annotations[AnnotationScheduler] = "sh" }, false},
		{"traffic-counters annotation", func(s *v1.Service) { s.Annotations[AnnotationTrafficCounters] = "true" }, false},
		{"service-proxy-name label", func(s *v1.Service) { s.Labels[LabelServiceProxyName] = "other" }, false},
		{"ClusterIP without ClusterIPs", func(s *v1.Service) { s.Spec.ClusterIPs = nil }, false},
		{"external IPs", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.1"} }, false},
		{"health check node port", func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }, false},
		{"affinity timeout", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}, false},
		{"load-balancer status", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.1"}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := slim(decoded(tc.mutate))
			if err != nil {
				t.Fatal(err)
			}
			c := out.(*cachedService)
			if compact := c.full == nil; compact != tc.compact {
				t.Errorf("kept compact: %v, want %v", compact, tc.compact)
			}
			got := c.service()
			if w := want(tc.mutate); !reflect.DeepEqual(got, w) {
				t.Errorf("cached Service gives\n%+v\nwant\n%+v", got, w)
			}
			if again, _ := slim(out); again != out {
				t.Errorf("slim of a cachedService changed it")
			}
			if tc.compact {
				other, _ := slim(decoded(tc.mutate))
				if other.(*cachedService).spec != c.spec {
					t.Errorf("two Services of one shape do not share their spec")
				}
				if a, b := c.service(), c.service(); a == b {
					t.Errorf("a compact Service gives the same object twice")
				}
			}
		})
	}
}

// TestCachedServiceIsAnObjectToTheCache: client-go's cache keys a cachedService, and reads
// its resourceVersion, through meta.Accessor; tombstones of one unwrap to the API object.
func TestCachedServiceIsAnObjectToTheCache(t *testing.T) {
	plain := testService("ns", "a")
	plain.ResourceVersion = "7"
	annotated := testService("ns", "a")
	annotated.ResourceVersion, annotated.Annotations = "7", map[string]string{AnnotationScheduler: "sh"}
	for _, in := range []*v1.Service{plain, annotated} {
		out, _ := slim(in.DeepCopy())
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(out); err != nil || key != "ns/a" {
			t.Errorf("key %q, %v; want ns/a", key, err)
		}
		if m, err := meta.Accessor(out); err != nil || m.GetResourceVersion() != "7" {
			t.Errorf("accessor %v, %v", m, err)
		}
		for _, obj := range []any{out, cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: out}, in} {
			if s, ok := asService(obj); !ok || s.Namespace != "ns" || s.Name != "a" || s.Spec.ClusterIP != "10.96.0.10" {
				t.Errorf("asService(%T) = %+v, %v", obj, s, ok)
			}
		}
	}
	if s, ok := asService(cache.DeletedFinalStateUnknown{Key: "ns/a-1", Obj: testSlice("ns", "a-1", "a")}); ok {
		t.Errorf("an EndpointSlice's tombstone gave %+v", s)
	}
}
