package watch

// Conventions: node "node-a"; namespaces "ns" and "other"; Services 10.96.0.0/16, pods
// 10.244.0.0/16. The fake clientset honours label selectors but not field selectors, so the
// field selectors are checked as sent (the e2e tests check them against a real apiserver).

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const testNode = "node-a"

// recordingSink records what the handlers deliver.
type recordingSink struct {
	mu     sync.Mutex
	events []string
	// services and slices are the last object delivered per name.
	services map[string]*v1.Service
	slices   map[string]*discoveryv1.EndpointSlice
	cidrs    []netip.Prefix
	nodes    []*v1.Node
}

func newRecordingSink() *recordingSink {
	return &recordingSink{services: map[string]*v1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}
}

func (s *recordingSink) record(event string, svc *v1.Service, slice *discoveryv1.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if svc != nil {
		event += " " + svc.Namespace + "/" + svc.Name
		s.services[svc.Namespace+"/"+svc.Name] = svc
	}
	if slice != nil {
		event += " " + slice.Namespace + "/" + slice.Name
		s.slices[slice.Namespace+"/"+slice.Name] = slice
	}
	s.events = append(s.events, event)
}

func (s *recordingSink) OnServiceAdd(svc *v1.Service)       { s.record("service add", svc, nil) }
func (s *recordingSink) OnServiceUpdate(_, cur *v1.Service) { s.record("service update", cur, nil) }
func (s *recordingSink) OnServiceDelete(svc *v1.Service)    { s.record("service delete", svc, nil) }
func (s *recordingSink) OnEndpointSliceAdd(e *discoveryv1.EndpointSlice) {
	s.record("slice add", nil, e)
}
func (s *recordingSink) OnEndpointSliceUpdate(_, cur *discoveryv1.EndpointSlice) {
	s.record("slice update", nil, cur)
}
func (s *recordingSink) OnEndpointSliceDelete(e *discoveryv1.EndpointSlice) {
	s.record("slice delete", nil, e)
}
func (s *recordingSink) OnServiceCIDRsChange(cidrs []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cidrs = cidrs
	s.events = append(s.events, "cidrs")
}

func (s *recordingSink) onNode(n *v1.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes = append(s.nodes, n)
}

// has reports whether event was delivered.
func (s *recordingSink) has(event string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.events, event)
}

func (s *recordingSink) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testService(ns, name string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

func testSlice(ns, name, service string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	if service != "" {
		s.Labels[discoveryv1.LabelServiceName] = service
	}
	return s
}

// startWatcher runs a Watcher over client into sink until the test ends, and waits for
// its caches.
func startWatcher(t *testing.T, client *fake.Clientset, sink *recordingSink) *Watcher {
	t.Helper()
	w, err := New(client, testNode, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddHandlers(sink, sink.onNode); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		w.Shutdown()
	})
	w.Start(ctx)
	if !w.WaitForServicesAndEndpoints(ctx) || !w.WaitForNode(ctx) {
		t.Fatal("caches did not sync")
	}
	return w
}

