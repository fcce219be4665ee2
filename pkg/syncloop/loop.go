// Package syncloop is the one goroutine that writes the dataplane. It drains the model's
// change tracker, hands each IP family's desired state to that family's backend, and does
// the bookkeeping around every sync: health, metrics, Events, stale conntrack entries and
// the per-Service health check servers.
//
// Timing comes from a bounded-frequency runner (pkg/runner): a burst of changes becomes
// one sync, at least minSyncPeriod separates two syncs, a failed sync is retried after
// syncPeriod, and a sync runs at least every maxInterval even when nothing changed.
//
// A Service the kernel rejects (dataplane.Result.Failed) keeps its last good programming
// (the backends' rule, see pkg/dataplane) and is retried on its own schedule: syncPeriod
// after the failure, then twice as long after each further failure, up to
// MaxRetryBackoff. The loop asks the runner to wake up for it (runner.RunAfter), so the
// retry does not wait for another change or for the mode's maxInterval. Syncs in between
// leave it alone (the tracker holds it back, see model.Tracker.Hold): a Service the kernel
// keeps rejecting would otherwise cost every sync a rejected write, a log line and an
// Event, and in iptables mode a rejected restore holds the xtables lock. A change to the
// Service's own objects retries it at once: the change may be the fix.
//
// On stop (the context ends), a sync in progress finishes: it has ShutdownGrace to do so
// (20 s by default, within the DaemonSet's terminationGracePeriodSeconds of 30 s), so that
// SIGTERM never leaves the kernel half written. Nothing is removed on stop.
package syncloop

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/runner"
)

// Tracker is the part of the model's change tracker the loop drives (*model.Tracker).
type Tracker interface {
	Synced() bool
	Pending() model.PendingChanges
	Drain() (map[model.IPFamily]*model.NodeState, map[model.IPFamily]model.Changes, model.DrainInfo)
	Applied(family model.IPFamily, failed sets.Set[types.NamespacedName])
	Failed(family model.IPFamily)
	Hold(family model.IPFamily, names ...types.NamespacedName)
	Retry(names ...types.NamespacedName)
}

// ProxyHealth is told when updates are queued and applied (*health.ProxyHealthServer).
type ProxyHealth interface {
	QueuedUpdate(model.IPFamily)
	Updated(model.IPFamily)
}

// ServiceHealth serves healthCheckNodePorts for one family (*health.ServiceHealthServer).
type ServiceHealth interface {
	SyncServices(map[types.NamespacedName]int32)
	SyncEndpoints(map[types.NamespacedName]int)
}

// Reporter turns failures and bad input into Events (*events.Reporter).
type Reporter interface {
	ServiceFailed(name types.NamespacedName, family model.IPFamily, err error) bool
	ServiceProblems(name types.NamespacedName, problems []model.Problem) bool
	Forget(name types.NamespacedName)
}

// Conntrack removes one family's conntrack entries that the new rules made stale
// (*conntrack.Reconciler). It considers the Services in changes, or all when changes.Full.
type Conntrack interface {
	Reconcile(ctx context.Context, state *model.NodeState, changes model.Changes) (int, error)
}

// Config wires a Loop.
type Config struct {
	Tracker  Tracker
	Backends []dataplane.Backend
	// MinSyncPeriod, SyncPeriod (the retry interval) and MaxSyncInterval as in
	// config.Effective.
	MinSyncPeriod, SyncPeriod, MaxSyncInterval time.Duration

	// Optional collaborators.
	Health        ProxyHealth
	ServiceHealth map[model.IPFamily]ServiceHealth
	Reporter      Reporter
	Conntrack     map[model.IPFamily]Conntrack
	// LocalHealthyEndpoints and HealthCheckNodePorts compute the per-Service health input
	// from a state (pkg/health.LocalReadyEndpoints and HealthCheckNodePorts).
	LocalHealthyEndpoints func(*model.NodeState) map[types.NamespacedName]int
	HealthCheckNodePorts  func(*model.NodeState) map[types.NamespacedName]int32

	// MaxRetryBackoff caps the wait before retrying a Service that keeps failing
	// (DefaultMaxRetryBackoff when zero; never below SyncPeriod).
	MaxRetryBackoff time.Duration
	// ShutdownGrace is how long a sync in progress when Run's context ends may go on
	// (DefaultShutdownGrace when zero; negative: none, the sync is cancelled at once).
	ShutdownGrace time.Duration

	Clock clock.Clock
}

