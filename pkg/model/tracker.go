package model

import (
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Source reads the current API objects for the Tracker when it drains. The watch layer
// implements it over its informer stores; every method must be safe for concurrent use
// with the informers' updates, and must return objects the caller will not modify.
type Source interface {
	// Service returns the Service called name, false when there is none.
	Service(name types.NamespacedName) (*v1.Service, bool)
	// EndpointSlices returns the EndpointSlices of the Service called name: those in its
	// namespace labelled kubernetes.io/service-name=<name>, of every address type, in any
	// order.
	EndpointSlices(name types.NamespacedName) []*discoveryv1.EndpointSlice
}

// TrackerConfig configures NewTracker.
type TrackerConfig struct {
	// Source gives the current objects when the Tracker drains. Required.
	Source Source
	// Node is this node as first seen; OnNodeChange updates it.
	Node NodeInfo
	// ServiceCIDRs are the cluster's service ranges as first seen; OnServiceCIDRsChange
	// updates them.
	ServiceCIDRs []netip.Prefix
	// Options shape the computation; Options.Families are the families tracked.
	Options Options
	// StartTime is when this process started. Trigger times not after it are dropped:
	// objects listed at startup carry the times of changes made before sluice ran, and
	// counting them would report latencies sluice never caused (upstream does the same).
	StartTime time.Time
	// Notify, when set, is called after a handler recorded a change, with no lock held;
	// typically the sync runner's non-blocking Run. It must not block.
	Notify func()
}

// Tracker sits between the informer handlers and the sync loop. Handlers only record
// which Services are dirty (never a copy of an object); Drain, on the sync goroutine,
// reads the dirty Services' current objects from the Source, recomputes them, and reports
// what changed since each family's last successful apply.
//
// Failures: a Service the backend could not program is reported again by every Drain
// until an apply covers it (Applied), unless the sync loop holds it back (Hold) until its
// retry is due (Retry) or its own objects change. While held, the state carries the
// Service as it was last applied, so that any sync, full ones included, keeps programming
// its last good version (see Hold).
//
// Locking: handler-side methods (On*, Synced, Pending, Retry) take mu, for a few map
// operations at most. Drain takes mu only to swap out the dirty set, then stateMu for the
// recomputation; Applied, Failed and Hold take stateMu; Snapshot takes stateMu for
// reading. No method holds both locks, and no lock is held while calling Notify. Drain,
// Applied, Failed and Hold must be called from one goroutine at a time (the sync loop).
type Tracker struct {
	source    Source
	opts      Options
	startTime time.Time
	notify    func()
	// computeService is ComputeService; tests replace it to make it fail.
	computeService func(*v1.Service, []*discoveryv1.EndpointSlice, NodeInfo, IPFamily, Options) ([]*ServicePort, []Problem)
	// drainHook, when set by a test, runs inside Drain after the recomputation.
	drainHook func()

	// mu guards everything recorded by handlers since the last Drain.
	mu sync.Mutex
	// dirty holds the Services to recompute at the next Drain.
	dirty map[types.NamespacedName]dirtyMark
	// serviceEvents and sliceEvents count handler events since the last Drain;
	// dirtyByService counts the dirty entries with a Service event.
	serviceEvents, sliceEvents, dirtyByService int
	node                                       NodeInfo
	nodeChanged                                bool // any field of node changed
	recomputeAll                               bool // node name or zone changed
	serviceCIDRs                               []netip.Prefix
	serviceCIDRsChanged                        bool
	servicesSynced, slicesSynced               bool

	// stateMu guards the sync side. Only the sync goroutine writes; the lock is there for
	// Snapshot readers on other goroutines.
	stateMu sync.RWMutex
	states  map[IPFamily]*NodeState
	// progress is, per family, what differs from the last successful apply.
	progress map[IPFamily]*familyProgress
	// problems are the problems last reported in DrainInfo, merged over families.
	problems map[types.NamespacedName][]Problem
}

// dirtyMark is what a handler records about a Service.
type dirtyMark struct {
	// service is true when the Service object itself changed (for the pending gauge).
	service bool
	// trigger is the earliest endpoints.kubernetes.io/last-change-trigger-time seen.
	trigger time.Time
}

// familyProgress is what one family must still apply.
type familyProgress struct {
	// pending are the Services changed since the last successful apply (or whose apply
	// failed), except those held.
	pending sets.Set[types.NamespacedName]
	// needFull is set from the start until a successful apply, after a whole-sync failure
	// and when node-wide inputs changed.
	needFull bool
	// applied is set once an apply of this family succeeded: from then on, the state holds
	// what was applied for every Service neither pending nor held.
	applied bool
	// lastGood holds, for Services changed since an apply covered them, the ports that
	// apply programmed (nil: none, the Service was absent). A Service is missing when its
	// last good version is unknown (it failed before any apply succeeded).
	lastGood map[types.NamespacedName][]*ServicePort
	// held are the Services whose failed change waits for its retry (Hold).
	held sets.Set[types.NamespacedName]
}

// DrainInfo tells the sync loop what one Drain consumed, for metrics and events.
type DrainInfo struct {
	// ServiceEvents and EndpointSliceEvents count the handler events drained (for
	// kubeproxy_sync_proxy_rules_{service,endpoint}_changes_total).
	ServiceEvents       int
	EndpointSliceEvents int
	// Recomputed counts the Services recomputed.
	Recomputed int
	// TriggerTimes is, per drained Service, the earliest EndpointSlice
	// last-change-trigger-time recorded (for kubeproxy_network_programming_duration_seconds,
	// observed once the apply succeeded).
	TriggerTimes map[types.NamespacedName]time.Time
	// NodeChanged and ServiceCIDRsChanged report node-wide input changes; each makes
	// every family's Changes Full.
	NodeChanged         bool
	ServiceCIDRsChanged bool
	// Problems lists the Services whose problems changed, with their current problems
	// over all families (duplicates removed); an empty list means the problems are gone.
	Problems map[types.NamespacedName][]Problem
	// ComputeFailed lists the Services whose recomputation panicked (a bug, with the
	// panic and its stack in the error). Their state was left as it was, and they are
	// marked dirty again: the next Drain computes them again.
	ComputeFailed map[types.NamespacedName]error
}

// PendingChanges counts what handlers recorded since the last Drain (for the
// kubeproxy_sync_proxy_rules_{service,endpoint}_changes_pending gauges).
type PendingChanges struct {
	// Services counts Services with a pending Service event.
	Services int
	// EndpointSlices counts pending EndpointSlice events.
	EndpointSlices int
}

// NewTracker returns a tracker with empty states. Every family's first Changes are Full.
func NewTracker(cfg TrackerConfig) *Tracker {
	t := &Tracker{
		source:         cfg.Source,
		opts:           cfg.Options,
		startTime:      cfg.StartTime,
		notify:         cfg.Notify,
		computeService: ComputeService,
		dirty:          map[types.NamespacedName]dirtyMark{},
		node:           cloneNodeInfo(cfg.Node),
		serviceCIDRs:   slices.Clone(cfg.ServiceCIDRs),
		states:         map[IPFamily]*NodeState{},
		progress:       map[IPFamily]*familyProgress{},
		problems:       map[types.NamespacedName][]Problem{},
	}
	for _, f := range cfg.Options.families() {
		st := NewNodeState(f, t.node)
		st.ServiceCIDRs = serviceCIDRsOf(t.serviceCIDRs, f)
		t.states[f] = st
		t.progress[f] = &familyProgress{pending: sets.New[types.NamespacedName](), needFull: true,
			lastGood: map[types.NamespacedName][]*ServicePort{}, held: sets.New[types.NamespacedName]()}
	}
	return t
}

// OnServiceAdd records a new Service. Takes mu.
func (t *Tracker) OnServiceAdd(svc *v1.Service) { t.serviceEvent(svc) }

// OnServiceUpdate records a changed Service. A resync (same resourceVersion) is dropped
// here; other no-op updates are dropped by Drain. Takes mu.
func (t *Tracker) OnServiceUpdate(old, cur *v1.Service) {
	if old != nil && cur != nil && cur.ResourceVersion != "" && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	t.serviceEvent(cur)
}

// OnServiceDelete records a deleted Service. The watch layer unwraps
// cache.DeletedFinalStateUnknown before calling it. Takes mu.
func (t *Tracker) OnServiceDelete(svc *v1.Service) { t.serviceEvent(svc) }

func (t *Tracker) serviceEvent(svc *v1.Service) {
	if svc == nil {
		return
	}
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	m := t.dirty[name]
	if !m.service {
		m.service = true
		t.dirtyByService++
	}
	t.dirty[name] = m
	t.serviceEvents++
	t.mu.Unlock()
	t.notifyChange()
}

// OnEndpointSliceAdd records a new EndpointSlice. Slices without the
// kubernetes.io/service-name label, and slices of a family not tracked (or FQDN), are
// ignored. Takes mu.
func (t *Tracker) OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice) {
	t.sliceEvent(nil, slice)
}

