package syncloop

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
	"github.com/sluiceproxy/sluice/test/asynctest"
)

// Tests of the failure rule (a Service the backend rejects keeps its last good version
// and is retried with backoff), of panics, and of stopping. The harness's syncPeriod is
// 30 s, minSyncPeriod 1 s, maxInterval 1 h; the clock is fake.

var (
	nameGood = types.NamespacedName{Namespace: "ns", Name: "good"}
	nameBad  = types.NamespacedName{Namespace: "ns", Name: "bad"}
)

// endpointOf returns the first endpoint a state holds for name ("" when none).
func endpointOf(st *model.NodeState, name types.NamespacedName) string {
	for _, sp := range st.PortsOf(name) {
		for _, e := range sp.AllEndpoints {
			return e.IP.String()
		}
	}
	return ""
}

func (h *harness) fakeClock() *clocktesting.FakeClock { return h.loop.clock.(*clocktesting.FakeClock) }

// syncAt steps the fake clock by d and runs one sync.
func (h *harness) syncAt(t *testing.T, d time.Duration) (model.Changes, bool) {
	t.Helper()
	before, _ := h.backend.Applies()
	h.fakeClock().Step(d)
	if err := h.loop.sync(context.Background()); err != nil {
		t.Fatalf("sync: %v", err)
	}
	after, _ := h.backend.Applies()
	_, ch, _ := h.backend.Last()
	return ch, after > before
}

func gaugeValue(t *testing.T, family string) float64 {
	t.Helper()
	return metricstest.Value(t, metrics.ServicesFailed.WithLabelValues(family))
}

