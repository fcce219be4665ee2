package events

import (
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"k8s.io/klog/v2"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// DefaultInterval is how long Reporter stays quiet about one Service and reason after an
// Event about it.
const DefaultInterval = 10 * time.Minute

// noteLengthLimit is the API's limit on an Event's note (message); longer notes make the
// API reject the whole Event.
const noteLengthLimit = 1024

// Actions, the events.k8s.io "action" of each Event (required by the API).
const (
	actionStart  = "StartSluice"
	actionSync   = "Sync"
	actionListen = "Listen"
	actionParse  = "Parse"
	actionReport = "Report"
)

// maxDeferred bounds the InvalidService reports kept while the electorate is not known.
const maxDeferred = 1000

// Reporter writes sluice's Events: a Normal "Starting" on the Node, and rate-limited
// Warnings on Services and on the Node. All methods are safe for concurrent use.
//
// Warnings about a Service are limited three ways. Per Service and reason: at most one per
// interval. Per node: budgets (see budget.go) cap the node's Warnings about Services as a
// whole, with a summary Event for what they held back. And across the cluster: with an
// Electorate, the invalid fields of a Service, which every node sees alike, are reported by
// one node per Service only (the others still log and count them). Failures only this node
// has (FailedToProgramService, FailedToStartServiceHealthcheck) are its own to report.
type Reporter struct {
	recorder events.EventRecorder
	node     *v1.ObjectReference
	interval time.Duration
	clock    clock.WithDelayedExecution

	mu sync.Mutex
	// lastSent is when an Event was last written per subject and reason.
	lastSent  map[eventKey]time.Time
	lastSweep time.Time
	// nodeLocal and input are the budgets of node-local failures and of bad input.
	nodeLocal, input *budget
	// electorate chooses the node that reports each Service's invalid fields; nil: this
	// node reports every Service.
	electorate Electorate
	// deferred holds the InvalidService reports made before the electorate was known.
	deferred        map[types.NamespacedName][]model.Problem
	deferredDropped int
}

// eventKey is what the rate limit counts per: one subject (a Service, or the Node when
// Service is empty) and one reason.
type eventKey struct {
	service types.NamespacedName
	reason  string
}

// NewReporter returns a Reporter writing through recorder about the Node nodeName, writing
// at most one Warning per Service (or the Node) and reason per interval (DefaultInterval
// when interval ≤ 0).
func NewReporter(recorder events.EventRecorder, nodeName string, interval time.Duration) *Reporter {
	return newReporter(recorder, nodeName, interval, clock.RealClock{})
}

func newReporter(recorder events.EventRecorder, nodeName string, interval time.Duration, c clock.WithDelayedExecution) *Reporter {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Reporter{
		recorder: recorder,
		// Like upstream kube-proxy's node reference: Nodes are cluster-scoped, and the UID
		// is the name because the Node object may not have been read yet.
		node:      &v1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)},
		interval:  interval,
		clock:     c,
		lastSent:  map[eventKey]time.Time{},
		lastSweep: c.Now(),
		nodeLocal: newBudget(nodeLocalBurst, nodeLocalRefill, "Warnings about Services on this node",
			"The metric sluice_services_failed counts the Services that failed, `sluice status` on the node lists them, and sluice's log names each failure."),
		input: newBudget(inputBurst, inputRefill, "Warnings about Services with invalid fields",
			"The metric sluice_input_problems_total counts them on every node, `sluice status -o json` lists them, and sluice's log names each one."),
		deferred: map[types.NamespacedName][]model.Problem{},
	}
}

// SetElectorate makes the Reporter write InvalidService Events only for the Services
// whose elected node (see ElectedNode) is this one. Until the electorate HasSynced, such
// reports are kept (up to maxDeferred) and FlushDeferred writes those this node won: call
// it once the electorate has synced. Call SetElectorate before the first report.
func (r *Reporter) SetElectorate(e Electorate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.electorate = e
}

// FlushDeferred reports what ServiceProblems kept while the electorate was not known.
func (r *Reporter) FlushDeferred() {
	r.mu.Lock()
	deferred, dropped := r.deferred, r.deferredDropped
	r.deferred, r.deferredDropped = map[types.NamespacedName][]model.Problem{}, 0
	r.mu.Unlock()
	if dropped > 0 {
		klog.Background().Info("InvalidService Events were not written while the list of Nodes was not known yet; the log and sluice_input_problems_total have them",
			"dropped", dropped)
	}
	for name, problems := range deferred {
		r.ServiceProblems(name, problems)
	}
}

// Starting writes the Normal Event "Starting" on the Node. It is not rate-limited: call it
// once, when sluice starts.
func (r *Reporter) Starting(message string) {
	r.recorder.Eventf(r.node, nil, v1.EventTypeNormal, ReasonStarting, actionStart, "%s", truncate(message))
}

// ServiceFailed reports that the backend could not program Service name
// (FailedToProgramService). It returns whether an Event was written (false while rate
// limited).
func (r *Reporter) ServiceFailed(name types.NamespacedName, family model.IPFamily, err error) bool {
	return r.serviceWarning(name, ReasonFailedToProgramService, actionSync, r.nodeLocal,
		fmt.Sprintf("%s rules of Service %s could not be programmed and will be retried: %v", family, name, err))
}