const (
	// DefaultMaxRetryBackoff caps a failing Service's retry backoff: an operator who
	// fixed the cause (loaded a kernel module, stopped another writer) waits at most this
	// long for the Service to be programmed.
	DefaultMaxRetryBackoff = 5 * time.Minute
	// DefaultShutdownGrace bounds how long a sync in progress at SIGTERM may go on. The
	// DaemonSet gives the pod 30 s (terminationGracePeriodSeconds) before the kubelet
	// kills it; 20 s leaves the rest for the process to exit and flush its logs.
	DefaultShutdownGrace = 20 * time.Second
)

// failureReasons are the reason label values of sluice_sync_failures_total.
var failureReasons = []string{"backend", "service", "panic", "conntrack"}

// Loop is the sync loop. Create it with New, start it with Run.
type Loop struct {
	cfg    Config
	clock  clock.Clock
	runner *runner.BoundedFrequencyRunner

	// mu guards status and retries, read by the debug endpoint from other goroutines.
	// Only the sync goroutine writes them.
	mu     sync.Mutex
	status map[model.IPFamily]*FamilyStatus
	// retries are, per family, the Services that failed and wait for their retry.
	retries map[model.IPFamily]map[types.NamespacedName]*retryState
}

// retryState is one failing Service's retry schedule.
type retryState struct {
	// attempts counts the failed attempts since the Service was last programmed.
	attempts int
	// next is when it is retried (unless its objects change before).
	next time.Time
	err  error
}

// FamilyStatus is what the last syncs of one family achieved (for `sluice status` and the
// debug endpoint).
type FamilyStatus struct {
	Family           string    `json:"family"`
	Mode             string    `json:"mode"`
	LastSync         time.Time `json:"lastSync,omitzero"`
	LastSuccess      time.Time `json:"lastSuccess,omitzero"`
	LastFullSync     time.Time `json:"lastFullSync,omitzero"`
	LastSyncDuration float64   `json:"lastSyncSeconds"`
	LastError        string    `json:"lastError,omitempty"`
	// Failed maps "namespace/name" to why the Service could not be programmed. Until it
	// is, it keeps its last good programming.
	Failed map[string]string `json:"failed,omitempty"`
	// NextRetry maps the same Services to when they are retried next.
	NextRetry map[string]time.Time `json:"nextRetry,omitempty"`
	Syncs     int                  `json:"syncs"`
}

// New checks cfg and builds the loop.
func New(cfg Config) (*Loop, error) {
	if cfg.Tracker == nil || len(cfg.Backends) == 0 {
		return nil, errors.New("syncloop: a tracker and at least one backend are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.MaxRetryBackoff == 0 {
		cfg.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	grace := cfg.ShutdownGrace
	switch {
	case grace == 0:
		grace = DefaultShutdownGrace
	case grace < 0:
		grace = 0
	}
	l := &Loop{cfg: cfg, clock: cfg.Clock, status: map[model.IPFamily]*FamilyStatus{},
		retries: map[model.IPFamily]map[types.NamespacedName]*retryState{}}
	metrics.SyncFailuresTotal.WithLabelValues("all", string(cfg.Backends[0].Mode()), "panic")
	for _, b := range cfg.Backends {
		l.retries[b.Family()] = map[types.NamespacedName]*retryState{}
		l.status[b.Family()] = &FamilyStatus{Family: b.Family().String(), Mode: string(b.Mode()), Failed: map[string]string{}, NextRetry: map[string]time.Time{}}
		// Every failure series exists from the start, at 0: a labelled counter is absent
		// from /metrics until first incremented, and rate() or an alert on an absent
		// series sees nothing, so the first failure would go unnoticed.
		for _, reason := range failureReasons {
			metrics.SyncFailuresTotal.WithLabelValues(b.Family().String(), string(b.Mode()), reason)
		}
		for _, kind := range metrics.DriftKinds[string(b.Mode())] {
			metrics.DriftRepairsTotal.WithLabelValues(string(b.Mode()), b.Family().String(), kind)
		}
	}
	r, err := runner.NewWithClock(runner.Config{
		Name:          "sync-proxy-rules",
		MinInterval:   cfg.MinSyncPeriod,
		RetryInterval: cfg.SyncPeriod,
		MaxInterval:   cfg.MaxSyncInterval,
		Mode:          string(cfg.Backends[0].Mode()),
		IPFamily:      "all",
		StopGrace:     grace,
	}, l.sync, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("creating the sync runner: %w", err)
	}
	l.runner = r
	// A family counts as freshly updated at start, so health turns stale only when a
	// queued update then waits too long (upstream's proxiers do the same).
	if cfg.Health != nil {
		for _, b := range cfg.Backends {
			cfg.Health.Updated(b.Family())
		}
	}
	return l, nil
}

// Request asks for a sync soon. Non-blocking and safe from any goroutine: the tracker's
// Notify. Before the caches have synced it does nothing (the first sync is requested by
// whoever marks them synced).
func (l *Loop) Request() {
	if !l.cfg.Tracker.Synced() {
		return
	}
	now := l.clock.Now()
	for _, b := range l.cfg.Backends {
		if l.cfg.Health != nil {
			l.cfg.Health.QueuedUpdate(b.Family())
		}
		metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(b.Family().String()).Set(float64(now.Unix()))
	}
	pending := l.cfg.Tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(pending.Services))
	metrics.EndpointChangesPending.Set(float64(pending.EndpointSlices))
	l.runner.Run()
}

// Run runs syncs until ctx ends. Only this goroutine ever calls a backend.
func (l *Loop) Run(ctx context.Context) error {
	return l.runner.Loop(ctx)
}

// Status returns a copy of every family's status.
func (l *Loop) Status() []FamilyStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]FamilyStatus, 0, len(l.cfg.Backends))
	for _, b := range l.cfg.Backends {
		s := *l.status[b.Family()]
		s.Failed = make(map[string]string, len(l.retries[b.Family()]))
		s.NextRetry = make(map[string]time.Time, len(l.retries[b.Family()]))
		for name, r := range l.retries[b.Family()] {
			s.Failed[name.String()] = r.err.Error()
			s.NextRetry[name.String()] = r.next
		}
		out = append(out, s)
	}
	return out
}

