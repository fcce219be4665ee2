package watch

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// decodedSlice builds an EndpointSlice as the API decoder hands it to the informer: every
// optional field a pointer of its own, metadata as the EndpointSlice controller writes it.
func decodedSlice(i, eps int) *discoveryv1.EndpointSlice {
	str := func(s string) *string { return &s }
	b := func(v bool) *bool { return &v }
	proto := v1.ProtocolTCP
	port := int32(8080)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc%d-abcde", i), GenerateName: fmt.Sprintf("svc%d-", i), Namespace: fmt.Sprintf("ns%d", i%50),
			UID: types.UID(fmt.Sprintf("5f0a9d0e-0000-4000-8000-%012d", i)), ResourceVersion: fmt.Sprint(100000 + i), Generation: 1,
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc%d", i), discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app": fmt.Sprintf("svc%d", i)},
			Annotations:     map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-12-01T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: fmt.Sprintf("svc%d", i), UID: "uid"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 800)))}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: str("http"), Protocol: &proto, Port: &port}},
	}
	for j := 0; j < eps; j++ {
		k := i*eps + j
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+k/65536, (k/256)%256, k%256)},
			Conditions: discoveryv1.EndpointConditions{Ready: b(true), Serving: b(true), Terminating: b(false)},
			NodeName:   str(fmt.Sprintf("node-%d", k%500)),
			Zone:       str(fmt.Sprintf("zone-%c", 'a'+k%3)),
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: s.Namespace, Name: fmt.Sprintf("pod-%d", k), UID: "uid"},
		})
	}
	return s
}

// decodedService builds a ClusterIP Service as the API decoder hands it to the informer,
// with the labels and annotations a Helm chart typically gives it.
func decodedService(i int) *v1.Service {
	name := fmt.Sprintf("svc%d", i)
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: fmt.Sprintf("ns%d", i%50),
			UID: types.UID(fmt.Sprintf("6f0a9d0e-0000-4000-8000-%012d", i)), ResourceVersion: fmt.Sprint(200000 + i),
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-prod",
				"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": name + "-1.2.3", "app.kubernetes.io/version": "1.2.3"},
			Annotations:   map[string]string{"meta.helm.sh/release-name": name + "-prod", "meta.helm.sh/release-namespace": "ns"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm", Operation: "Update", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 400)))}},
		},
		Spec: v1.ServiceSpec{
			Selector:  map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-prod"},
			ClusterIP: fmt.Sprintf("10.96.%d.%d", i/256%256, i%256), ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/256%256, i%256)},
			Type: v1.ServiceTypeClusterIP, SessionAffinity: v1.ServiceAffinityNone, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
		},
	}
	//nolint:staticcheck // S1011: one append at a time on purpose, so the capacity is the decoder's
	for _, p := range []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}, {Name: "metrics", Protocol: v1.ProtocolTCP, Port: 9090}} {
		s.Spec.Ports = append(s.Spec.Ports, p) // as the decoder does: one at a time
	}
	return s
}

// BenchmarkSlimmedSliceHeap reports the heap an informer cache of 10 000 slimmed
// EndpointSlices of 10 endpoints holds (bytes per slice, after a GC).
func BenchmarkSlimmedSliceHeap(b *testing.B) {
	benchmarkSlimmedHeap(b, "heap-B/slice", func(i int) any { return decodedSlice(i, 10) })
}

// BenchmarkSlimmedServiceHeap is the same for 10 000 slimmed Services of two ports.
func BenchmarkSlimmedServiceHeap(b *testing.B) {
	benchmarkSlimmedHeap(b, "heap-B/service", func(i int) any { return decodedService(i) })
}

func benchmarkSlimmedHeap(b *testing.B, unit string, decoded func(i int) any) {
	const n = 10000
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		cache := make([]any, n)
		b.StartTimer()
		for i := range cache {
			o, err := slim(decoded(i))
			if err != nil {
				b.Fatal(err)
			}
			cache[i] = o
		}
		b.StopTimer()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, unit)
		runtime.KeepAlive(cache)
		b.StartTimer()
	}
}

// TestSlimSharesValuesAndKeepsThem: two decoded slices come out of slim sharing their
// node names, zones, port names and protocols, with the values they had, their endpoints
// in an array of their length.
func TestSlimSharesValuesAndKeepsThem(t *testing.T) {
	a, _ := slim(decodedSlice(0, 3))
	b, _ := slim(decodedSlice(0, 3))
	ca, cb := a.(*cachedSlice), b.(*cachedSlice)
	if len(ca.endpoints) != 3 || cap(ca.endpoints) != 3 {
		t.Errorf("endpoints: %d in an array of %d, want 3 in 3", len(ca.endpoints), cap(ca.endpoints))
	}
	for i := range ca.endpoints {
		if ca.endpoints[i].nodeName != cb.endpoints[i].nodeName || ca.endpoints[i].zone != cb.endpoints[i].zone {
			t.Errorf("endpoint %d: pointers not shared", i)
		}
	}
	sa, sb := ca.endpointSlice(), cb.endpointSlice()
	for i := range sa.Endpoints {
		ea, eb := &sa.Endpoints[i], &sb.Endpoints[i]
		if ea.Conditions.Ready != eb.Conditions.Ready {
			t.Errorf("endpoint %d: conditions not shared", i)
		}
		if *ea.NodeName != fmt.Sprintf("node-%d", i) || *ea.Zone != fmt.Sprintf("zone-%c", 'a'+i%3) ||
			!*ea.Conditions.Ready || !*ea.Conditions.Serving || *ea.Conditions.Terminating {
			t.Errorf("endpoint %d changed: %+v", i, ea)
		}
	}
	if *sa.Ports[0].Name != "http" || *sa.Ports[0].Protocol != v1.ProtocolTCP || sa.Ports[0].Protocol != sb.Ports[0].Protocol ||
		sa.Ports[0].Name != sb.Ports[0].Name {
		t.Errorf("ports: %+v", sa.Ports[0])
	}
}