// ServiceProblems reports the invalid fields found in Service name or its EndpointSlices
// (InvalidService), if this node is the one elected to (see SetElectorate). Nothing is
// written when problems is empty. It returns whether an Event was written.
func (r *Reporter) ServiceProblems(name types.NamespacedName, problems []model.Problem) bool {
	if len(problems) == 0 {
		return false
	}
	elected, ok := r.electedFor(name, problems)
	if !ok {
		return false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Service %s has invalid fields, which are ignored (the rest is programmed):", name)
	for _, p := range problems {
		fmt.Fprintf(&b, " %s %s: %s;", p.Object, p.Field, p.Message)
	}
	msg := strings.TrimSuffix(b.String(), ";")
	if elected {
		msg += fmt.Sprintf(" (every node sees this; node %s reports it for all)", r.node.Name)
	}
	return r.serviceWarning(name, ReasonInvalidService, actionParse, r.input, msg)
}

// electedFor reports whether this node reports about Service name: ok is false when
// another node does, or when that is not known yet (then problems are kept for
// FlushDeferred); elected is true when an electorate chose this node.
func (r *Reporter) electedFor(name types.NamespacedName, problems []model.Problem) (elected, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.electorate == nil {
		return false, true
	}
	if !r.electorate.HasSynced() {
		if _, kept := r.deferred[name]; kept || len(r.deferred) < maxDeferred {
			r.deferred[name] = problems
		} else {
			r.deferredDropped++
		}
		return false, false
	}
	return true, ElectedNode(name.String(), r.electorate.Nodes()) == r.node.Name
}

// ServiceHealthCheckFailed reports that the healthCheckNodePort of Service name could not
// be opened (FailedToStartServiceHealthcheck, as upstream). Its signature is that of
// health.ServiceHealthConfig.OnListenError, so the method value can be passed there.
func (r *Reporter) ServiceHealthCheckFailed(name types.NamespacedName, port int32, err error) {
	r.serviceWarning(name, ReasonFailedToStartServiceHealthcheck, actionListen, r.nodeLocal,
		fmt.Sprintf("node %s failed to start health check %q on port %d: %v", r.node.Name, name.String(), port, err))
}

// NodeWarning writes a Warning on the Node (for example ReasonFailedToStartProxierHealthcheck
// with action "StartSluice"), rate-limited per reason. It returns whether an Event was
// written.
func (r *Reporter) NodeWarning(reason, message string) bool {
	if !r.allow(eventKey{reason: reason}, r.clock.Now()) {
		return false
	}
	r.recorder.Eventf(r.node, nil, v1.EventTypeWarning, reason, actionStart, "%s", truncate(message))
	return true
}

// Forget drops the rate-limit memory of Service name, so that the next Warning about it is
// written at once. Call it when the Service is deleted, or when it was programmed again
// after a failure.
func (r *Reporter) Forget(name types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.lastSent {
		if k.service == name {
			delete(r.lastSent, k)
		}
	}
}

// serviceWarning writes a Warning about Service name if neither its per-Service limit nor
// budget b holds it back.
func (r *Reporter) serviceWarning(name types.NamespacedName, reason, action string, b *budget, message string) bool {
	if !r.allowWithin(eventKey{service: name, reason: reason}, b) {
		return false
	}
	ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: name.Namespace, Name: name.Name}
	r.recorder.Eventf(ref, nil, v1.EventTypeWarning, reason, action, "%s", truncate(message))
	return true
}

// allowWithin is allow, then budget b's say. A Warning b holds back still counts for the
// per-Service limit, so that a Service failing on every sync is counted once in the
// summary, and that summary is scheduled here.
func (r *Reporter) allowWithin(k eventKey, b *budget) bool {
	now := r.clock.Now()
	if !r.allow(k, now) {
		return false
	}
	r.mu.Lock()
	ok, schedule := b.allowLocked(now, k.reason, k.service.String())
	r.mu.Unlock()
	if schedule {
		r.clock.AfterFunc(summaryInterval, func() { r.writeSummary(b) })
	}
	return ok
}

// writeSummary writes budget b's summary Event on the Node, if it held anything back.
func (r *Reporter) writeSummary(b *budget) {
	r.mu.Lock()
	msg := b.takeSummaryLocked()
	r.mu.Unlock()
	if msg != "" {
		r.recorder.Eventf(r.node, nil, v1.EventTypeWarning, ReasonServiceWarningsSuppressed, actionReport, "%s", truncate(msg))
	}
}

// allow reports whether an Event for k may be written now, and if so records it. now is
// read by the caller before taking mu: a clock may run AfterFunc callbacks, which take mu,
// under its own lock (the fake clock does), so mu must never be held while calling it.
func (r *Reporter) allow(k eventKey, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	if last, ok := r.lastSent[k]; ok && now.Sub(last) < r.interval {
		return false
	}
	r.lastSent[k] = now
	return true
}

// sweepLocked forgets entries older than the interval, at most once per interval, so that
// the map stays as small as the set of recently failing Services. It assumes r.mu is held.
func (r *Reporter) sweepLocked(now time.Time) {
	if now.Sub(r.lastSweep) < r.interval {
		return
	}
	r.lastSweep = now
	for k, t := range r.lastSent {
		if now.Sub(t) >= r.interval {
			delete(r.lastSent, k)
		}
	}
}

// truncate cuts s to the API's note length limit, on a character boundary, marking the cut.
func truncate(s string) string {
	if len(s) <= noteLengthLimit {
		return s
	}
	const mark = "..."
	cut := noteLengthLimit - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