func TestSlimKeepsOnlyWhatSluiceReads(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	big := strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		name  string
		in    runtime.Object
		check func(t *testing.T, out any)
	}{{
		name: "Service keeps the scheduler annotation and the service-proxy-name label, cut lists",
		in: &v1.Service{ObjectMeta: metav1.ObjectMeta{
			Name: "a", ManagedFields: managed,
			Labels:      map[string]string{LabelServiceProxyName: "x", "app": "a"},
			Annotations: map[string]string{AnnotationScheduler: "sh", "kubectl.kubernetes.io/last-applied-configuration": big, "other": "y"},
		}, Spec: v1.ServiceSpec{Ports: append(make([]v1.ServicePort, 0, 4), v1.ServicePort{Port: 80})}},
		check: func(t *testing.T, out any) {
			svc := out.(*cachedService).service()
			if want := map[string]string{AnnotationScheduler: "sh"}; !maps.Equal(svc.Annotations, want) {
				t.Errorf("annotations %v, want %v", svc.Annotations, want)
			}
			if want := map[string]string{LabelServiceProxyName: "x"}; !maps.Equal(svc.Labels, want) {
				t.Errorf("labels %v, want %v", svc.Labels, want)
			}
			if len(svc.Spec.Ports) != 1 || cap(svc.Spec.Ports) != 1 {
				t.Errorf("ports %v (capacity %d), want the one port in an array of one", svc.Spec.Ports, cap(svc.Spec.Ports))
			}
			if svc.ManagedFields != nil {
				t.Errorf("managedFields kept")
			}
		},
	}, {
		name: "Service without the scheduler annotation keeps none",
		in:   &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "b", Annotations: map[string]string{"other": big}}},
		check: func(t *testing.T, out any) {
			if a := out.(*cachedService).service().Annotations; a != nil {
				t.Errorf("annotations %v, want nil", a)
			}
		},
	}, {
		name: "EndpointSlice keeps the trigger time and its labels",
		in: &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
			Name: "s", ManagedFields: managed,
			Labels:      map[string]string{discoveryv1.LabelServiceName: "a"},
			Annotations: map[string]string{AnnotationTriggerTime: "2026-01-02T03:04:05Z", AnnotationScheduler: "sh", "other": big},
		}},
		check: func(t *testing.T, out any) {
			s := out.(*cachedSlice).endpointSlice()
			if want := map[string]string{AnnotationTriggerTime: "2026-01-02T03:04:05Z"}; !maps.Equal(s.Annotations, want) {
				t.Errorf("annotations %v, want %v", s.Annotations, want)
			}
			if s.Labels[discoveryv1.LabelServiceName] != "a" || s.ManagedFields != nil {
				t.Errorf("labels %v, managedFields %v", s.Labels, s.ManagedFields)
			}
		},
	}, {
		name: "EndpointSlice keeps of each endpoint what selection reads, and only its Service's labels",
		in: &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: "s2",
				Labels: map[string]string{discoveryv1.LabelServiceName: "a", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
					"app": "a", v1.IsHeadlessService: ""},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "a"}},
			},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:          []string{"10.244.1.5"},
				Conditions:         discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)},
				Hostname:           ptr.To("pod-a"),
				TargetRef:          &v1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "pod-a", UID: "1234"},
				DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-a"},
				NodeName:           ptr.To("node-a"),
				Zone:               ptr.To("z1"),
				Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
			}},
		},
		check: func(t *testing.T, out any) {
			s := out.(*cachedSlice).endpointSlice()
			want := map[string]string{discoveryv1.LabelServiceName: "a", v1.IsHeadlessService: ""}
			if !maps.Equal(s.Labels, want) || s.OwnerReferences != nil {
				t.Errorf("labels %v (want %v), ownerReferences %v", s.Labels, want, s.OwnerReferences)
			}
			ep := s.Endpoints[0]
			if ep.TargetRef != nil || ep.Hostname != nil || ep.DeprecatedTopology != nil {
				t.Errorf("endpoint not slimmed: %+v", ep)
			}
			if len(ep.Addresses) != 1 || *ep.Conditions.Ready || !*ep.Conditions.Terminating || *ep.NodeName != "node-a" ||
				*ep.Zone != "z1" || ep.Hints == nil || len(ep.Hints.ForZones) != 1 {
				t.Errorf("endpoint lost what selection reads: %+v", ep)
			}
		},
	}, {
		name: "Node keeps its addresses, taints, labels and pod CIDRs only",
		in: &v1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: testNode, ManagedFields: managed,
				Labels:      map[string]string{v1.LabelTopologyZone: "z1"},
				Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
			},
			Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, Taints: []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler"}}},
			Status: v1.NodeStatus{
				Addresses:   []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.1"}},
				Images:      []v1.ContainerImage{{Names: []string{big}}},
				Conditions:  []v1.NodeCondition{{Type: v1.NodeReady}},
				NodeInfo:    v1.NodeSystemInfo{KernelVersion: "6.18"},
				Capacity:    v1.ResourceList{},
				Allocatable: v1.ResourceList{},
			},
		},
		check: func(t *testing.T, out any) {
			n := out.(*v1.Node)
			if n.Annotations != nil || n.ManagedFields != nil || n.Status.Images != nil || n.Status.Conditions != nil ||
				n.Status.NodeInfo.KernelVersion != "" || n.Status.Capacity != nil || n.Status.Allocatable != nil {
				t.Errorf("node not slimmed: %+v", n)
			}
			if len(n.Status.Addresses) != 1 || len(n.Spec.Taints) != 1 || len(n.Spec.PodCIDRs) != 1 || n.Labels[v1.LabelTopologyZone] != "z1" {
				t.Errorf("node lost what sluice reads: %+v", n)
			}
		},
	}, {
		name: "ServiceCIDR keeps its ranges",
		in: &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", ManagedFields: managed, Annotations: map[string]string{"a": "b"}},
			Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}},
		},
		check: func(t *testing.T, out any) {
			c := out.(*networkingv1.ServiceCIDR)
			if c.Annotations != nil || c.ManagedFields != nil || len(c.Spec.CIDRs) != 1 {
				t.Errorf("ServiceCIDR %+v", c)
			}
		},
	}, {
		name: "a tombstone passes unchanged",
		in:   nil,
		check: func(t *testing.T, out any) {
			if _, ok := out.(cache.DeletedFinalStateUnknown); !ok {
				t.Errorf("got %T", out)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var in any = tc.in
			if tc.in == nil {
				in = cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: testService("ns", "a")}
			}
			out, err := slim(in)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, out)
		})
	}
}