// sync is the runner's function: one pass over every family.
func (l *Loop) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if !l.cfg.Tracker.Synced() {
		logger.V(2).Info("Not syncing until Services and EndpointSlices have been received")
		return nil
	}
	l.releaseDueRetries(l.clock.Now())
	states, changes, info := l.cfg.Tracker.Drain()
	metrics.ServiceChangesTotal.Add(float64(info.ServiceEvents))
	metrics.EndpointChangesTotal.Add(float64(info.EndpointSliceEvents))
	pending := l.cfg.Tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(pending.Services))
	metrics.EndpointChangesPending.Set(float64(pending.EndpointSlices))
	l.reportProblems(logger, info.Problems)
	l.reportComputeFailures(logger, info.ComputeFailed)

	var errs []error
	for _, b := range l.cfg.Backends {
		family := b.Family()
		state, ok := states[family]
		if !ok {
			continue
		}
		if err := l.syncFamily(ctx, b, state, changes[family], info); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", family, err))
		}
	}
	l.scheduleRetries(len(info.ComputeFailed) > 0)
	return errors.Join(errs...)
}

// releaseDueRetries lets the tracker report again the failed Services whose retry is due.
func (l *Loop) releaseDueRetries(now time.Time) {
	var due []types.NamespacedName
	seen := sets.New[types.NamespacedName]()
	for _, b := range l.cfg.Backends {
		for name, r := range l.retries[b.Family()] {
			if !r.next.After(now) && !seen.Has(name) {
				seen.Insert(name)
				due = append(due, name)
			}
		}
	}
	if len(due) > 0 {
		l.cfg.Tracker.Retry(due...)
	}
}

// scheduleRetries asks the runner to wake up for the earliest retry, or after syncPeriod
// when a Service's computation failed (the tracker computes it again at the next sync).
func (l *Loop) scheduleRetries(computeFailed bool) {
	var earliest time.Time
	for _, b := range l.cfg.Backends {
		for _, r := range l.retries[b.Family()] {
			if earliest.IsZero() || r.next.Before(earliest) {
				earliest = r.next
			}
		}
	}
	now := l.clock.Now()
	if computeFailed && (earliest.IsZero() || earliest.After(now.Add(l.retryInterval()))) {
		earliest = now.Add(l.retryInterval())
	}
	if !earliest.IsZero() {
		l.runner.RunAfter(earliest.Sub(now))
	}
}

// retryInterval is the first retry's delay: syncPeriod, the runner's retry interval.
func (l *Loop) retryInterval() time.Duration {
	if l.cfg.SyncPeriod > 0 {
		return l.cfg.SyncPeriod
	}
	return l.cfg.MaxSyncInterval
}

