package model

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

func TestTrackerUnapplied(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	want := func(step string, names ...string) {
		t.Helper()
		var w []types.NamespacedName
		for _, n := range names {
			w = append(w, nn(n))
		}
		if got := tr.Unapplied(IPv4); !slices.Equal(got, w) {
			t.Errorf("%s: Unapplied = %v, want %v", step, got, w)
		}
	}
	if got := tr.Unapplied(IPv6); got != nil {
		t.Errorf("a family not tracked: Unapplied = %v", got)
	}
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	upsertService(tr, src, makeService("a"))
	want("handled, not drained")
	tr.Drain()
	want("drained, not applied", "a", "b")
	tr.Applied(IPv4, sets.New(nn("b")))
	want("b failed", "b")
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	tr.Drain()
	tr.Failed(IPv4)
	want("the whole sync failed", "a", "b")
	tr.Drain()
	tr.Applied(IPv4, nil)
	want("applied")
}