func TestDeletedObjectUnwrapsTombstones(t *testing.T) {
	svc := testService("ns", "a")
	if got, ok := deletedObject[*v1.Service](svc); !ok || got != svc {
		t.Errorf("plain object: %v %v", got, ok)
	}
	if got, ok := deletedObject[*v1.Service](cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: svc}); !ok || got != svc {
		t.Errorf("tombstone: %v %v", got, ok)
	}
	if got, ok := deletedObject[*v1.Service](cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: testSlice("ns", "a", "a")}); ok || got != nil {
		t.Errorf("tombstone of another type: %v %v", got, ok)
	}
	if got, ok := deletedObject[*v1.Service]("something else"); ok || got != nil {
		t.Errorf("another type: %v %v", got, ok)
	}
	if n := asNode(cache.DeletedFinalStateUnknown{Key: testNode, Obj: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}}); n == nil || n.Name != testNode {
		t.Errorf("asNode does not unwrap a tombstone")
	}
}

func TestSelectorsSentToTheAPIServer(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	got := map[string]string{}
	client.PrependReactor("list", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		r := action.(clienttesting.ListAction).GetListRestrictions()
		mu.Lock()
		got[action.GetResource().Resource] = fmt.Sprintf("labels=%q fields=%q", r.Labels.String(), r.Fields.String())
		mu.Unlock()
		return false, nil, nil
	})
	startWatcher(t, client, newRecordingSink())
	want := map[string]string{
		"services":       `labels="!service.kubernetes.io/service-proxy-name" fields="spec.clusterIP!=None"`,
		"endpointslices": `labels="!service.kubernetes.io/headless" fields=""`,
		"nodes":          `labels="" fields="metadata.name=node-a"`,
		"servicecidrs":   `labels="" fields=""`,
	}
	// Start waits for the Services, EndpointSlices and the Node, not for the ServiceCIDR
	// informer's list, which may come later on a busy machine.
	waitUntil(t, "every resource listed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	for resource, w := range want {
		if got[resource] != w {
			t.Errorf("%s: %s, want %s", resource, got[resource], w)
		}
	}
}

