package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/test/asynctest"
)

// Test conventions: every test drives the runner with a fake clock. fn hands each call to
// the test through h.calls and blocks until the test answers it, so the test decides what
// each run returns and always knows whether a run is in progress. Real waiting happens only
// while polling for the loop to reach a known state (a bounded number of 1 ms naps) and in
// expectNoRun, which gives a wrongly triggered run a few milliseconds to show up.

// outcome is what one call of fn does when the test releases it.
type outcome struct {
	err     error
	panicOf any
}

type harness struct {
	t     *testing.T
	clock *testingclock.FakeClock
	r     *BoundedFrequencyRunner
	calls chan chan outcome
	done  chan error
	stop  context.CancelFunc
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, clock: testingclock.NewFakeClock(t0), calls: make(chan chan outcome)}
	r, err := newWithClock(cfg, func(ctx context.Context) error {
		reply := make(chan outcome)
		select {
		case h.calls <- reply:
		case <-ctx.Done():
			return ctx.Err()
		}
		o := <-reply
		if o.panicOf != nil {
			panic(o.panicOf)
		}
		return o.err
	}, h.clock)
	if err != nil {
		t.Fatalf("newWithClock: %v", err)
	}
	h.r = r
	return h
}

// start runs the loop in a goroutine; the test's cleanup stops it and checks it returned.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.r.Loop(ctx) }()
	h.t.Cleanup(func() { stopLoop(h.t, cancel, h.done) })
}

// expectRun waits for the next call of fn and makes it return o.
func (h *harness) expectRun(o outcome) {
	h.t.Helper()
	select {
	case reply := <-h.calls:
		reply <- o
	case <-time.After(5 * time.Second):
		h.t.Fatalf("fn was not called (fake time %v after start)", h.clock.Since(t0))
	}
}

// expectNoRun checks that fn is not called within a few milliseconds.
func (h *harness) expectNoRun() {
	h.t.Helper()
	select {
	case reply := <-h.calls:
		reply <- outcome{}
		h.t.Fatalf("fn was called unexpectedly (fake time %v after start)", h.clock.Since(t0))
	case <-time.After(5 * time.Millisecond):
	}
}

// waitForTimers waits until the loop has armed n timers on the fake clock: 1 while it
// waits for a trigger, 2 while it also waits out MinInterval after a run (when
// MinInterval > 0). Stepping the clock before the timers are armed would be meaningless.
func (h *harness) waitForTimers(n int) {
	h.t.Helper()
	for range 5000 {
		if h.clock.Waiters() == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	h.t.Fatalf("loop did not arm %d timers (has %d)", n, h.clock.Waiters())
}

// duringRun waits for the next call of fn, calls during while fn is still running, then
// makes fn return o.
func (h *harness) duringRun(during func(), o outcome) {
	h.t.Helper()
	select {
	case reply := <-h.calls:
		during()
		reply <- o
	case <-time.After(5 * time.Second):
		h.t.Fatal("fn was not called")
	}
}

// waitOutMinInterval lets the MinInterval after a run pass: the loop then waits on one
// timer, for a trigger.
func (h *harness) waitOutMinInterval() {
	h.t.Helper()
	h.waitForTimers(2)
	h.clock.Step(minI)
	h.waitForTimers(1)
}

// expectRunAfter steps the fake clock by d in two steps: fn is not called 1 ms before
// d has passed, and is called (and returns o) when it has.
func (h *harness) expectRunAfter(d time.Duration, o outcome) {
	h.t.Helper()
	h.clock.Step(d - time.Millisecond)
	h.expectNoRun()
	h.clock.Step(time.Millisecond)
	h.expectRun(o)
}

// stopLoop cancels the context of a loop started with done <- Loop(ctx) and checks that
// it returns nil in time.
func stopLoop(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	asynctest.Stop(t, "Loop", cancel, done)
}

const (
	minI   = 1 * time.Second
	retryI = 10 * time.Second
	maxI   = time.Hour
)

func defaultConfig() Config {
	return Config{Name: "test", MinInterval: minI, RetryInterval: retryI, MaxInterval: maxI}
}

// TestBurstCollapsesIntoOneRun: a burst of Run calls, before the loop starts or while fn
// runs, makes one run (after MinInterval for the burst during a run) and no more.
func TestBurstCollapsesIntoOneRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		// burst makes the burst and everything up to the one run it is due to make.
		burst func(h *harness)
	}{
		{name: "before the loop starts", burst: func(h *harness) {
			for range 100 {
				h.r.Run()
			}
			h.start()
		}},
		{name: "during a run, after MinInterval", burst: func(h *harness) {
			h.start()
			h.r.Run()
			h.duringRun(func() {
				for range 50 {
					h.r.Run() // while fn is running
				}
			}, outcome{})
			h.waitForTimers(2)
			h.expectNoRun() // held back by MinInterval
			h.clock.Step(minI)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, defaultConfig())
			tc.burst(h)
			h.expectRun(outcome{})
			h.waitOutMinInterval()
			h.expectNoRun()
		})
	}
}

