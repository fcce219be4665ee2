// Package runner provides BoundedFrequencyRunner, the loop that runs a sync function on
// request, but never more often than a minimum interval, and at least once per maximum
// interval, retrying sooner after a failure.
//
// It follows the semantics of upstream kube-proxy's BoundedFrequencyRunner, with two
// deliberate differences: the constructor returns an error instead of panicking when the
// intervals make no sense, and a panic inside the sync function is recovered, logged with
// its stack, counted and retried like a failed run, instead of crashing the process.
//
// The timing, in short:
//
//	Run() ──► pending (at most one) ─┐
//	                                 ├─► fn ─► wait MinInterval ─► wait for the next trigger
//	next-run timer fires ────────────┘
//	next-run timer = MaxInterval after a success, min(RetryInterval, MaxInterval) after a failure,
//	                 or sooner when RunAfter asked for a run by an earlier time
//
// Stopping: when the Loop's context ends while fn runs, fn's own context stays valid for
// up to StopGrace more, so that a sync in progress can finish writing the kernel instead
// of being cut off half way; Loop returns once fn has returned.
package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// Config describes one BoundedFrequencyRunner.
type Config struct {
	// Name identifies the runner in logs, e.g. "sync-IPv4".
	Name string

	// MinInterval is the least time between the end of one run and the start of the next.
	// Requests made sooner are held until it has passed (and collapse into one run).
	MinInterval time.Duration
	// RetryInterval is how soon after a failed run the next one starts, if nothing asks
	// for one earlier. It is capped at MaxInterval. Zero or negative means MaxInterval.
	RetryInterval time.Duration
	// MaxInterval is the most time between two runs: the loop runs fn this long after the
	// previous run even if nobody asked. It must be at least MinInterval.
	MaxInterval time.Duration

	// IPFamily and Mode label sluice_sync_failures_total{reason="panic"}, which is
	// incremented when fn panics. When both are empty the metric is not touched.
	IPFamily string
	Mode     string
	// OnPanic, if set, is called from the loop goroutine after a panic in fn was
	// recovered, with the panic value and the goroutine's stack.
	OnPanic func(recovered any, stack []byte)

	// StopGrace is how long a run in progress when the Loop's context ends may go on:
	// fn's context is cancelled only StopGrace after the Loop's. Zero cancels it at once.
	StopGrace time.Duration
}

// ErrPanicked is wrapped by the error the loop records for a run whose fn panicked.
var ErrPanicked = errors.New("sync function panicked")

// BoundedFrequencyRunner runs one function from one goroutine (its Loop), at the pace
// described by its Config. Run may be called from any goroutine at any time.
type BoundedFrequencyRunner struct {
	cfg   Config
	fn    func(ctx context.Context) error
	clock clock.Clock

	// pending holds at most one token: a request for a run that the loop has not started
	// yet. Sending is non-blocking, so a burst of requests collapses into one run.
	pending chan struct{}
	// looping guards the promise that only one goroutine ever calls fn.
	looping atomic.Bool

	// wakeMu guards wakeAt: the time by which RunAfter asked for a run (zero: none). A run
	// that starts consumes it. rearm tells a waiting loop that wakeAt moved earlier.
	wakeMu sync.Mutex
	wakeAt time.Time
	rearm  chan struct{}
}

// New returns a runner that calls fn as cfg describes, once Loop is running. It fails when
// the intervals are inconsistent (MaxInterval < MinInterval, or negative values).
func New(cfg Config, fn func(ctx context.Context) error) (*BoundedFrequencyRunner, error) {
	return newWithClock(cfg, fn, clock.RealClock{})
}

// NewWithClock is New with an injected clock, for tests of the runner's callers.
func NewWithClock(cfg Config, fn func(ctx context.Context) error, c clock.Clock) (*BoundedFrequencyRunner, error) {
	return newWithClock(cfg, fn, c)
}