// TestObjectsOfOtherProxiesAndHeadlessSlicesNeverReachTheSink lists a Service labelled for
// another proxy and a headless Service's slice. (The fake applies label selectors to lists
// only, not to watches; test/e2e checks both against a real apiserver.)
func TestObjectsOfOtherProxiesAndHeadlessSlicesNeverReachTheSink(t *testing.T) {
	other := testService("ns", "other")
	other.Labels = map[string]string{LabelServiceProxyName: "someone-else"}
	headless := testSlice("ns", "headless-1", "headless")
	headless.Labels[LabelHeadless] = ""
	client := fake.NewClientset(other, headless, testService("ns", "a"), testSlice("ns", "a-1", "a"))
	sink := newRecordingSink()
	startWatcher(t, client, sink)
	// Objects created after the list arrive after everything listed.
	ctx := context.Background()
	if _, err := client.CoreV1().Services("ns").Create(ctx, testService("ns", "b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, testSlice("ns", "b-1", "b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "b and b-1", func() bool { return sink.has("service add ns/b") && sink.has("slice add ns/b-1") })

	got := sink.snapshot()
	sort.Strings(got)
	want := []string{"service add ns/a", "service add ns/b", "slice add ns/a-1", "slice add ns/b-1"}
	var filtered []string
	for _, e := range got {
		if e != "cidrs" {
			filtered = append(filtered, e)
		}
	}
	if !slices.Equal(filtered, want) {
		t.Errorf("events %v, want %v", filtered, want)
	}
}

func TestHandlersDeliverSlimObjectsAndTheIndexFollowsLabels(t *testing.T) {
	svc := testService("ns", "a")
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	svc.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	client := fake.NewClientset(
		svc,
		testSlice("ns", "a-1", "a"), testSlice("ns", "a-2", "a"),
		testSlice("other", "a-1", "a"), // same Service name, another namespace
		testSlice("ns", "orphan", ""),  // no service-name label
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}},
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:10:96::/112"}}},
	)
	sink := newRecordingSink()
	w := startWatcher(t, client, sink)
	ctx := context.Background()
	a := types.NamespacedName{Namespace: "ns", Name: "a"}

	waitUntil(t, "the Service", func() bool { return sink.has("service add ns/a") })
	sink.mu.Lock()
	delivered := sink.services["ns/a"]
	sink.mu.Unlock()
	if delivered.ManagedFields != nil || delivered.Annotations != nil {
		t.Errorf("the sink got an unslimmed Service: %+v", delivered.ObjectMeta)
	}
	if got, ok := w.Service(a); !ok || got.Name != "a" {
		t.Errorf("Service(ns/a) = %v, %v", got, ok)
	}
	if _, ok := w.Service(types.NamespacedName{Namespace: "ns", Name: "missing"}); ok {
		t.Errorf("Service(ns/missing) found")
	}
	if got := sliceNames(w.EndpointSlices(a)); !slices.Equal(got, []string{"ns/a-1", "ns/a-2"}) {
		t.Errorf("EndpointSlices(ns/a) = %v", got)
	}
	if got := sliceNames(w.EndpointSlices(types.NamespacedName{Namespace: "other", Name: "a"})); !slices.Equal(got, []string{"other/a-1"}) {
		t.Errorf("EndpointSlices(other/a) = %v", got)
	}
	if n := len(w.AllEndpointSlices()); n != 4 {
		t.Errorf("AllEndpointSlices: %d, want 4", n)
	}
	if n, ok := w.Node(); !ok || n.Name != testNode {
		t.Errorf("Node() = %v, %v", n, ok)
	}
	waitUntil(t, "the ServiceCIDRs", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.cidrs) == 2
	})
	if got := w.ServiceCIDRs(); len(got) != 2 || got[0] != netip.MustParsePrefix("10.96.0.0/16") {
		t.Errorf("ServiceCIDRs() = %v", got)
	}

	// A slice moves to another Service: the index follows its label.
	moved := testSlice("ns", "a-2", "b")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the update", func() bool { return sink.has("slice update ns/a-2") })
	if got := sliceNames(w.EndpointSlices(a)); !slices.Equal(got, []string{"ns/a-1"}) {
		t.Errorf("after the move, EndpointSlices(ns/a) = %v", got)
	}
	if got := sliceNames(w.EndpointSlices(types.NamespacedName{Namespace: "ns", Name: "b"})); !slices.Equal(got, []string{"ns/a-2"}) {
		t.Errorf("after the move, EndpointSlices(ns/b) = %v", got)
	}

	// Deletes reach the sink and leave the index.
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "a-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deletes", func() bool { return sink.has("slice delete ns/a-1") && sink.has("service delete ns/a") })
	if got := w.EndpointSlices(a); len(got) != 0 {
		t.Errorf("after the delete, EndpointSlices(ns/a) = %v", sliceNames(got))
	}
	if _, ok := w.Service(a); ok {
		t.Errorf("Service(ns/a) still cached")
	}

	// The Node's deletion is reported as nil.
	if err := client.CoreV1().Nodes().Delete(ctx, testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the Node's deletion", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.nodes) > 0 && sink.nodes[len(sink.nodes)-1] == nil
	})
}

func sliceNames(in []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range in {
		out = append(out, s.Namespace+"/"+s.Name)
	}
	sort.Strings(out)
	return out
}

// TestMissedDeletesArriveAsTombstones makes the informers miss a delete: the watch ends
// with "resource version too old", the relist no longer has the objects, and the
// informer hands the handlers cache.DeletedFinalStateUnknown. The sink must still get the
// Service and the EndpointSlice, unwrapped.
func TestMissedDeletesArriveAsTombstones(t *testing.T) {
	client := fake.NewClientset(testService("ns", "a"), testSlice("ns", "a-1", "a"))
	// Watches the test controls: deletes made through the client are not delivered.
	var mu sync.Mutex
	watchers := map[string]*apiwatch.FakeWatcher{}
	client.PrependWatchReactor("*", func(action clienttesting.Action) (bool, apiwatch.Interface, error) {
		w := apiwatch.NewFakeWithChanSize(10, false)
		mu.Lock()
		watchers[action.GetResource().Resource] = w
		mu.Unlock()
		return true, w, nil
	})
	sink := newRecordingSink()
	startWatcher(t, client, sink)
	waitUntil(t, "the watches", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return watchers["services"] != nil && watchers["endpointslices"] != nil
	})

	ctx := context.Background()
	if err := client.CoreV1().Services("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "a-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := apierrors.NewResourceExpired("too old resource version")
	mu.Lock()
	for _, resource := range []string{"services", "endpointslices"} {
		watchers[resource].Error(&gone.ErrStatus)
	}
	mu.Unlock()

	waitUntil(t, "the tombstones", func() bool { return sink.has("service delete ns/a") && sink.has("slice delete ns/a-1") })
}
