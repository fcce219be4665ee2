// Package syncloop is the one goroutine that writes the dataplane. It drains the model's
// change tracker, hands each IP family's desired state to that family's backend, and does
// the bookkeeping around every sync: health, metrics, Events, stale conntrack entries and
// the per-Service health check servers.
//
// Timing comes from a bounded-frequency runner (pkg/runner): a burst of changes becomes
// one sync, at least minSyncPeriod separates two syncs, a failed sync is retried after
// syncPeriod, and a sync runs at least every maxInterval even when nothing changed.
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

	Clock clock.Clock
}

// failureReasons are the reason label values of sluice_sync_failures_total.
var failureReasons = []string{"backend", "service", "panic", "conntrack"}

// Loop is the sync loop. Create it with New, start it with Run.
type Loop struct {
	cfg    Config
	clock  clock.Clock
	runner *runner.BoundedFrequencyRunner

	// mu guards status, read by the debug endpoint from other goroutines.
	mu     sync.Mutex
	status map[model.IPFamily]*FamilyStatus
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
	// Failed maps "namespace/name" to why the Service could not be programmed.
	Failed map[string]string `json:"failed,omitempty"`
	Syncs  int               `json:"syncs"`
}

// New checks cfg and builds the loop.
func New(cfg Config) (*Loop, error) {
	if cfg.Tracker == nil || len(cfg.Backends) == 0 {
		return nil, errors.New("syncloop: a tracker and at least one backend are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	l := &Loop{cfg: cfg, clock: cfg.Clock, status: map[model.IPFamily]*FamilyStatus{}}
	for _, b := range cfg.Backends {
		l.status[b.Family()] = &FamilyStatus{Family: b.Family().String(), Mode: string(b.Mode()), Failed: map[string]string{}}
		// Every failure series exists from the start, at 0: a labelled counter is absent
		// from /metrics until first incremented, and rate() or an alert on an absent
		// series sees nothing, so the first failure would go unnoticed.
		for _, reason := range failureReasons {
			metrics.SyncFailuresTotal.WithLabelValues(b.Family().String(), string(b.Mode()), reason)
		}
	}
	r, err := runner.NewWithClock(runner.Config{
		Name:          "sync-proxy-rules",
		MinInterval:   cfg.MinSyncPeriod,
		RetryInterval: cfg.SyncPeriod,
		MaxInterval:   cfg.MaxSyncInterval,
		Mode:          string(cfg.Backends[0].Mode()),
		IPFamily:      "all",
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
		s.Failed = make(map[string]string, len(l.status[b.Family()].Failed))
		for k, v := range l.status[b.Family()].Failed {
			s.Failed[k] = v
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
	states, changes, info := l.cfg.Tracker.Drain()
	metrics.ServiceChangesTotal.Add(float64(info.ServiceEvents))
	metrics.EndpointChangesTotal.Add(float64(info.EndpointSliceEvents))
	pending := l.cfg.Tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(pending.Services))
	metrics.EndpointChangesPending.Set(float64(pending.EndpointSlices))
	l.reportProblems(logger, info.Problems)

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
	return errors.Join(errs...)
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

	failed := sets.New[types.NamespacedName]()
	for name, err := range res.Failed {
		failed.Insert(name)
		logger.Error(err, "Service could not be programmed; other Services were", "service", name)
		if l.cfg.Reporter != nil {
			l.cfg.Reporter.ServiceFailed(name, family, err)
		}
	}
	l.cfg.Tracker.Applied(family, failed)
	if len(failed) > 0 {
		metrics.SyncFailuresTotal.WithLabelValues(fam, string(b.Mode()), "service").Inc()
	}
	metrics.ServicesFailed.WithLabelValues(fam).Set(float64(len(failed)))
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
	// Failed Services stay listed until an apply that covers them succeeds.
	for name := range ch.Services {
		if !failed.Has(name) {
			if _, was := st.Failed[name.String()]; was && l.cfg.Reporter != nil {
				l.cfg.Reporter.Forget(name)
			}
			delete(st.Failed, name.String())
		}
	}
	if ch.Full {
		for k := range st.Failed {
			delete(st.Failed, k)
		}
	}
	for name, err := range res.Failed {
		st.Failed[name.String()] = err.Error()
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
			logger.Info("Ignoring invalid field", "service", name, "object", p.Object, "field", p.Field, "reason", p.Message)
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