// OnEndpointSliceUpdate records a changed EndpointSlice; both its old and its new Service
// become dirty when its service-name label changed. A resync (same resourceVersion) is
// dropped. Takes mu.
func (t *Tracker) OnEndpointSliceUpdate(old, cur *discoveryv1.EndpointSlice) {
	if old != nil && cur != nil && cur.ResourceVersion != "" && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	t.sliceEvent(old, cur)
}

// OnEndpointSliceDelete records a deleted EndpointSlice (the watch layer unwraps
// cache.DeletedFinalStateUnknown). Takes mu.
func (t *Tracker) OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice) {
	t.sliceEvent(slice, nil)
}

// sliceEvent marks the Services of old and cur dirty and records cur's trigger time when
// it is new (an update that keeps the annotation was not triggered by a new change).
func (t *Tracker) sliceEvent(old, cur *discoveryv1.EndpointSlice) {
	oldName, oldOK := t.sliceService(old)
	curName, curOK := t.sliceService(cur)
	if !oldOK && !curOK {
		return
	}
	var trigger time.Time
	if curOK {
		if v := cur.Annotations[v1.EndpointsLastChangeTriggerTime]; v != "" && (old == nil || old.Annotations[v1.EndpointsLastChangeTriggerTime] != v) {
			if ts, err := time.Parse(time.RFC3339Nano, v); err == nil && ts.After(t.startTime) {
				trigger = ts
			}
		}
	}
	t.mu.Lock()
	if oldOK && (!curOK || oldName != curName) {
		markDirty(t.dirty, oldName)
	}
	if curOK {
		m := t.dirty[curName]
		if !trigger.IsZero() && (m.trigger.IsZero() || trigger.Before(m.trigger)) {
			m.trigger = trigger
		}
		t.dirty[curName] = m
	}
	t.sliceEvents++
	t.mu.Unlock()
	t.notifyChange()
}

