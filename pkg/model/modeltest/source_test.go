package modeltest

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func testSlice(svc, name string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
}

// sliceNames returns the names of a Service's slices, in any order, as a set.
func sliceNames(s *Source, svc string) map[string]bool {
	out := map[string]bool{}
	for _, sl := range s.EndpointSlices(types.NamespacedName{Namespace: "ns", Name: svc}) {
		out[sl.Name] = true
	}
	return out
}

func TestSourceIndexesSlicesByTheirServiceLabel(t *testing.T) {
	s := NewSource()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}
	s.Put(svc, testSlice("a", "a-1"), testSlice("a", "a-2"))
	if got := sliceNames(s, "a"); len(got) != 2 || !got["a-1"] || !got["a-2"] {
		t.Errorf("after Put: slices of a %v, want a-1 and a-2", got)
	}
	// Put replaces every slice of the Service.
	s.Put(svc, testSlice("a", "a-3"))
	if got := sliceNames(s, "a"); len(got) != 1 || !got["a-3"] {
		t.Errorf("after the second Put: slices of a %v, want a-3 only", got)
	}
	if s.Slice(types.NamespacedName{Namespace: "ns", Name: "a-1"}) != nil {
		t.Error("a replaced slice is still stored")
	}
	// A slice that changes its label moves to the other Service.
	old := s.PutSlice(testSlice("b", "a-3"))
	if old == nil || old.Labels[discoveryv1.LabelServiceName] != "a" {
		t.Errorf("PutSlice returned %v, want the slice of a it replaced", old)
	}
	if got := sliceNames(s, "a"); len(got) != 0 {
		t.Errorf("slices of a %v, want none", got)
	}
	if got := sliceNames(s, "b"); len(got) != 1 || !got["a-3"] {
		t.Errorf("slices of b %v, want a-3", got)
	}
	if s.DeleteSlice(types.NamespacedName{Namespace: "ns", Name: "a-3"}) == nil || len(sliceNames(s, "b")) != 0 {
		t.Error("DeleteSlice did not remove the slice")
	}
	if s.DeleteService(types.NamespacedName{Namespace: "ns", Name: "a"}) != svc {
		t.Error("DeleteService did not return the Service")
	}
	if _, ok := s.Service(types.NamespacedName{Namespace: "ns", Name: "a"}); ok {
		t.Error("the deleted Service is still there")
	}
	if svcs, sls := s.All(); svcs != nil || sls != nil {
		t.Errorf("All of an empty Source: %v %v", svcs, sls)
	}
}
