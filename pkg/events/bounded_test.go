package events

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// fakeElectorate is a set of node names that may not be synced yet.
type fakeElectorate struct {
	mu     sync.Mutex
	synced bool
	names  []string
}

func (e *fakeElectorate) HasSynced() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.synced
}

func (e *fakeElectorate) Nodes() iter.Seq[string] {
	e.mu.Lock()
	names := slices.Clone(e.names)
	e.mu.Unlock()
	return slices.Values(names)
}

func (e *fakeElectorate) set(synced bool, names ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.synced, e.names = synced, names
}

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%03d", i)
	}
	return out
}

// clusterReporters returns one Reporter per node, with its recorder, all sharing electorate
// and clock c, as the nodes of one cluster.
func clusterReporters(names []string, electorate Electorate, c *testingclock.FakeClock) (map[string]*fakeRecorder, []*Reporter) {
	recs := map[string]*fakeRecorder{}
	var reporters []*Reporter
	for _, n := range names {
		recs[n] = &fakeRecorder{}
		r := newReporter(recs[n], n, interval, c)
		r.SetElectorate(electorate)
		reporters = append(reporters, r)
	}
	return recs, reporters
}

func serviceName(i int) types.NamespacedName {
	return types.NamespacedName{Namespace: fmt.Sprintf("ns%d", i%7), Name: fmt.Sprintf("svc-%d", i)}
}

func badField(name types.NamespacedName) []model.Problem {
	return []model.Problem{{Service: name, Object: "Service", Field: "metadata.annotations[ipvs.sluice.dev/scheduler]", Message: "unknown scheduler"}}
}

// TestOneNodePerServiceReportsInvalidFields runs one Reporter per node of a 20-node
// cluster over 300 bad Services, as every node's sync loop would: each Service gets
// exactly one InvalidService Event, from its elected node, and the work is spread.
func TestOneNodePerServiceReportsInvalidFields(t *testing.T) {
	const nodes, services = 20, 300
	names := nodeNames(nodes)
	electorate := &fakeElectorate{}
	electorate.set(true, names...)
	c := testingclock.NewFakeClock(t0)
	recs, reporters := clusterReporters(names, electorate, c)
	perService := map[string][]string{} // Service → nodes that reported it
	perNode := map[string]int{}
	for i := range services {
		name := serviceName(i)
		for j, r := range reporters {
			wrote := r.ServiceProblems(name, badField(name))
			// Spread over time so that no budget gets in the way: this test is about
			// the election only.
			c.Step(inputRefill)
			if wrote {
				perService[name.String()] = append(perService[name.String()], names[j])
				perNode[names[j]]++
			}
		}
	}
	for i := range services {
		name := serviceName(i).String()
		if got := perService[name]; len(got) != 1 {
			t.Errorf("%s reported by %v, want exactly one node", name, got)
		} else if want := ElectedNode(name, slices.Values(names)); got[0] != want {
			t.Errorf("%s reported by %s, want its elected node %s", name, got[0], want)
		}
	}
	for _, n := range names {
		for _, ev := range recs[n].take() {
			if ev.reason != ReasonInvalidService || !strings.Contains(ev.note, "node "+n+" reports it for all") {
				t.Errorf("node %s wrote %s %q", n, ev.reason, ev.note)
			}
		}
		// 300 Services over 20 nodes: 15 each on average; rendezvous hashing is not
		// exact, but no node may carry several times its share or none.
		if perNode[n] < 3 || perNode[n] > 45 {
			t.Errorf("node %s reported %d of %d Services; the election is skewed: %v", n, perNode[n], services, perNode)
		}
	}
}

func TestElectionMovesOnlyTheServicesOfALeavingNode(t *testing.T) {
	names := nodeNames(50)
	before := map[string]string{}
	for i := range 2000 {
		key := serviceName(i).String()
		before[key] = ElectedNode(key, slices.Values(names))
	}
	gone := names[17]
	rest := slices.Delete(slices.Clone(names), 17, 18)
	for key, was := range before {
		now := ElectedNode(key, slices.Values(rest))
		if was != gone && now != was {
			t.Errorf("%s moved from %s to %s although %s left", key, was, now, gone)
		}
		if now == gone {
			t.Errorf("%s still elects %s, which left", key, gone)
		}
	}
	if ElectedNode("ns/a", slices.Values([]string(nil))) != "" {
		t.Error("an empty electorate elected a node")
	}
}