// sliceService returns the Service of slice when the tracker cares about the slice.
func (t *Tracker) sliceService(slice *discoveryv1.EndpointSlice) (types.NamespacedName, bool) {
	if slice == nil {
		return types.NamespacedName{}, false
	}
	tracked := false
	for _, f := range t.opts.families() {
		if slice.AddressType == addressTypeOf(f) {
			tracked = true
		}
	}
	if !tracked {
		return types.NamespacedName{}, false
	}
	return ServiceNameOf(slice)
}

// OnNodeChange records this node's current information. A change of name or zone makes
// the next Drain recompute every Service (endpoint locality and topology depend on them);
// any change makes every family's next Changes Full. Takes mu.
func (t *Tracker) OnNodeChange(node NodeInfo) {
	t.mu.Lock()
	if nodeInfoEqual(t.node, node) {
		t.mu.Unlock()
		return
	}
	if t.node.Name != node.Name || t.node.Zone != node.Zone {
		t.recomputeAll = true
	}
	t.node = cloneNodeInfo(node)
	t.nodeChanged = true
	t.mu.Unlock()
	t.notifyChange()
}

// OnServiceCIDRsChange records the cluster's current service ranges (all families); a
// change makes every family's next Changes Full. Takes mu.
func (t *Tracker) OnServiceCIDRsChange(cidrs []netip.Prefix) {
	t.mu.Lock()
	if slices.Equal(t.serviceCIDRs, cidrs) {
		t.mu.Unlock()
		return
	}
	t.serviceCIDRs = slices.Clone(cidrs)
	t.serviceCIDRsChanged = true
	t.mu.Unlock()
	t.notifyChange()
}

