package syncloop

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/recording"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

// Conventions: node "node-a"; Services 10.96.0.0/16; pods 10.244.0.0/16.

func service(name, ip string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

func slice(svc, ip string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, NodeName: ptr.To("node-a")}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

type harness struct {
	src     *modeltest.Source
	tracker *model.Tracker
	backend *recording.Backend
	loop    *Loop
	health  *fakeHealth
	report  *fakeReporter
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{
		src:     modeltest.NewSource(),
		backend: recording.New(model.IPv4),
		health:  &fakeHealth{},
		report:  &fakeReporter{failed: map[types.NamespacedName]int{}},
	}
	h.tracker = model.NewTracker(model.TrackerConfig{
		Source:  h.src,
		Node:    model.NodeInfo{Name: "node-a"},
		Options: model.Options{Families: []model.IPFamily{model.IPv4}},
	})
	l, err := New(Config{
		Tracker: h.tracker, Backends: []dataplane.Backend{h.backend},
		MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second, MaxSyncInterval: time.Hour,
		Health: h.health, Reporter: h.report,
		Clock: clocktesting.NewFakeClock(time.Unix(1000, 0)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.loop = l
	return h
}

// cachesSynced tells the tracker that both informers have synced.
func (h *harness) cachesSynced() {
	h.tracker.OnServicesSynced()
	h.tracker.OnEndpointSlicesSynced()
}

// mustSync runs one sync and fails the test when it fails.
func (h *harness) mustSync(t *testing.T) {
	t.Helper()
	if err := h.loop.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// runLoop marks the informers synced, runs the loop until the test ends (checking that
// Run then returns nil), requests a sync and waits for its apply.
func (h *harness) runLoop(t *testing.T) {
	t.Helper()
	h.cachesSynced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loop.Run: %v", err)
		}
	})
	h.loop.Request()
	if err := h.backend.WaitForApplies(ctxTimeout(t), 1); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) add(name, ip, epIP string) {
	svc, sl := service(name, ip), slice(name, epIP)
	h.src.Put(svc, sl)
	h.tracker.OnServiceAdd(svc)
	h.tracker.OnEndpointSliceAdd(sl)
}

type fakeHealth struct {
	mu             sync.Mutex
	queued, synced map[model.IPFamily]int
}

func (f *fakeHealth) QueuedUpdate(fam model.IPFamily) { f.count(&f.queued, fam) }
func (f *fakeHealth) Updated(fam model.IPFamily)      { f.count(&f.synced, fam) }

// count adds one to (*m)[fam], making the map on first use.
func (f *fakeHealth) count(m *map[model.IPFamily]int, fam model.IPFamily) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if *m == nil {
		*m = map[model.IPFamily]int{}
	}
	(*m)[fam]++
}

type fakeReporter struct {
	failed   map[types.NamespacedName]int
	problems int
	forgot   []types.NamespacedName
}

func (f *fakeReporter) ServiceFailed(n types.NamespacedName, _ model.IPFamily, _ error) bool {
	f.failed[n]++
	return true
}
func (f *fakeReporter) ServiceProblems(types.NamespacedName, []model.Problem) bool {
	f.problems++
	return true
}
func (f *fakeReporter) Forget(n types.NamespacedName) { f.forgot = append(f.forgot, n) }

func TestNothingIsProgrammedBeforeCachesSync(t *testing.T) {
	h := newHarness(t)
	h.add("a", "10.96.0.1", "10.244.1.1")
	h.loop.Request()
	h.mustSync(t)
	if total, _ := h.backend.Applies(); total != 0 {
		t.Fatalf("backend applied %d times before the caches synced", total)
	}
	if len(h.health.queued) != 0 {
		t.Errorf("an update was queued for health before the caches synced: %v", h.health.queued)
	}
}

func TestFirstSyncIsFullThenPartial(t *testing.T) {
	h := newHarness(t)
	h.add("a", "10.96.0.1", "10.244.1.1")
	h.add("b", "10.96.0.2", "10.244.1.2")
	h.cachesSynced()
	h.mustSync(t)
	state, ch, _ := h.backend.Last()
	if !ch.Full || len(state.Services) != 2 {
		t.Fatalf("first sync: full=%v ports=%d, want full with 2 ports", ch.Full, len(state.Services))
	}
	h.add("b", "10.96.0.2", "10.244.1.9")
	h.mustSync(t)
	_, ch, _ = h.backend.Last()
	want := sets.New(types.NamespacedName{Namespace: "ns", Name: "b"})
	if ch.Full || !ch.Services.Equal(want) {
		t.Fatalf("second sync: full=%v services=%v, want partial with only ns/b", ch.Full, ch.Services.UnsortedList())
	}
}

func TestFailedServiceIsReportedAndRetriedWhileOthersAreProgrammed(t *testing.T) {
	h := newHarness(t)
	h.add("good", "10.96.0.1", "10.244.1.1")
	h.add("bad", "10.96.0.2", "10.244.1.2")
	h.cachesSynced()
	bad := types.NamespacedName{Namespace: "ns", Name: "bad"}
	h.backend.FailService(bad, errors.New("kernel said no"))

	if err := h.loop.sync(context.Background()); err != nil {
		t.Fatalf("a per-Service failure must not fail the sync: %v", err)
	}
	if got := h.backend.Programmed().PortsOf(types.NamespacedName{Namespace: "ns", Name: "good"}); len(got) != 1 {
		t.Fatalf("the good Service was not programmed")
	}
	if h.report.failed[bad] != 1 {
		t.Errorf("failure of %v reported %d times, want 1", bad, h.report.failed[bad])
	}
	if st := h.loop.Status()[0]; st.Failed[bad.String()] == "" {
		t.Errorf("status does not list %v as failed: %+v", bad, st)
	}

	h.backend.FailService(bad, nil)
	// Its retry is due syncPeriod after the failure (loop_failure_test.go checks the
	// schedule).
	h.loop.clock.(*clocktesting.FakeClock).Step(h.loop.cfg.SyncPeriod)
	h.mustSync(t)
	_, ch, _ := h.backend.Last()
	if !ch.Services.Has(bad) {
		t.Fatalf("the sync at its retry time did not retry %v: %v", bad, ch.Services.UnsortedList())
	}
	if st := h.loop.Status()[0]; len(st.Failed) != 0 {
		t.Errorf("status still lists failures after a successful retry: %v", st.Failed)
	}
	if len(h.report.forgot) != 1 {
		t.Errorf("reporter not told that %v recovered", bad)
	}
}

func TestWholeSyncFailureMakesNextSyncFull(t *testing.T) {
	h := newHarness(t)
	h.add("a", "10.96.0.1", "10.244.1.1")
	h.cachesSynced()
	h.mustSync(t)
	h.backend.FailApply(errors.New("restore failed"))
	h.add("a", "10.96.0.1", "10.244.1.5")
	if err := h.loop.sync(context.Background()); err == nil {
		t.Fatal("a failed apply must make the sync return an error (so the runner retries)")
	}
	h.backend.FailApply(nil)
	h.mustSync(t)
	_, ch, _ := h.backend.Last()
	if !ch.Full {
		t.Fatal("the sync after a failure must be full")
	}
}

type panickingBackend struct{ dataplane.Backend }

func (panickingBackend) Apply(context.Context, *model.NodeState, model.Changes) dataplane.Result {
	panic("boom")
}

func TestBackendPanicIsRecoveredAndRetriedFull(t *testing.T) {
	h := newHarness(t)
	h.loop.cfg.Backends = []dataplane.Backend{panickingBackend{h.backend}}
	h.add("a", "10.96.0.1", "10.244.1.1")
	h.cachesSynced()
	if err := h.loop.sync(context.Background()); err == nil {
		t.Fatal("a panic must be reported as a failed sync")
	}
	h.loop.cfg.Backends = []dataplane.Backend{h.backend}
	h.mustSync(t)
	if _, ch, _ := h.backend.Last(); !ch.Full {
		t.Fatal("the sync after a panic must be full")
	}
}

func TestRunCollapsesABurstIntoOneSync(t *testing.T) {
	h := newHarness(t)
	fc := h.loop.clock.(*clocktesting.FakeClock)
	h.add("a", "10.96.0.1", "10.244.1.1")
	h.runLoop(t)
	// A burst while the loop waits out minSyncPeriod.
	for i := 0; i < 50; i++ {
		h.add("a", "10.96.0.1", "10.244.1."+itoa(i+2))
		h.loop.Request()
	}
	waitForTimers(t, fc)
	fc.Step(time.Second)
	if err := h.backend.WaitForApplies(ctxTimeout(t), 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if total, _ := h.backend.Applies(); total != 2 {
		t.Fatalf("50 changes in a burst caused %d applies after the first, want 1", total-1)
	}
	state, _, _ := h.backend.Last()
	if eps := state.PortsOf(types.NamespacedName{Namespace: "ns", Name: "a"})[0].ClusterEndpoints; eps[0].IP.String() != "10.244.1.51" {
		t.Fatalf("the collapsed sync did not apply the latest state: %v", eps)
	}
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitForTimers(t *testing.T, fc *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the loop never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// modeBackend is a recording backend that reports a mode of its own, so that the metric
// series of one test are not created by another.
type modeBackend struct {
	*recording.Backend
	mode dataplane.Mode
}

func (b modeBackend) Mode() dataplane.Mode { return b.mode }

func TestSyncFailureSeriesExistBeforeTheFirstFailure(t *testing.T) {
	const mode = "never-failed"
	tracker := model.NewTracker(model.TrackerConfig{
		Source:  modeltest.NewSource(),
		Node:    model.NodeInfo{Name: "node-a"},
		Options: model.Options{Families: []model.IPFamily{model.IPv4}},
	})
	if _, err := New(Config{
		Tracker: tracker, Backends: []dataplane.Backend{modeBackend{recording.New(model.IPv4), mode}},
		MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second, MaxSyncInterval: time.Hour,
		Clock: clocktesting.NewFakeClock(time.Unix(1000, 0)),
	}); err != nil {
		t.Fatal(err)
	}

	families := metricstest.Collect(t, metrics.SyncFailuresTotal)
	got := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels[metrics.LabelMode] == mode && labels[metrics.LabelIPFamily] == "IPv4" {
				got[labels[metrics.LabelReason]] = m.GetCounter().GetValue()
			}
		}
	}
	for _, reason := range []string{"backend", "service", "panic", "conntrack"} {
		if v, ok := got[reason]; !ok || v != 0 {
			t.Errorf("sluice_sync_failures_total{reason=%q}: %v (present %v), want present at 0", reason, v, ok)
		}
	}
}