func TestMinIntervalSeparatesEndOfRunFromNextStart(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.expectRun(outcome{})
	h.waitForTimers(2)
	h.r.Run()
	h.expectRunAfter(minI, outcome{})
}

func TestMinIntervalCountsFromTheEndOfTheRun(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.duringRun(func() {
		// The run itself takes longer than MinInterval.
		h.clock.Step(5 * minI)
		h.r.Run()
	}, outcome{})
	h.waitForTimers(2)
	h.expectNoRun()
	h.clock.Step(minI)
	h.expectRun(outcome{})
}

func TestZeroMinIntervalRunsBackToBack(t *testing.T) {
	cfg := defaultConfig()
	cfg.MinInterval = 0
	h := newHarness(t, cfg)
	h.start()
	for range 3 {
		h.r.Run()
		h.expectRun(outcome{})
		h.waitForTimers(1)
	}
}

func TestRetryAfterFailure(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retry     time.Duration
		max       time.Duration
		wantRetry time.Duration
	}{
		{name: "retry interval shorter than max", retry: 10 * time.Second, max: time.Hour, wantRetry: 10 * time.Second},
		{name: "retry interval capped at max", retry: 2 * time.Hour, max: time.Hour, wantRetry: time.Hour},
		{name: "no retry interval means max", retry: 0, max: 30 * time.Second, wantRetry: 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{Name: "retry", MinInterval: minI, RetryInterval: tc.retry, MaxInterval: tc.max})
			h.start()
			h.r.Run()
			h.expectRun(outcome{err: errors.New("boom")})
			h.waitOutMinInterval()
			// The retry timer started when the run ended, together with MinInterval.
			h.expectRunAfter(tc.wantRetry-minI, outcome{})

			// After a success the next unrequested run is MaxInterval away again.
			h.waitOutMinInterval()
			h.expectRunAfter(tc.max-minI, outcome{})
		})
	}
}

func TestRequestBeforeRetryRunsEarly(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.expectRun(outcome{err: errors.New("boom")})
	h.waitForTimers(2)
	h.r.Run()
	h.clock.Step(minI)
	h.expectRun(outcome{})
}

func TestPeriodicRunAtMaxInterval(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.waitForTimers(1)
	h.expectRunAfter(maxI, outcome{})
	h.waitOutMinInterval()
	h.clock.Step(maxI - minI)
	h.expectRun(outcome{})
}

func counterValue(t *testing.T, family, mode, reason string) float64 {
	t.Helper()
	return metricstest.Value(t, metrics.SyncFailuresTotal.WithLabelValues(family, mode, reason))
}

func TestPanicIsRecoveredCountedAndRetried(t *testing.T) {
	var (
		mu         sync.Mutex
		gotPanic   any
		gotStack   string
		panicCalls atomic.Int32
	)
	cfg := defaultConfig()
	cfg.IPFamily, cfg.Mode = "IPv6", "panic-test"
	cfg.OnPanic = func(recovered any, stack []byte) {
		mu.Lock()
		defer mu.Unlock()
		panicCalls.Add(1)
		gotPanic, gotStack = recovered, string(stack)
	}
	before := counterValue(t, "IPv6", "panic-test", "panic")

	h := newHarness(t, cfg)
	h.start()
	h.r.Run()
	h.expectRun(outcome{panicOf: "kaboom"})
	h.waitForTimers(2)

	mu.Lock()
	if gotPanic != "kaboom" {
		t.Errorf("OnPanic got %v, want kaboom", gotPanic)
	}
	if !strings.Contains(gotStack, "runner_test.go") {
		t.Errorf("OnPanic stack does not show where the panic happened:\n%s", gotStack)
	}
	mu.Unlock()
	if got := counterValue(t, "IPv6", "panic-test", "panic") - before; got != 1 {
		t.Errorf("sluice_sync_failures_total{reason=panic} grew by %v, want 1", got)
	}

	// A panic is a failure: the retry interval applies.
	h.clock.Step(minI)
	h.waitForTimers(1)
	h.expectRunAfter(retryI-minI, outcome{})
	if n := panicCalls.Load(); n != 1 {
		t.Errorf("OnPanic called %d times, want 1", n)
	}
}

func TestPanicWithoutLabelsLeavesMetricAlone(t *testing.T) {
	before := counterValue(t, "", "", "panic")
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.expectRun(outcome{panicOf: errors.New("kaboom")})
	h.waitForTimers(2)
	if got := counterValue(t, "", "", "panic") - before; got != 0 {
		t.Errorf("metric without labels grew by %v, want 0", got)
	}
}

func TestLoopStopsOnContextCancel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *harness)
	}{
		{name: "while idle", setup: func(h *harness) { h.waitForTimers(1) }},
		{name: "while waiting out MinInterval", setup: func(h *harness) {
			h.r.Run()
			h.expectRun(outcome{})
			h.waitForTimers(2)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, defaultConfig())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- h.r.Loop(ctx) }()
			tc.setup(h)
			stopLoop(t, cancel, done)
			if h.r.looping.Load() {
				t.Error("runner still marked as looping")
			}
		})
	}
}