// OnServicesSynced records that the Service informer's cache is complete. Takes mu.
func (t *Tracker) OnServicesSynced() {
	t.mu.Lock()
	t.servicesSynced = true
	t.mu.Unlock()
	t.notifyChange()
}

// OnEndpointSlicesSynced records that the EndpointSlice informer's cache is complete.
// Takes mu.
func (t *Tracker) OnEndpointSlicesSynced() {
	t.mu.Lock()
	t.slicesSynced = true
	t.mu.Unlock()
	t.notifyChange()
}

// Synced reports whether both caches are complete. Until then a sync would program a
// partial view of the cluster and drop traffic to the Services not yet seen, so the sync
// loop must not apply anything. Takes mu.
func (t *Tracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.servicesSynced && t.slicesSynced
}

// Pending counts the changes recorded since the last Drain. Takes mu.
func (t *Tracker) Pending() PendingChanges {
	t.mu.Lock()
	defer t.mu.Unlock()
	return PendingChanges{Services: t.dirtyByService, EndpointSlices: t.sliceEvents}
}

// Retry marks Services dirty, as if their objects had changed, without notifying: the
// next Drain computes them again and reports them as changed in every family where they
// are held (see Hold). The sync loop calls it when their retry is due. Takes mu.
func (t *Tracker) Retry(names ...types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, name := range names {
		markDirty(t.dirty, name)
	}
}

func (t *Tracker) notifyChange() {
	if t.notify != nil {
		t.notify()
	}
}

// Drain recomputes the Services that handlers marked dirty and returns, per family, the
// tracker's current state and what changed since that family's last successful apply.
//
// The states are the tracker's own: valid until the next Drain, to be read only (Clone or
// Snapshot them to keep them longer). The ServicePorts in them are never modified, so a
// backend may keep those pointers across syncs. A Service whose recomputed ports equal the
// current ones (a resync, a change to a field the proxy ignores) is not reported.
//
// Call Applied or Failed for each family after applying its state. Sync goroutine only;
// takes mu briefly, then stateMu.
//
// A panic while recomputing one Service is recovered: that Service keeps its state, is
// reported in DrainInfo.ComputeFailed and stays dirty, and the others are recomputed. A
// panic anywhere else puts back everything this Drain took from the handlers' side
// before it goes on, so that the next Drain does the work again.
func (t *Tracker) Drain() (states map[IPFamily]*NodeState, changes map[IPFamily]Changes, info DrainInfo) {
	t.mu.Lock()
	dirty := t.dirty
	t.dirty = make(map[types.NamespacedName]dirtyMark)
	taken := drained{
		dirty: dirty, serviceEvents: t.serviceEvents, sliceEvents: t.sliceEvents, dirtyByService: t.dirtyByService,
		nodeChanged: t.nodeChanged, serviceCIDRsChanged: t.serviceCIDRsChanged, recomputeAll: t.recomputeAll,
	}
	info = DrainInfo{
		ServiceEvents:       t.serviceEvents,
		EndpointSliceEvents: t.sliceEvents,
		NodeChanged:         t.nodeChanged,
		ServiceCIDRsChanged: t.serviceCIDRsChanged,
	}
	node, cidrs, recomputeAll := t.node, t.serviceCIDRs, t.recomputeAll
	t.serviceEvents, t.sliceEvents, t.dirtyByService = 0, 0, 0
	t.nodeChanged, t.serviceCIDRsChanged, t.recomputeAll = false, false, false
	t.mu.Unlock()
	// Deferred before stateMu is taken, so that it runs after stateMu is released (no
	// method holds both locks).
	var redo map[types.NamespacedName]dirtyMark
	defer func() {
		if r := recover(); r != nil {
			t.putBack(taken)
			panic(r)
		}
		if len(redo) > 0 {
			t.putBack(drained{dirty: redo})
		}
	}()

	t.stateMu.Lock()
	defer t.stateMu.Unlock()

	for f, st := range t.states {
		if info.NodeChanged {
			st.Node = node
			t.progress[f].needFull = true
		}
		if info.ServiceCIDRsChanged {
			st.ServiceCIDRs = serviceCIDRsOf(cidrs, f)
			t.progress[f].needFull = true
		}
	}
	if recomputeAll {
		for _, st := range t.states {
			for name := range st.byService {
				markDirty(dirty, name)
			}
			for name := range st.Problems {
				markDirty(dirty, name)
			}
		}
	}

	for name, mark := range dirty {
		if err := t.recomputeSafely(name, node, &info); err != nil {
			if info.ComputeFailed == nil {
				info.ComputeFailed = map[types.NamespacedName]error{}
			}
			info.ComputeFailed[name] = err
			if redo == nil {
				redo = map[types.NamespacedName]dirtyMark{}
			}
			redo[name] = mark
			continue
		}
		if !mark.trigger.IsZero() {
			if info.TriggerTimes == nil {
				info.TriggerTimes = map[types.NamespacedName]time.Time{}
			}
			info.TriggerTimes[name] = mark.trigger
		}
	}
	info.Recomputed = len(dirty)
	if t.drainHook != nil {
		t.drainHook()
	}

	states = make(map[IPFamily]*NodeState, len(t.states))
	changes = make(map[IPFamily]Changes, len(t.states))
	for f, st := range t.states {
		p := t.progress[f]
		states[f] = st
		changes[f] = Changes{Full: p.needFull, Services: p.pending.Clone()}
	}
	return states, changes, info
}