// newWithClock is New with an injected clock, for tests.
func newWithClock(cfg Config, fn func(ctx context.Context) error, c clock.Clock) (*BoundedFrequencyRunner, error) {
	if fn == nil {
		return nil, fmt.Errorf("runner %q: nil function", cfg.Name)
	}
	if cfg.MinInterval < 0 {
		return nil, fmt.Errorf("runner %q: minInterval (%v) must not be negative", cfg.Name, cfg.MinInterval)
	}
	if cfg.MaxInterval <= 0 {
		return nil, fmt.Errorf("runner %q: maxInterval (%v) must be positive", cfg.Name, cfg.MaxInterval)
	}
	if cfg.MaxInterval < cfg.MinInterval {
		return nil, fmt.Errorf("runner %q: maxInterval (%v) must be >= minInterval (%v)", cfg.Name, cfg.MaxInterval, cfg.MinInterval)
	}
	return &BoundedFrequencyRunner{
		cfg:     cfg,
		fn:      fn,
		clock:   c,
		pending: make(chan struct{}, 1),
		rearm:   make(chan struct{}, 1),
	}, nil
}

// Run asks for a run as soon as MinInterval allows. It never blocks: if a run is already
// pending, the request merges with it. Calling Run while no Loop is running is allowed;
// the request waits for the next Loop.
func (r *BoundedFrequencyRunner) Run() {
	select {
	case r.pending <- struct{}{}:
	default:
	}
}

// RunAfter asks for a run at most d from now, even if nobody calls Run before: a retry
// the caller schedules itself (the sync loop's per-Service backoff). MinInterval still
// applies. It never blocks and may be called from any goroutine, fn included. The earliest
// time asked for wins, and the next run to start, whatever triggered it, consumes the
// request: fn calls RunAfter again if it still needs a later run.
func (r *BoundedFrequencyRunner) RunAfter(d time.Duration) {
	at := r.clock.Now().Add(max(d, 0))
	r.wakeMu.Lock()
	earlier := r.wakeAt.IsZero() || at.Before(r.wakeAt)
	if earlier {
		r.wakeAt = at
	}
	r.wakeMu.Unlock()
	if earlier {
		select {
		case r.rearm <- struct{}{}:
		default:
		}
	}
}

// takeWake returns and clears the time RunAfter asked for.
func (r *BoundedFrequencyRunner) takeWake() time.Time {
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	at := r.wakeAt
	r.wakeAt = time.Time{}
	return at
}

// untilNext is how long to wait from now until the next unrequested run: until deadline,
// or the time RunAfter asked for if that is earlier.
func (r *BoundedFrequencyRunner) untilNext(deadline time.Time) time.Duration {
	r.wakeMu.Lock()
	at := r.wakeAt
	r.wakeMu.Unlock()
	if !at.IsZero() && at.Before(deadline) {
		deadline = at
	}
	return max(deadline.Sub(r.clock.Now()), 0)
}

// retryAfter is how long the loop waits after a failed run.
func (r *BoundedFrequencyRunner) retryAfter() time.Duration {
	if r.cfg.RetryInterval <= 0 || r.cfg.RetryInterval > r.cfg.MaxInterval {
		return r.cfg.MaxInterval
	}
	return r.cfg.RetryInterval
}