func TestSecondConcurrentLoopIsRejected(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.waitForTimers(1)
	if err := h.r.Loop(context.Background()); err == nil {
		t.Fatal("second Loop returned nil, want an error")
	}
	// The first loop is unaffected.
	h.r.Run()
	h.expectRun(outcome{})
}

func TestNewValidatesIntervals(t *testing.T) {
	fn := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{name: "upstream iptables settings", cfg: Config{MinInterval: time.Second, RetryInterval: 30 * time.Second, MaxInterval: time.Hour}},
		{name: "max equal to min", cfg: Config{MinInterval: time.Second, MaxInterval: time.Second}},
		{name: "zero min", cfg: Config{MaxInterval: time.Second}},
		{name: "max below min", cfg: Config{MinInterval: 2 * time.Second, MaxInterval: time.Second}, wantErr: true},
		{name: "zero max", cfg: Config{}, wantErr: true},
		{name: "negative min", cfg: Config{MinInterval: -1, MaxInterval: time.Second}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg, fn)
			if (err != nil) != tc.wantErr {
				t.Fatalf("New: err = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && r == nil {
				t.Fatal("New returned neither a runner nor an error")
			}
		})
	}
	if _, err := New(defaultConfig(), nil); err == nil {
		t.Error("New accepted a nil function")
	}
}

func TestFnReceivesLoopContext(t *testing.T) {
	type ctxKey struct{}
	got := make(chan any, 1)
	r, err := newWithClock(defaultConfig(), func(ctx context.Context) error {
		got <- ctx.Value(ctxKey{})
		return nil
	}, testingclock.NewFakeClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	defer cancel()
	go func() { _ = r.Loop(ctx) }()
	r.Run()
	select {
	case v := <-got:
		if v != "v" {
			t.Errorf("fn saw context value %v, want v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fn was not called")
	}
}

func TestRunAfterWakesTheLoopWithoutARequest(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.duringRun(func() {
		h.r.RunAfter(3 * retryI) // from fn, as the sync loop schedules a Service's retry
		h.r.RunAfter(5 * retryI) // a later time does not postpone the earlier one
	}, outcome{})
	h.waitOutMinInterval()
	h.expectRunAfter(3*retryI-minI, outcome{})

	// The run consumed the request: the next unrequested run is MaxInterval away.
	h.waitOutMinInterval()
	h.clock.Step(5 * retryI)
	h.expectNoRun()
	h.clock.Step(maxI - minI - 5*retryI)
	h.expectRun(outcome{})
}

func TestRunAfterFromAnotherGoroutineShortensTheWait(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.waitForTimers(1) // waiting for MaxInterval
	h.r.RunAfter(retryI)
	// Times are absolute: whether the loop re-arms its timer before or after the steps
	// below, it runs fn when retryI has passed, and not before.
	h.expectRunAfter(retryI, outcome{})
}

func TestRunAfterRespectsMinInterval(t *testing.T) {
	h := newHarness(t, defaultConfig())
	h.start()
	h.r.Run()
	h.duringRun(func() { h.r.RunAfter(0) }, outcome{})
	h.waitForTimers(2)
	h.expectNoRun()
	h.clock.Step(minI)
	h.expectRun(outcome{})
}

// TestStopLetsTheRunInProgressFinish: cancelling the loop's context while fn runs does not
// cancel fn's context within StopGrace, and Loop returns only once fn has returned.
func TestStopLetsTheRunInProgressFinish(t *testing.T) {
	for _, tc := range []struct {
		name       string
		grace      time.Duration
		step       time.Duration
		wantCancel bool
	}{
		{name: "finishes within the grace period", grace: 20 * time.Second, step: 19 * time.Second},
		{name: "cancelled once the grace period is over", grace: 20 * time.Second, step: 20 * time.Second, wantCancel: true},
		{name: "no grace period", grace: 0, wantCancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := testingclock.NewFakeClock(t0)
			started, release := make(chan context.Context), make(chan struct{})
			cfg := defaultConfig()
			cfg.StopGrace = tc.grace
			r, err := newWithClock(cfg, func(ctx context.Context) error {
				started <- ctx
				select {
				case <-release:
				case <-ctx.Done():
				}
				return ctx.Err()
			}, fc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Loop(ctx) }()
			r.Run()
			runCtx := <-started
			cancel()
			if tc.grace > 0 {
				// The grace timer is armed once the cancellation was noticed.
				for i := 0; !fc.HasWaiters() && i < 5000; i++ {
					time.Sleep(time.Millisecond)
				}
				fc.Step(tc.step)
			}
			select {
			case <-runCtx.Done():
				if !tc.wantCancel {
					t.Fatal("the run's context was cancelled within the grace period")
				}
			case <-time.After(50 * time.Millisecond):
				if tc.wantCancel {
					t.Fatal("the run's context was not cancelled")
				}
			}
			asynctest.StoppedDuringWork(t, "Loop", "run", done, 20*time.Millisecond, tc.wantCancel, func() { close(release) })
			// Nothing runs after the stop.
			select {
			case <-started:
				t.Fatal("a run started after the loop's context ended")
			default:
			}
		})
	}
}
