package watch

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// TestCachedSliceGivesBackWhatSluiceReads: a slice through the cache's compact form comes
// back with exactly what the model and the tracker read (metadata naming it, the
// service-name and headless labels, the trigger time, the address type, ports, and of each
// endpoint its first address, every condition as given, node, zone and hints), and
// without the rest.
func TestCachedSliceGivesBackWhatSluiceReads(t *testing.T) {
	tri := []*bool{nil, ptr.To(true), ptr.To(false)}
	var allConditions, allConditionsWant []discoveryv1.Endpoint
	for _, r := range tri {
		for _, s := range tri {
			for _, term := range tri {
				c := discoveryv1.EndpointConditions{Ready: r, Serving: s, Terminating: term}
				allConditions = append(allConditions, discoveryv1.Endpoint{Addresses: []string{"10.244.0.1"}, Conditions: c})
				allConditionsWant = append(allConditionsWant, discoveryv1.Endpoint{Addresses: []string{"10.244.0.1"}, Conditions: c})
			}
		}
	}
	hints := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}}
	for _, tc := range []struct {
		name     string
		in, want *discoveryv1.EndpointSlice
	}{{
		name: "metadata: name, namespace, resourceVersion, the Service's labels and the trigger time",
		in: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: "ns", Name: "a-1", GenerateName: "a-", UID: "uid", ResourceVersion: "42", Generation: 3,
				Labels:          map[string]string{discoveryv1.LabelServiceName: "a", LabelHeadless: "", discoveryv1.LabelManagedBy: "x", "app": "a"},
				Annotations:     map[string]string{AnnotationTriggerTime: "2026-01-02T03:04:05Z", "other": "y"},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "a"}},
				ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "m"}},
			},
			AddressType: discoveryv1.AddressTypeIPv6,
		},
		want: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: "ns", Name: "a-1", ResourceVersion: "42",
				Labels:      map[string]string{discoveryv1.LabelServiceName: "a", LabelHeadless: ""},
				Annotations: map[string]string{AnnotationTriggerTime: "2026-01-02T03:04:05Z"},
			},
			AddressType: discoveryv1.AddressTypeIPv6,
		},
	}, {
		name: "an empty service-name label stays there; no labels or annotations give none",
		in: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", Labels: map[string]string{discoveryv1.LabelServiceName: ""}},
		},
		want: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", Labels: map[string]string{discoveryv1.LabelServiceName: ""}},
		},
	}, {
		name: "no labels at all",
		in:   &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", Labels: map[string]string{"app": "c"}}},
		want: &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}},
	}, {
		name: "every combination of conditions",
		in:   &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Endpoints: allConditions},
		want: &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Endpoints: allConditionsWant},
	}, {
		name: "addresses: none, empty, invalid, several (the first is kept); node, zone and hints kept; the rest dropped",
		in: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "e"},
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("h2c")},
				{}, // every field unset
			},
			Endpoints: []discoveryv1.Endpoint{
				{},
				{Addresses: []string{""}},
				{Addresses: []string{"not-an-ip"}},
				{Addresses: []string{"10.244.0.2", "10.244.0.3"}, NodeName: ptr.To("node-a"), Zone: ptr.To("z1"), Hints: hints,
					Hostname: ptr.To("pod"), TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "pod"},
					DeprecatedTopology: map[string]string{"k": "v"}},
			},
		},
		want: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "e"},
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080), AppProtocol: ptr.To("h2c")},
				{},
			},
			Endpoints: []discoveryv1.Endpoint{
				{},
				{Addresses: []string{""}},
				{Addresses: []string{"not-an-ip"}},
				{Addresses: []string{"10.244.0.2"}, NodeName: ptr.To("node-a"), Zone: ptr.To("z1"), Hints: hints},
			},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := slim(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			c, ok := out.(*cachedSlice)
			if !ok {
				t.Fatalf("slim gave %T, want *cachedSlice", out)
			}
			got := c.endpointSlice()
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
			// Built afresh each time: a reader's object is its own.
			if again := c.endpointSlice(); len(got.Endpoints) > 0 && &again.Endpoints[0] == &got.Endpoints[0] {
				t.Errorf("two reads share their endpoints")
			}
			if again, _ := slim(c); again != c {
				t.Errorf("slim of a cached slice changed it")
			}
		})
	}
}

// TestCachedSliceIsAnObjectToTheCache: client-go's cache keys a cachedSlice, and reads its
// resourceVersion, through meta.Accessor; tombstones of one unwrap to the API object.
func TestCachedSliceIsAnObjectToTheCache(t *testing.T) {
	out, _ := slim(testSlice("ns", "a-1", "a"))
	out.(*cachedSlice).resourceVersion = "7"
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(out); err != nil || key != "ns/a-1" {
		t.Errorf("key %q, %v; want ns/a-1", key, err)
	}
	if m, err := meta.Accessor(out); err != nil || m.GetResourceVersion() != "7" {
		t.Errorf("accessor %v, %v", m, err)
	}
	for _, obj := range []any{out, cache.DeletedFinalStateUnknown{Key: "ns/a-1", Obj: out}, testSlice("ns", "a-1", "a")} {
		if s, ok := asEndpointSlice(obj); !ok || s.Namespace != "ns" || s.Name != "a-1" || s.Labels[discoveryv1.LabelServiceName] != "a" {
			t.Errorf("asEndpointSlice(%T) = %+v, %v", obj, s, ok)
		}
	}
	if s, ok := asEndpointSlice(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: testService("ns", "a")}); ok {
		t.Errorf("a Service's tombstone gave %+v", s)
	}
}