// Loop calls fn whenever Run asked for it or the next-run timer (MaxInterval, the retry
// interval after a failure, or the time RunAfter asked for) fired, until ctx is cancelled.
// It returns nil when ctx ends (after a run in progress returned, see StopGrace), and an
// error at once if another Loop of the same runner is running: only one goroutine may ever
// call fn.
func (r *BoundedFrequencyRunner) Loop(ctx context.Context) error {
	if !r.looping.CompareAndSwap(false, true) {
		return fmt.Errorf("runner %q: Loop is already running", r.cfg.Name)
	}
	defer r.looping.Store(false)

	logger := klog.FromContext(ctx).WithValues("runner", r.cfg.Name)
	logger.V(3).Info("Runner loop starting")
	defer logger.V(3).Info("Runner loop stopped")

	// deadline is when the next unrequested run is due (MaxInterval, or the retry
	// interval after a failure); RunAfter may ask for an earlier one.
	deadline := r.clock.Now().Add(r.cfg.MaxInterval)
	nextRun := r.clock.NewTimer(r.untilNext(deadline))
	defer nextRun.Stop()
	var minWait clock.Timer
	if r.cfg.MinInterval > 0 {
		minWait = r.clock.NewTimer(r.cfg.MinInterval)
		stopAndDrain(minWait)
		defer minWait.Stop()
	}

	for {
		if ctx.Err() != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.rearm:
			// RunAfter asked for an earlier run: wait until then instead, or run now if
			// that time has come.
			stopAndDrain(nextRun)
			if d := r.untilNext(deadline); d > 0 {
				nextRun.Reset(d)
				continue
			}
		case <-r.pending:
		case <-nextRun.C():
		}
		if ctx.Err() != nil {
			return nil // a request raced with the cancellation: start nothing new
		}
		// No timer runs while fn does: the next-run interval counts from the end of this
		// run. (It also lets tests with a fake clock see that the loop is busy.)
		stopAndDrain(nextRun)
		r.takeWake()

		err := r.runOnce(ctx, logger)

		next := r.cfg.MaxInterval
		if err != nil {
			next = r.retryAfter()
			// The error is fn's to report (the sync loop logs it with logger.Error); here only
			// the schedule.
			logger.V(2).Info("Run failed, scheduling a retry", "retryIn", next.Seconds())
		}
		deadline = r.clock.Now().Add(next)
		nextRun.Reset(r.untilNext(deadline))

		if minWait == nil {
			continue
		}
		// Hold off any request until MinInterval has passed since the end of the run.
		minWait.Reset(r.cfg.MinInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-minWait.C():
		}
	}
}

// runOnce calls fn, turning a panic into an error after logging and counting it. fn's
// context outlives ctx by StopGrace.
func (r *BoundedFrequencyRunner) runOnce(ctx context.Context, logger klog.Logger) (err error) {
	runCtx := ctx
	if r.cfg.StopGrace > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		stopWatching := context.AfterFunc(ctx, func() { r.graceThenCancel(runCtx, cancel, logger) })
		defer stopWatching()
	}
	defer func() {
		recovered := recover()
		if recovered == nil {
			return
		}
		stack := debug.Stack()
		err = fmt.Errorf("%w: %v", ErrPanicked, recovered)
		logger.Error(err, "Recovered from a panic in the sync function; will retry", "stack", string(stack))
		if r.cfg.IPFamily != "" || r.cfg.Mode != "" {
			metrics.SyncFailuresTotal.WithLabelValues(r.cfg.IPFamily, r.cfg.Mode, "panic").Inc()
		}
		if r.cfg.OnPanic != nil {
			r.cfg.OnPanic(recovered, stack)
		}
	}()
	return r.fn(runCtx)
}

// graceThenCancel runs when the Loop's context ends during a run: it lets the run go on
// for StopGrace, then cancels it.
func (r *BoundedFrequencyRunner) graceThenCancel(runCtx context.Context, cancel context.CancelFunc, logger klog.Logger) {
	logger.Info("Stopping; letting the run in progress finish first", "grace", r.cfg.StopGrace.Seconds())
	t := r.clock.NewTimer(r.cfg.StopGrace)
	defer t.Stop()
	select {
	case <-runCtx.Done():
	case <-t.C():
		logger.Error(nil, "The run in progress did not finish within the stop grace period; cancelling it", "grace", r.cfg.StopGrace.Seconds())
		cancel()
	}
}

// stopAndDrain stops t and discards a value it may already have delivered, so that a
// later Reset starts clean. (Real timers no longer deliver stale values since Go 1.23,
// but the fake clock's timers do.)
func stopAndDrain(t clock.Timer) {
	if !t.Stop() {
		select {
		case <-t.C():
		default:
		}
	}
}
