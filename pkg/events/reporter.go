package events

import (
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
)

// Reporter writes sluice's Events: a Normal "Starting" on the Node, and rate-limited
// Warnings on Services and on the Node. All methods are safe for concurrent use.
type Reporter struct {
	recorder events.EventRecorder
	node     *v1.ObjectReference
	interval time.Duration
	clock    clock.PassiveClock

	mu sync.Mutex
	// lastSent is when an Event was last written per subject and reason.
	lastSent  map[eventKey]time.Time
	lastSweep time.Time
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

func newReporter(recorder events.EventRecorder, nodeName string, interval time.Duration, c clock.PassiveClock) *Reporter {
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
	return r.serviceWarning(name, ReasonFailedToProgramService, actionSync,
		fmt.Sprintf("%s rules of Service %s could not be programmed and will be retried: %v", family, name, err))
}

// ServiceProblems reports the invalid fields found in Service name or its EndpointSlices
// (InvalidService). Nothing is written when problems is empty. It returns whether an
// Event was written.
func (r *Reporter) ServiceProblems(name types.NamespacedName, problems []model.Problem) bool {
	if len(problems) == 0 {
		return false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Service %s has invalid fields, which are ignored (the rest is programmed):", name)
	for _, p := range problems {
		fmt.Fprintf(&b, " %s %s: %s;", p.Object, p.Field, p.Message)
	}
	return r.serviceWarning(name, ReasonInvalidService, actionParse, strings.TrimSuffix(b.String(), ";"))
}

// ServiceHealthCheckFailed reports that the healthCheckNodePort of Service name could not
// be opened (FailedToStartServiceHealthcheck, as upstream). Its signature is that of
// health.ServiceHealthConfig.OnListenError, so the method value can be passed there.
func (r *Reporter) ServiceHealthCheckFailed(name types.NamespacedName, port int32, err error) {
	r.serviceWarning(name, ReasonFailedToStartServiceHealthcheck, actionListen,
		fmt.Sprintf("node %s failed to start health check %q on port %d: %v", r.node.Name, name.String(), port, err))
}

// NodeWarning writes a Warning on the Node (for example ReasonFailedToStartProxierHealthcheck
// with action "StartSluice"), rate-limited per reason. It returns whether an Event was
// written.
func (r *Reporter) NodeWarning(reason, message string) bool {
	if !r.allow(eventKey{reason: reason}) {
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

func (r *Reporter) serviceWarning(name types.NamespacedName, reason, action, message string) bool {
	if !r.allow(eventKey{service: name, reason: reason}) {
		return false
	}
	ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: name.Namespace, Name: name.Name}
	r.recorder.Eventf(ref, nil, v1.EventTypeWarning, reason, action, "%s", truncate(message))
	return true
}

// allow reports whether an Event for k may be written now, and if so records it.
func (r *Reporter) allow(k eventKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
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