// The score is part of the protocol between sluice versions (nodes running different
// versions must elect the same node): pin a few values, computed independently (FNV-1a
// of node, a zero byte and key, then splitmix64's finaliser, in a few lines of Python).
func TestRendezvousScoreIsStable(t *testing.T) {
	for _, tc := range []struct {
		node, key string
		want      uint64
	}{
		{"node-a", "default/kubernetes", 0x6aaae7767dfb6b7d},
		{"node-b", "default/kubernetes", 0x3426b8ffe19bb25f},
		{"ip-10-0-1-17.ec2.internal", "kube-system/kube-dns", 0x36afe926ccc6e42e},
	} {
		if got := rendezvousScore(tc.node, tc.key); got != tc.want {
			t.Errorf("rendezvousScore(%q, %q) = %#x, want %#x", tc.node, tc.key, got, tc.want)
		}
	}
}

// TestInvalidFieldsWaitForTheElectorate: reports made before the Nodes are listed are
// kept, and written (by the elected node only) once they are.
func TestInvalidFieldsWaitForTheElectorate(t *testing.T) {
	names := nodeNames(3)
	electorate := &fakeElectorate{}
	recs, reporters := clusterReporters(names, electorate, testingclock.NewFakeClock(t0))
	for i := range 10 {
		for _, r := range reporters {
			if r.ServiceProblems(serviceName(i), badField(serviceName(i))) {
				t.Fatal("an InvalidService Event was written before the electorate was known")
			}
		}
	}
	electorate.set(true, names...)
	for _, r := range reporters {
		r.FlushDeferred()
	}
	reported := map[string]int{}
	for _, n := range names {
		for _, ev := range recs[n].take() {
			reported[ev.regarding.Namespace+"/"+ev.regarding.Name]++
		}
	}
	for i := range 10 {
		if n := reported[serviceName(i).String()]; n != 1 {
			t.Errorf("%s: %d Events after the flush, want 1", serviceName(i), n)
		}
	}
	// A second flush has nothing left.
	for _, r := range reporters {
		r.FlushDeferred()
	}
	for _, n := range names {
		if got := recs[n].take(); len(got) != 0 {
			t.Errorf("node %s wrote %d Events on a second flush", n, len(got))
		}
	}
}

func TestDeferredReportsAreBounded(t *testing.T) {
	r, rec, _ := newTestReporter()
	e := &fakeElectorate{}
	r.SetElectorate(e)
	for i := range maxDeferred + 50 {
		r.ServiceProblems(serviceName(i), badField(serviceName(i)))
	}
	r.mu.Lock()
	kept, dropped := len(r.deferred), r.deferredDropped
	r.mu.Unlock()
	if kept != maxDeferred || dropped != 50 {
		t.Errorf("kept %d, dropped %d; want %d and 50", kept, dropped, maxDeferred)
	}
	e.set(true, "node-a")
	r.FlushDeferred()
	// Only this node: it wins every Service, and the input budget writes its burst.
	if got := len(rec.take()); got != inputBurst {
		t.Errorf("the flush wrote %d Events, want the budget's burst %d", got, inputBurst)
	}
}