// drained is what one Drain took from the handlers' side.
type drained struct {
	dirty                                          map[types.NamespacedName]dirtyMark
	serviceEvents, sliceEvents, dirtyByService     int
	nodeChanged, serviceCIDRsChanged, recomputeAll bool
}

// putBack merges what a Drain took back into the handlers' side, after that Drain failed.
// Takes mu.
func (t *Tracker) putBack(d drained) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, mark := range d.dirty {
		m, ok := t.dirty[name]
		if !ok || (!mark.trigger.IsZero() && (m.trigger.IsZero() || mark.trigger.Before(m.trigger))) {
			m.trigger = mark.trigger
		}
		if mark.service && !m.service {
			m.service = true
			t.dirtyByService++
		}
		t.dirty[name] = m
	}
	t.serviceEvents += d.serviceEvents
	t.sliceEvents += d.sliceEvents
	t.nodeChanged = t.nodeChanged || d.nodeChanged
	t.serviceCIDRsChanged = t.serviceCIDRsChanged || d.serviceCIDRsChanged
	t.recomputeAll = t.recomputeAll || d.recomputeAll
}

// recomputeSafely is recompute, turning a panic (a bug computing this Service) into an
// error, so that one Service's bug does not stop the others. The Service's state in a
// family is replaced only once its ports were computed, so a family keeps either the old
// or the new ports. Holds stateMu.
func (t *Tracker) recomputeSafely(name types.NamespacedName, node NodeInfo, info *DrainInfo) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("computing Service %s panicked: %v\n%s", name, r, debug.Stack())
		}
	}()
	t.recompute(name, node, info)
	return nil
}

// recompute brings one Service up to date in every family; it releases the Service where
// it was held. Holds stateMu.
func (t *Tracker) recompute(name types.NamespacedName, node NodeInfo, info *DrainInfo) {
	svc, ok := t.source.Service(name)
	if !ok {
		svc = nil
	}
	var epSlices []*discoveryv1.EndpointSlice
	if svc != nil && !skipService(svc) {
		epSlices = t.source.EndpointSlices(name)
	}
	var merged []Problem
	for _, f := range t.opts.families() { // in order, so that merged problems are stable
		st, p := t.states[f], t.progress[f]
		ports, problems := t.computeService(svc, epSlices, node, f, t.opts)
		merged = appendNewProblems(merged, problems)
		wasHeld := p.held.Has(name)
		if wasHeld {
			// Its own objects changed, or its retry is due: try it again now.
			p.held.Delete(name)
			p.pending.Insert(name)
		}
		if !portsEqual(st, name, ports) {
			if _, saved := p.lastGood[name]; !saved && p.applied && !wasHeld && !p.pending.Has(name) {
				p.lastGood[name] = st.PortsOf(name)
			}
			st.SetService(name, ports, problems)
			p.pending.Insert(name)
			continue
		}
		if !problemsEqual(st.Problems[name], problems) {
			// Same ports (nothing for the backend to do) but different problems: keep
			// the published ports and only update the problems.
			if len(problems) > 0 {
				st.Problems[name] = problems
			} else {
				delete(st.Problems, name)
			}
		}
	}
	if !problemsEqual(t.problems[name], merged) {
		if info.Problems == nil {
			info.Problems = map[types.NamespacedName][]Problem{}
		}
		info.Problems[name] = merged
		if len(merged) > 0 {
			t.problems[name] = merged
		} else {
			delete(t.problems, name)
		}
	}
}

