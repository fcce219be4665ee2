package watch

import (
	"runtime"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// TestSliceIndexFollowsTheServiceLabel: adds, updates (one moving a slice to another
// Service), deletes and tombstones keep each Service's list of slices; a slice without a
// Service name is not indexed; a list read before a change keeps what it had.
func TestSliceIndexFollowsTheServiceLabel(t *testing.T) {
	cached := func(ns, name, service string) any { o, _ := slim(testSlice(ns, name, service)); return o }
	var x sliceIndex
	x.init()
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	names := func(name types.NamespacedName) []string {
		var out []string
		for _, s := range x.slicesOf(name) {
			out = append(out, s.Namespace+"/"+s.Name)
		}
		slices.Sort(out)
		return out
	}
	check := func(step string, name types.NamespacedName, want ...string) {
		t.Helper()
		if got := names(name); !slices.Equal(got, want) {
			t.Errorf("%s: slices of %s %v, want %v", step, name, got, want)
		}
	}
	a1, a2 := cached("ns", "a-1", "a"), cached("ns", "a-2", "a")
	x.update(nil, a1)
	x.update(nil, a2)
	x.update(nil, cached("other", "a-1", "a"))
	x.update(nil, cached("ns", "orphan", ""))
	check("adds", a, "ns/a-1", "ns/a-2")
	check("adds", types.NamespacedName{Namespace: "other", Name: "a"}, "other/a-1")
	check("adds", types.NamespacedName{Namespace: "ns"})
	before := x.byService[a]

	a2b := cached("ns", "a-2", "b")
	x.update(a2, a2b)
	check("a move", a, "ns/a-1")
	check("a move", b, "ns/a-2")
	if len(before) != 2 || before[1] != a2 {
		t.Errorf("a list read before the move changed: %v", before)
	}
	a1new := cached("ns", "a-1", "a")
	x.update(a1, a1new)
	x.update(nil, a1new) // told twice
	check("an update", a, "ns/a-1")
	if x.byService[a][0] != a1new {
		t.Errorf("the update did not replace the slice")
	}

	x.update(cache.DeletedFinalStateUnknown{Key: "ns/a-1", Obj: a1new}, nil)
	x.update(a2b, nil)
	check("deletes", a)
	check("deletes", b)
	if _, ok := x.byService[a]; ok {
		t.Errorf("an empty list stays in the index")
	}
}

// BenchmarkSliceIndexHeap reports the heap the index of 10 000 slices, one per Service,
// holds (bytes per slice, after a GC; client-go's indexer held 316).
func BenchmarkSliceIndexHeap(b *testing.B) {
	const n = 10000
	cached := make([]any, n)
	for i := range cached {
		cached[i], _ = slim(decodedSlice(i, 10))
	}
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var x sliceIndex
		x.init()
		b.StartTimer()
		for _, c := range cached {
			x.update(nil, c)
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/slice")
		runtime.KeepAlive(&x)
		b.StartTimer()
	}
}