// TestFailedServiceKeepsLastGoodVersionAndBacksOff follows one Service whose update the
// backend rejects: it keeps its last good version through partial and full syncs, is
// retried syncPeriod after the failure, then after 2, 4 ... syncPeriods, at once when its
// own objects change, and is forgotten once programmed.
func TestFailedServiceKeepsLastGoodVersionAndBacksOff(t *testing.T) {
	h := newHarness(t)
	h.add("good", "10.96.0.1", "10.244.1.1")
	h.add("bad", "10.96.0.2", "10.244.1.2")
	h.cachesSynced()
	if _, applied := h.syncAt(t, 0); !applied {
		t.Fatal("the first sync applied nothing")
	}

	// bad's update is rejected.
	h.backend.FailService(nameBad, errors.New("kernel said no"))
	h.add("bad", "10.96.0.2", "10.244.1.9")
	ch, _ := h.syncAt(t, 0)
	if !ch.Services.Has(nameBad) {
		t.Fatalf("the update was not applied: %v", ch.Services.UnsortedList())
	}
	if got := endpointOf(h.backend.Programmed(), nameBad); got != "10.244.1.2" {
		t.Fatalf("after the rejection bad is programmed to %q, want its last good endpoint 10.244.1.2", got)
	}
	st := h.loop.Status()[0]
	if st.Failed[nameBad.String()] == "" || !st.NextRetry[nameBad.String()].Equal(h.fakeClock().Now().Add(30*time.Second)) {
		t.Fatalf("status: failed %v, next retry %v; want bad retried in 30 s", st.Failed, st.NextRetry)
	}
	if h.report.failed[nameBad] != 1 || gaugeValue(t, "IPv4") != 1 {
		t.Fatalf("reported %d times, sluice_services_failed %v; want 1 and 1", h.report.failed[nameBad], gaugeValue(t, "IPv4"))
	}

	// Another Service's change: bad is left to its backoff.
	h.add("good", "10.96.0.1", "10.244.1.3")
	if ch, _ := h.syncAt(t, time.Second); !ch.Services.Equal(sets.New(nameGood)) {
		t.Fatalf("a sync for another change touched %v, want only ns/good", ch.Services.UnsortedList())
	}
	// A full sync programs bad's last good version, not the rejected one.
	h.tracker.OnServiceCIDRsChange([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
	if ch, _ := h.syncAt(t, time.Second); !ch.Full {
		t.Fatal("expected a full sync")
	}
	if last, _, _ := h.backend.Last(); endpointOf(last, nameBad) != "10.244.1.2" {
		t.Fatalf("a full sync while bad waits for its retry was given endpoint %q, want its last good 10.244.1.2", endpointOf(last, nameBad))
	}
	if h.report.failed[nameBad] != 1 {
		t.Fatalf("syncs before the retry reported bad again (%d)", h.report.failed[nameBad])
	}

	// The retry at 30 s fails; then 60 s, 120 s.
	for i, wait := range []time.Duration{28 * time.Second, 60 * time.Second, 120 * time.Second} {
		if wait > 30*time.Second {
			if ch, _ := h.syncAt(t, wait-time.Second); ch.Services.Has(nameBad) {
				t.Fatalf("retry %d came before its %v backoff", i+1, wait)
			}
			wait = time.Second
		}
		if ch, _ := h.syncAt(t, wait); !ch.Services.Has(nameBad) {
			t.Fatalf("retry %d did not come: %v", i+1, ch.Services.UnsortedList())
		}
		if got := h.report.failed[nameBad]; got != i+2 {
			t.Fatalf("after retry %d bad was reported %d times", i+1, got)
		}
	}

	// A change of its own retries it at once.
	h.add("bad", "10.96.0.2", "10.244.1.7")
	if ch, _ := h.syncAt(t, time.Second); !ch.Services.Has(nameBad) {
		t.Fatalf("a change to bad's own objects did not retry it: %v", ch.Services.UnsortedList())
	}

	// That was its 5th failure: the backoff reached its cap (5 min). Fixed, the next retry
	// programs it.
	h.backend.FailService(nameBad, nil)
	if ch, _ := h.syncAt(t, 299*time.Second); ch.Services.Has(nameBad) {
		t.Fatal("retried before its backoff")
	}
	if ch, _ := h.syncAt(t, time.Second); !ch.Services.Has(nameBad) {
		t.Fatal("not retried after its backoff")
	}
	if got := endpointOf(h.backend.Programmed(), nameBad); got != "10.244.1.7" {
		t.Fatalf("after recovering bad is programmed to %q, want 10.244.1.7", got)
	}
	if st := h.loop.Status()[0]; len(st.Failed)+len(st.NextRetry) != 0 {
		t.Errorf("status still lists failures: %v %v", st.Failed, st.NextRetry)
	}
	if len(h.report.forgot) != 1 || gaugeValue(t, "IPv4") != 0 {
		t.Errorf("forgot %v, sluice_services_failed %v; want bad forgotten and 0", h.report.forgot, gaugeValue(t, "IPv4"))
	}
	// And it is not retried any more.
	if ch, _ := h.syncAt(t, time.Hour); ch.Services.Has(nameBad) {
		t.Error("a recovered Service is still retried")
	}
}

func TestBackoffDoublesUpToItsCap(t *testing.T) {
	for _, tc := range []struct {
		name            string
		syncPeriod, cap time.Duration
		want            []time.Duration
	}{
		{name: "defaults", syncPeriod: 30 * time.Second, want: []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}},
		{name: "cap below syncPeriod", syncPeriod: 30 * time.Second, cap: 10 * time.Second, want: []time.Duration{30 * time.Second, 30 * time.Second}},
		{name: "long syncPeriod", syncPeriod: 10 * time.Minute, want: []time.Duration{10 * time.Minute, 10 * time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Loop{cfg: Config{SyncPeriod: tc.syncPeriod, MaxRetryBackoff: tc.cap, MaxSyncInterval: time.Hour}}
			if l.cfg.MaxRetryBackoff == 0 {
				l.cfg.MaxRetryBackoff = DefaultMaxRetryBackoff
			}
			for i, want := range tc.want {
				if got := l.backoff(i + 1); got != want {
					t.Errorf("attempt %d: backoff %v, want %v", i+1, got, want)
				}
			}
		})
	}
}

// TestRetryWakesTheLoopWhenNothingElseChanges runs the loop: after a Service failed, the
// runner wakes up for its retries on its own (maxInterval is an hour).
func TestRetryWakesTheLoopWhenNothingElseChanges(t *testing.T) {
	h := newHarness(t)
	fc := h.fakeClock()
	h.add("good", "10.96.0.1", "10.244.1.1")
	h.add("bad", "10.96.0.2", "10.244.1.2")
	h.backend.FailService(nameBad, errors.New("kernel said no"))
	h.runLoop(t)
	applies := 1
	// The loop waits out minSyncPeriod, then sleeps until the retry: 30 s, then 60 s.
	for _, wait := range []time.Duration{30 * time.Second, 60 * time.Second} {
		waitForWaiters(t, fc, 2)
		fc.Step(time.Second)
		waitForWaiters(t, fc, 1)
		fc.Step(wait - time.Second - time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		if n, _ := h.backend.Applies(); n != applies {
			t.Fatalf("an apply ran before the retry was due (%v)", wait)
		}
		fc.Step(time.Millisecond)
		applies++
		if err := h.backend.WaitForApplies(ctxTimeout(t), applies); err != nil {
			t.Fatalf("no retry after %v: %v", wait, err)
		}
		if _, ch, _ := h.backend.Last(); !ch.Services.Equal(sets.New(nameBad)) {
			t.Fatalf("the retry applied %v, want only ns/bad", ch.Services.UnsortedList())
		}
	}
}

func waitForWaiters(t *testing.T, fc *clocktesting.FakeClock, n int) {
	t.Helper()
	for range 5000 {
		if fc.Waiters() == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the loop did not arm %d timers (has %d)", n, fc.Waiters())
}

// panickySource panics when asked for one Service, like a bug in its computation.
type panickySource struct {
	*modeltest.Source
	name types.NamespacedName
	on   bool
}

func (s *panickySource) Service(n types.NamespacedName) (*v1.Service, bool) {
	if s.on && n == s.name {
		panic("nil pointer dereference")
	}
	return s.Source.Service(n)
}

// TestComputePanicKeepsTheServiceAndRetriesIt: a panic while computing one Service is
// reported, the other Services are programmed, and the next sync computes it again
// although nothing changed.
func TestComputePanicKeepsTheServiceAndRetriesIt(t *testing.T) {
	h := newHarness(t)
	src := &panickySource{Source: h.src, name: nameBad}
	h.tracker = model.NewTracker(model.TrackerConfig{Source: src, Node: model.NodeInfo{Name: "node-a"},
		Options: model.Options{Families: []model.IPFamily{model.IPv4}}})
	h.loop.cfg.Tracker = h.tracker
	h.add("good", "10.96.0.1", "10.244.1.1")
	h.add("bad", "10.96.0.2", "10.244.1.2")
	h.cachesSynced()
	h.syncAt(t, 0)

	before := metricstest.Value(t, metrics.SyncFailuresTotal.WithLabelValues("all", string(dataplane.ModeRecording), "panic"))
	src.on = true
	h.add("bad", "10.96.0.2", "10.244.1.9")
	h.add("good", "10.96.0.1", "10.244.1.5")
	ch, _ := h.syncAt(t, time.Second)
	if !ch.Services.Equal(sets.New(nameGood)) {
		t.Fatalf("applied %v, want ns/good (ns/bad's computation panicked)", ch.Services.UnsortedList())
	}
	if got := endpointOf(h.backend.Programmed(), nameBad); got != "10.244.1.2" {
		t.Fatalf("bad is programmed to %q, want its previous 10.244.1.2", got)
	}
	if h.report.failed[nameBad] != 1 {
		t.Errorf("the panic was reported %d times", h.report.failed[nameBad])
	}
	if got := metricstest.Value(t, metrics.SyncFailuresTotal.WithLabelValues("all", string(dataplane.ModeRecording), "panic")) - before; got != 1 {
		t.Errorf("sluice_sync_failures_total{reason=panic} grew by %v, want 1", got)
	}

	src.on = false
	ch, _ = h.syncAt(t, 30*time.Second)
	if !ch.Services.Equal(sets.New(nameBad)) {
		t.Fatalf("the next sync applied %v, want ns/bad computed again", ch.Services.UnsortedList())
	}
	if got := endpointOf(h.backend.Programmed(), nameBad); got != "10.244.1.9" {
		t.Fatalf("bad is programmed to %q, want 10.244.1.9", got)
	}
}

// TestBackendPanicRedoesTheDrainedChanges: the changes a sync drained before the backend
// panicked are applied by the next sync (a full one).
func TestBackendPanicRedoesTheDrainedChanges(t *testing.T) {
	h := newHarness(t)
	h.add("good", "10.96.0.1", "10.244.1.1")
	h.cachesSynced()
	h.syncAt(t, 0)

	h.loop.cfg.Backends = []dataplane.Backend{panickingBackend{h.backend}}
	h.add("good", "10.96.0.1", "10.244.1.5")
	h.add("new", "10.96.0.3", "10.244.1.6")
	if err := h.loop.sync(context.Background()); err == nil {
		t.Fatal("a panic must fail the sync (so that the runner retries it)")
	}
	h.loop.cfg.Backends = []dataplane.Backend{h.backend}
	ch, _ := h.syncAt(t, 30*time.Second)
	if !ch.Full || !ch.Services.IsSuperset(sets.New(nameGood, types.NamespacedName{Namespace: "ns", Name: "new"})) {
		t.Fatalf("the sync after the panic: full=%v services=%v, want full with ns/good and ns/new", ch.Full, ch.Services.UnsortedList())
	}
	p := h.backend.Programmed()
	if endpointOf(p, nameGood) != "10.244.1.5" || endpointOf(p, types.NamespacedName{Namespace: "ns", Name: "new"}) != "10.244.1.6" {
		t.Fatalf("the drained changes were not redone: %v", p.View())
	}
}

// slowBackend blocks in Apply until released, then applies with the context it was given.
type slowBackend struct {
	dataplane.Backend
	started chan struct{}
	release chan struct{}
}

func (b slowBackend) Apply(ctx context.Context, s *model.NodeState, ch model.Changes) dataplane.Result {
	close(b.started)
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return b.Backend.Apply(ctx, s, ch)
}

// TestStopLetsTheSyncInProgressFinish: when Run's context ends during an apply, the apply
// goes on with a live context for up to ShutdownGrace, its rules stay, and Run returns
// once it is done; past the grace period it is cancelled.
func TestStopLetsTheSyncInProgressFinish(t *testing.T) {
	for _, tc := range []struct {
		name    string
		step    time.Duration
		wantErr bool
	}{
		{name: "within the grace period", step: DefaultShutdownGrace - time.Second},
		{name: "past the grace period", step: DefaultShutdownGrace, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			fc := h.fakeClock()
			slow := slowBackend{Backend: h.backend, started: make(chan struct{}), release: make(chan struct{})}
			h.loop.cfg.Backends = []dataplane.Backend{slow}
			h.add("good", "10.96.0.1", "10.244.1.1")
			h.tracker.OnServicesSynced()
			h.tracker.OnEndpointSlicesSynced()

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- h.loop.Run(ctx) }()
			h.loop.Request()
			<-slow.started
			cancel() // SIGTERM
			waitForWaiters(t, fc, 1)
			fc.Step(tc.step)
			asynctest.StoppedDuringWork(t, "Run", "sync", done, 50*time.Millisecond, tc.wantErr, func() { close(slow.release) })
			res := h.backend.LastResult()
			if tc.wantErr != (res.Err != nil) {
				t.Fatalf("the apply returned %v", res.Err)
			}
			if !tc.wantErr && endpointOf(h.backend.Programmed(), nameGood) != "10.244.1.1" {
				t.Fatal("the sync in progress did not program its Service")
			}
		})
	}
}