// Applied records that family's state from the last Drain was applied, except for the
// Services in failed: those (and only those) are reported again by the next Drain. It
// also clears a pending Full. Sync goroutine only; takes stateMu.
func (t *Tracker) Applied(family IPFamily, failed sets.Set[types.NamespacedName]) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	p := t.progress[family]
	if p == nil {
		return
	}
	p.pending = sets.New[types.NamespacedName]()
	for name := range failed {
		p.pending.Insert(name)
	}
	// What was applied is now the last good version; held Services were applied as they
	// last were, and failed ones keep theirs.
	for name := range p.lastGood {
		if !failed.Has(name) && !p.held.Has(name) {
			delete(p.lastGood, name)
		}
	}
	p.needFull = false
	p.applied = true
}

// Hold takes Services that just failed (reported by Applied) out of the changes until
// their retry: the next Drains do not report them, unless their own objects change or the
// sync loop calls Retry. Meanwhile the family's state carries each of them as it was
// last applied (absent if it is new), so that a full sync, which programs the whole
// state, keeps its last good version instead of trying the rejected one again. A Service
// that failed before any apply of the family succeeded has no known last good version: it
// keeps its new state, which full syncs try again. Sync goroutine only; takes stateMu.
func (t *Tracker) Hold(family IPFamily, names ...types.NamespacedName) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	p, st := t.progress[family], t.states[family]
	if p == nil {
		return
	}
	for _, name := range names {
		p.pending.Delete(name)
		p.held.Insert(name)
		if good, known := p.lastGood[name]; known {
			st.SetService(name, good, st.Problems[name])
		}
	}
}

// Failed records that applying family's state failed as a whole: the next Changes are
// Full, and every Service changed since the last successful apply is still reported.
// Sync goroutine only; takes stateMu.
func (t *Tracker) Failed(family IPFamily) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	if p := t.progress[family]; p != nil {
		p.needFull = true
	}
}

// Snapshot returns a copy of family's current state that stays valid while the tracker
// goes on (the ServicePorts are shared; they are immutable), or nil for a family not
// tracked. Safe from any goroutine; takes stateMu for reading.
func (t *Tracker) Snapshot(family IPFamily) *NodeState {
	t.stateMu.RLock()
	defer t.stateMu.RUnlock()
	st := t.states[family]
	if st == nil {
		return nil
	}
	return st.Clone()
}

// portsEqual reports whether ports (freshly computed for the Service name) equal what st
// holds for it.
func portsEqual(st *NodeState, name types.NamespacedName, ports []*ServicePort) bool {
	if len(st.byService[name]) != len(ports) {
		return false
	}
	for _, sp := range ports {
		if !st.Services[sp.Name].Equal(sp) {
			return false
		}
	}
	return true
}

func problemsEqual(a, b []Problem) bool { return slices.Equal(a, b) }

// appendNewProblems appends the problems of add not already in list.
func appendNewProblems(list, add []Problem) []Problem {
	for _, p := range add {
		if !slices.Contains(list, p) {
			list = append(list, p)
		}
	}
	return list
}

func nodeInfoEqual(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Zone == b.Zone && slices.Equal(a.IPs, b.IPs) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

func cloneNodeInfo(n NodeInfo) NodeInfo {
	n.IPs = slices.Clone(n.IPs)
	n.PodCIDRs = slices.Clone(n.PodCIDRs)
	return n
}

// markDirty adds name to dirty, keeping the marks it already has.
func markDirty(dirty map[types.NamespacedName]dirtyMark, name types.NamespacedName) {
	if _, ok := dirty[name]; !ok {
		dirty[name] = dirtyMark{}
	}
}