// TestAStormOfNodeLocalFailuresIsCapped replays the storm seen at 10 000 Services (a
// second proxy rewriting the table: 979 Services failed within a minute) on one node:
// the node writes its burst, one Event per refill, and one summary per minute naming
// what it held back.
func TestAStormOfNodeLocalFailuresIsCapped(t *testing.T) {
	r, rec, c := newTestReporter()
	boom := errors.New("nftables: table sluice changed by another writer")
	// 979 Services fail once each over one minute.
	for i := range 979 {
		r.ServiceFailed(serviceName(i), model.IPv4, boom)
		c.Step(time.Minute / 979)
	}
	c.Step(time.Second) // the summary's timer fires
	byReason := map[string]int{}
	var summaries []recorded
	for _, ev := range rec.take() {
		byReason[ev.reason]++
		if ev.reason == ReasonServiceWarningsSuppressed {
			summaries = append(summaries, ev)
		}
	}
	// The burst plus one per refill within the minute.
	maxPerService := nodeLocalBurst + int(time.Minute/nodeLocalRefill) + 1
	if n := byReason[ReasonFailedToProgramService]; n < nodeLocalBurst || n > maxPerService {
		t.Errorf("%d FailedToProgramService Events for 979 failures in a minute, want %d to %d", n, nodeLocalBurst, maxPerService)
	}
	if len(summaries) != 1 {
		t.Fatalf("%d summaries, want 1: %v", len(summaries), byReason)
	}
	s := summaries[0]
	held := 979 - byReason[ReasonFailedToProgramService]
	if s.regarding.Kind != "Node" || s.eventType != "Warning" ||
		!strings.HasPrefix(s.note, fmt.Sprintf("%d more Warnings about Services on this node", held)) ||
		!strings.Contains(s.note, fmt.Sprintf("FailedToProgramService: %d", held)) ||
		!strings.Contains(s.note, "sluice_services_failed") || !strings.Contains(s.note, serviceName(nodeLocalBurst).String()) {
		t.Errorf("summary on %+v: %s %q", *s.regarding, s.eventType, s.note)
	}

	// The storm goes on: the same Services keep failing on every sync. Per Service they
	// are still limited to one per interval, so over the next ten minutes the node
	// writes at most one Event per refill and one summary per minute.
	for range 10 {
		for i := range 979 {
			r.ServiceFailed(serviceName(i), model.IPv4, boom)
		}
		c.Step(time.Minute)
	}
	c.Step(time.Second)
	n := len(rec.take())
	if limit := 10 * (int(time.Minute/nodeLocalRefill) + 1 + 1); n > limit {
		t.Errorf("%d Events in ten more minutes of the storm, want at most %d", n, limit)
	}

	// The storm is over: the budget refills.
	c.Step(nodeLocalBurst * nodeLocalRefill)
	if !r.ServiceFailed(serviceName(5000), model.IPv4, boom) {
		t.Error("after the storm, a new failure was held back")
	}
}

func TestBudgetsAreSeparate(t *testing.T) {
	r, rec, c := newTestReporter()
	boom := errors.New("boom")
	for i := range nodeLocalBurst + 5 {
		r.ServiceFailed(serviceName(i), model.IPv4, boom)
	}
	// Node-local failures used up their budget; bad input still has its own.
	name := serviceName(9999)
	if !r.ServiceProblems(name, badField(name)) {
		t.Error("an InvalidService Event was held back by the node-local budget")
	}
	// The health check failures share the node-local budget.
	if r.ServiceHealthCheckFailed(serviceName(1), 30001, boom); slices.ContainsFunc(rec.take(), func(ev recorded) bool {
		return ev.reason == ReasonFailedToStartServiceHealthcheck
	}) {
		t.Error("a health check failure went past the exhausted node-local budget")
	}
	c.Step(summaryInterval)
	got := rec.take()
	if len(got) != 1 || got[0].reason != ReasonServiceWarningsSuppressed ||
		!strings.Contains(got[0].note, "FailedToProgramService: 5") || !strings.Contains(got[0].note, "FailedToStartServiceHealthcheck: 1") {
		t.Errorf("summary: %+v", got)
	}
	// Nothing held back since: no summary.
	c.Step(summaryInterval)
	if got := rec.take(); len(got) != 0 {
		t.Errorf("an empty summary was written: %+v", got)
	}
}

// TestReporterIsSafeForConcurrentUse runs the sync loop's calls and the summary timers
// from many goroutines (go test -race).
func TestReporterIsSafeForConcurrentUse(t *testing.T) {
	r, rec, c := newTestReporter()
	e := &fakeElectorate{}
	r.SetElectorate(e)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				name := serviceName(g*1000 + i)
				r.ServiceFailed(name, model.IPv4, errors.New("boom"))
				r.ServiceProblems(name, badField(name))
				r.ServiceHealthCheckFailed(name, 30000, errors.New("busy"))
				r.Forget(name)
				if i == 100 && g == 0 {
					e.set(true, "node-a", "node-b")
					r.FlushDeferred()
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			c.Step(summaryInterval / 4)
		}
	})
	wg.Wait()
	if len(rec.take()) == 0 {
		t.Error("no Event written")
	}
}