// backoff is how long a Service that failed attempts times in a row waits for its next
// retry: the retry interval, doubled after every further failure, capped.
func (l *Loop) backoff(attempts int) time.Duration {
	d := l.retryInterval()
	limit := max(l.cfg.MaxRetryBackoff, d)
	for i := 1; i < attempts && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// syncFamily applies one family's state and records the outcome. A returned error makes
// the runner retry after syncPeriod.
func (l *Loop) syncFamily(ctx context.Context, b dataplane.Backend, state *model.NodeState, ch model.Changes, info model.DrainInfo) error {
	family := b.Family()
	fam := family.String()
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", fam)
	start := l.clock.Now()
	logger.V(2).Info("Syncing proxy rules", "full", ch.Full, "changedServices", ch.Services.Len(), "servicePorts", len(state.Services))

	res := l.apply(ctx, b, state, ch)
	elapsed := l.clock.Since(start)
	now := l.clock.Now()

	l.mu.Lock()
	st := l.status[family]
	st.LastSync, st.LastSyncDuration = now, elapsed.Seconds()
	st.Syncs++
	l.mu.Unlock()

	if res.Err != nil {
		l.cfg.Tracker.Failed(family)
		metrics.SyncFailuresTotal.WithLabelValues(fam, string(b.Mode()), "backend").Inc()
		logger.Error(res.Err, "Sync failed; retrying with a full sync", "elapsed", elapsed.Seconds())
		l.mu.Lock()
		st.LastError = res.Err.Error()
		l.mu.Unlock()
		return res.Err
	}

	failed := sets.KeySet(res.Failed)
	l.cfg.Tracker.Applied(family, failed)
	if len(failed) > 0 {
		// Until their retry, syncs keep their last good version (the state now carries
		// it, for the health and conntrack bookkeeping below too).
		l.cfg.Tracker.Hold(family, failed.UnsortedList()...)
		metrics.SyncFailuresTotal.WithLabelValues(fam, string(b.Mode()), "service").Inc()
	}
	failing := l.recordServiceOutcomes(logger, family, ch, res.Failed, now)
	metrics.ServicesFailed.WithLabelValues(fam).Set(float64(failing))
	metrics.ServicePortsDesired.WithLabelValues(fam).Set(float64(len(state.Services)))

	// Latency metrics, like upstream's: every sync, then full or partial.
	metrics.SyncProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	if res.Full || ch.Full {
		metrics.SyncFullProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	} else {
		metrics.SyncPartialProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	}
	metrics.SyncProxyRulesLastTimestamp.WithLabelValues(fam).Set(float64(now.Unix()))
	for name, trigger := range info.TriggerTimes {
		if !failed.Has(name) && len(state.PortsOf(name)) > 0 {
			metrics.NetworkProgrammingLatency.WithLabelValues(fam).Observe(now.Sub(trigger).Seconds())
		}
	}
	l.countNoLocalEndpoints(state)

	l.mu.Lock()
	st.LastSuccess, st.LastError = now, ""
	if res.Full || ch.Full {
		st.LastFullSync = now
	}
	l.mu.Unlock()

	if l.cfg.Health != nil {
		l.cfg.Health.Updated(family)
	}
	if sh := l.cfg.ServiceHealth[family]; sh != nil {
		if l.cfg.HealthCheckNodePorts != nil {
			sh.SyncServices(l.cfg.HealthCheckNodePorts(state))
		}
		if l.cfg.LocalHealthyEndpoints != nil {
			sh.SyncEndpoints(l.cfg.LocalHealthyEndpoints(state))
		}
	}
	if ct := l.cfg.Conntrack[family]; ct != nil {
		applied := model.Changes{Full: ch.Full, Services: ch.Services.Difference(failed)}
		if _, err := ct.Reconcile(ctx, state, applied); err != nil {
			// The rules are right; stale entries only affect flows already established. Count
			// it and let the next sync (or the periodic full one) try again.
			metrics.SyncFailuresTotal.WithLabelValues(fam, string(b.Mode()), "conntrack").Inc()
			logger.Error(err, "Cleaning stale conntrack entries failed")
		}
	}
	logger.V(2).Info("Synced proxy rules", "elapsed", elapsed.Seconds(), "full", res.Full || ch.Full, "failedServices", len(failed))
	return nil
}

// recordServiceOutcomes updates the retry schedule of family's Services after an apply
// that did not fail as a whole: the Services in failed are reported and scheduled, the
// failing Services this apply programmed after all are forgotten. It returns how many
// Services of the family are failing.
func (l *Loop) recordServiceOutcomes(logger klog.Logger, family model.IPFamily, ch model.Changes, failed map[types.NamespacedName]error, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	retries := l.retries[family]
	for name, err := range failed {
		r := retries[name]
		if r == nil {
			r = &retryState{}
			retries[name] = r
		}
		r.attempts++
		r.err = err
		wait := l.backoff(r.attempts)
		r.next = now.Add(wait)
		logger.Error(err, "Service could not be programmed; it keeps its last good rules and will be retried",
			"service", klog.KRef(name.Namespace, name.Name), "attempt", r.attempts, "retryIn", wait.Seconds())
		if l.cfg.Reporter != nil {
			l.cfg.Reporter.ServiceFailed(name, family, err)
		}
	}
	// A failing Service is attempted again only when it is in the changes: held
	// Services are not, and a full apply programs their last good version.
	for name, r := range retries {
		if _, failedAgain := failed[name]; failedAgain || !ch.Services.Has(name) {
			continue
		}
		delete(retries, name)
		logger.Info("Service programmed after failing", "service", klog.KRef(name.Namespace, name.Name), "failedAttempts", r.attempts)
		if l.cfg.Reporter != nil {
			l.cfg.Reporter.Forget(name)
		}
	}
	return len(retries)
}

// reportComputeFailures logs, counts and reports Services whose computation panicked (a
// bug, with its stack). The tracker kept their previous state and computes them again at
// the next sync.
func (l *Loop) reportComputeFailures(logger klog.Logger, failed map[types.NamespacedName]error) {
	if len(failed) == 0 {
		return
	}
	mode := string(l.cfg.Backends[0].Mode())
	for name, err := range failed {
		metrics.SyncFailuresTotal.WithLabelValues("all", mode, "panic").Inc()
		logger.Error(err, "Computing a Service's rules panicked; it keeps its previous rules and is computed again at the next sync",
			"service", klog.KRef(name.Namespace, name.Name))
		if l.cfg.Reporter != nil {
			l.cfg.Reporter.ServiceFailed(name, l.cfg.Backends[0].Family(), fmt.Errorf("internal error computing the Service's rules (see sluice's log)"))
		}
	}
}

// apply calls the backend, turning a panic into a whole-sync failure of this family only.
func (l *Loop) apply(ctx context.Context, b dataplane.Backend, state *model.NodeState, ch model.Changes) (res dataplane.Result) {
	defer func() {
		if r := recover(); r != nil {
			metrics.SyncFailuresTotal.WithLabelValues(b.Family().String(), string(b.Mode()), "panic").Inc()
			klog.FromContext(ctx).Error(nil, "Backend panicked; the sync will be retried", "ipFamily", b.Family().String(), "panic", r, "stack", string(debug.Stack()))
			res = dataplane.Result{Err: fmt.Errorf("backend panicked: %v", r)}
		}
	}()
	return b.Apply(ctx, state, ch)
}

// reportProblems logs, counts and reports bad input found while draining.
func (l *Loop) reportProblems(logger klog.Logger, problems map[types.NamespacedName][]model.Problem) {
	for name, list := range problems {
		if len(list) == 0 {
			continue
		}
		for _, p := range list {
			kind, _, _ := strings.Cut(p.Object, " ")
			metrics.InputProblemsTotal.WithLabelValues(kind).Inc()
			logger.Info("Ignoring invalid field", "service", klog.KRef(name.Namespace, name.Name), "object", p.Object, "field", p.Field, "reason", p.Message)
		}
		if l.cfg.Reporter != nil {
			l.cfg.Reporter.ServiceProblems(name, list)
		}
	}
}

// countNoLocalEndpoints sets kubeproxy_sync_proxy_rules_no_local_endpoints_total: Service
// ports with a Local policy whose traffic under that policy has nowhere to go on this node
// although endpoints exist elsewhere (so it is dropped). Counted per Service port, as
// upstream counts.
func (l *Loop) countNoLocalEndpoints(state *model.NodeState) {
	var internal, external int
	for _, sp := range state.Services {
		if len(sp.LocalEndpoints) > 0 || !sp.HasAnyEndpoints {
			continue
		}
		if sp.InternalPolicyLocal {
			internal++
		}
		if sp.ExternalPolicyLocal {
			external++
		}
	}
	fam := state.Family.String()
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("internal", fam).Set(float64(internal))
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("external", fam).Set(float64(external))
}
