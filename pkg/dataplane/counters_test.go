package dataplane

import (
	"errors"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/model"
)

type scriptedReader struct {
	reads [][]TrafficCount
	errs  []error
	i     int
}

func (r *scriptedReader) ReadTrafficCounters() ([]TrafficCount, error) {
	i := r.i
	r.i++
	return r.reads[i], r.errs[i]
}

func count(s CounterSeries, n uint64) TrafficCount {
	return TrafficCount{CounterSeries: s, NewConnections: n}
}

// TestCollectorIsMonotonic: a kernel counter that restarts (a rewritten chain) adds to
// the exported total; a failed read keeps the last totals; families are summed; a
// series no longer counted ends.
func TestCollectorIsMonotonic(t *testing.T) {
	web := CounterSeries{Port: model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: model.TCP}, Path: PathCluster}
	v4 := &scriptedReader{
		reads: [][]TrafficCount{{count(web, 5)}, {count(web, 8)}, {count(web, 2)}, nil, {}},
		errs:  []error{nil, nil, nil, errors.New("boom"), nil},
	}
	v6 := &scriptedReader{
		reads: [][]TrafficCount{{count(web, 1)}, {count(web, 1)}, {count(web, 1)}, {count(web, 4)}, {}},
		errs:  []error{nil, nil, nil, nil, nil},
	}
	c := NewTrafficCounterCollector(klog.Background(), v4, v6)
	for i, want := range []uint64{6, 9, 11, 14} {
		got := c.Read()
		if len(got) != 1 || got[0].NewConnections != want {
			t.Fatalf("read %d: %v, want %d new connections", i, got, want)
		}
	}
	if got := c.Read(); len(got) != 0 {
		t.Errorf("series no longer counted still exported: %v", got)
	}
}

func TestCounterIndexFollowsChanges(t *testing.T) {
	name := types.NamespacedName{Namespace: "ns", Name: "web"}
	sp := &model.ServicePort{Name: model.ServicePortName{NamespacedName: name, Port: "http", Protocol: model.TCP}, Counted: true}
	ns := model.NewNodeState(model.IPv4, model.NodeInfo{})
	ns.SetService(name, []*model.ServicePort{sp}, nil)
	chainsOf := func(sp *model.ServicePort) []ChainPath {
		return []ChainPath{{Chain: "c-" + sp.Name.Name, Path: PathCluster}}
	}
	var x CounterIndex
	x.Update(ns, model.Changes{}, true, chainsOf)
	if got := x.Resolve(map[string]ChainCount{"c-web": {Packets: 3}, "c-other": {Packets: 1}}); len(got) != 1 || got[0].Port != sp.Name {
		t.Fatalf("Resolve = %v", got)
	}
	off := *sp
	off.Counted = false
	ns.SetService(name, []*model.ServicePort{&off}, nil)
	x.Update(ns, model.Changes{Services: sets.New(name)}, false, chainsOf)
	if x.Len() != 0 {
		t.Errorf("a Service no longer counted keeps %d chains", x.Len())
	}
}

// A series counted by a first-packet chain and an every-packet chain reads as one
// TrafficCount with new connections, packets and bytes.
func TestCounterIndexMergesChainsOfASeries(t *testing.T) {
	name := types.NamespacedName{Namespace: "ns", Name: "web"}
	sp := &model.ServicePort{Name: model.ServicePortName{NamespacedName: name, Port: "http", Protocol: model.TCP}, Counted: true}
	ns := model.NewNodeState(model.IPv4, model.NodeInfo{})
	ns.SetService(name, []*model.ServicePort{sp}, nil)
	var x CounterIndex
	x.Update(ns, model.Changes{}, true, func(*model.ServicePort) []ChainPath {
		return []ChainPath{
			{Chain: "nat-cluster", Path: PathCluster},
			{Chain: "nat-external", Path: PathExternal},
			{Chain: "pkts-cluster", Path: PathCluster, EveryPacket: true},
		}
	})
	got := x.Resolve(map[string]ChainCount{"nat-cluster": {Packets: 3, Bytes: 180}, "nat-external": {Packets: 2}, "pkts-cluster": {Packets: 20, Bytes: 1500}})
	want := map[CounterPath]TrafficCount{
		PathCluster:  {CounterSeries: CounterSeries{Port: sp.Name, Path: PathCluster}, NewConnections: 3, Packets: 20, Bytes: 1500, HasPacketsBytes: true},
		PathExternal: {CounterSeries: CounterSeries{Port: sp.Name, Path: PathExternal}, NewConnections: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("Resolve = %v, want %v", got, want)
	}
	for _, c := range got {
		if c != want[c.Path] {
			t.Errorf("Resolve %s = %+v, want %+v", c.Path, c, want[c.Path])
		}
	}
}

// clockedReader returns one more new connection at each read, and moves the collector's
// clock on by took while it reads.
type clockedReader struct {
	series CounterSeries
	now    *time.Time
	took   time.Duration
	reads  uint64
}

func (r *clockedReader) ReadTrafficCounters() ([]TrafficCount, error) {
	r.reads++
	*r.now = r.now.Add(r.took)
	return []TrafficCount{count(r.series, r.reads)}, nil
}

// TestCollectorBoundsReadTime: a read slower than cheapRead is reused by the scrapes of
// the next readSpacing times its duration, so reads take at most a tenth of the time; a
// cheap read is repeated on every scrape.
func TestCollectorBoundsReadTime(t *testing.T) {
	web := CounterSeries{Port: model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: model.TCP}, Path: PathCluster}
	for _, tc := range []struct {
		name string
		took time.Duration
		// gap is the time between the end of a scrape and the next one.
		gap time.Duration
		// want is the new connections each of five scrapes exports.
		want []uint64
	}{
		{"cheap reads: every scrape reads", 900 * time.Millisecond, 0, []uint64{1, 2, 3, 4, 5}},
		{"a 2 s read is reused for 20 s", 2 * time.Second, 5 * time.Second, []uint64{1, 1, 1, 1, 2}},
		{"scrapes further apart than the spacing all read", 2 * time.Second, 19 * time.Second, []uint64{1, 2, 3, 4, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			r := &clockedReader{series: web, now: &now, took: tc.took}
			c := NewTrafficCounterCollector(klog.Background(), r)
			c.now = func() time.Time { return now }
			var got []uint64
			for range tc.want {
				read := c.Read()
				if len(read) != 1 {
					t.Fatalf("read %v, want one series", read)
				}
				got = append(got, read[0].NewConnections)
				now = now.Add(tc.gap)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("scrapes exported %v, want %v", got, tc.want)
			}
			busy := time.Duration(r.reads) * tc.took
			if total := now.Sub(time.Unix(1000, 0)); tc.took >= cheapRead && busy*readSpacing > total+readSpacing*tc.took {
				t.Errorf("reads took %v of %v", busy, total)
			}
		})
	}
}
