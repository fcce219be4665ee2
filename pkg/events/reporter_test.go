package events

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/asynctest"
)

// Test conventions: the node is "node-a"; the fake clock starts at t0; the rate-limit
// interval is 10 minutes.

var t0 = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

const interval = 10 * time.Minute

var (
	svcA = types.NamespacedName{Namespace: "ns1", Name: "a"}
	svcB = types.NamespacedName{Namespace: "ns1", Name: "b"}
)

// recorded is one Event as the fake recorder saw it.
type recorded struct {
	regarding         *v1.ObjectReference
	eventType, reason string
	action, note      string
}

// fakeRecorder keeps every Event it is given, until the test takes them.
type fakeRecorder struct{ events asynctest.Log[recorded] }

func (f *fakeRecorder) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	ref, _ := regarding.(*v1.ObjectReference)
	f.events.Add(recorded{ref, eventtype, reason, action, fmt.Sprintf(note, args...)})
}

func (f *fakeRecorder) take() []recorded { return f.events.Take() }

func newTestReporter() (*Reporter, *fakeRecorder, *testingclock.FakeClock) {
	rec := &fakeRecorder{}
	c := testingclock.NewFakeClock(t0)
	return newReporter(rec, "node-a", interval, c), rec, c
}

func TestServiceWarningsAreRateLimitedPerServiceAndReason(t *testing.T) {
	r, rec, c := newTestReporter()
	boom := errors.New("netlink: no buffer space")
	problems := []model.Problem{{Service: svcA, Object: "Service", Field: "spec.externalIPs[0]", Message: "not an IP address"}}

	steps := []struct {
		name  string
		step  time.Duration
		emit  func() bool
		wantN int
	}{
		{"first failure of a", 0, func() bool { return r.ServiceFailed(svcA, model.IPv4, boom) }, 1},
		{"a fails again at once", 0, func() bool { return r.ServiceFailed(svcA, model.IPv6, boom) }, 0},
		{"b fails: another Service", 0, func() bool { return r.ServiceFailed(svcB, model.IPv4, boom) }, 1},
		{"a is invalid: another reason", 0, func() bool { return r.ServiceProblems(svcA, problems) }, 1},
		{"a's health check port is busy: another reason", 0, func() bool { r.ServiceHealthCheckFailed(svcA, 30001, boom); return true }, 1},
		{"a fails just inside the interval", interval - time.Second, func() bool { return r.ServiceFailed(svcA, model.IPv4, boom) }, 0},
		{"a fails once the interval has passed", time.Second, func() bool { return r.ServiceFailed(svcA, model.IPv4, boom) }, 1},
		{"a is invalid again, interval passed", 0, func() bool { return r.ServiceProblems(svcA, problems) }, 1},
	}
	for _, s := range steps {
		c.Step(s.step)
		got := s.emit()
		events := rec.take()
		if len(events) != s.wantN || got != (s.wantN == 1) {
			t.Fatalf("%s: wrote %d Events (returned %v), want %d", s.name, len(events), got, s.wantN)
		}
	}
}

func TestServiceWarningContents(t *testing.T) {
	r, rec, _ := newTestReporter()
	r.ServiceFailed(svcA, model.IPv6, errors.New("boom"))
	r.ServiceProblems(svcB, []model.Problem{
		{Service: svcB, Object: "Service", Field: "spec.externalIPs[1]", Message: "not an IP address"},
		{Service: svcB, Object: "EndpointSlice ns1/b-x", Field: "endpoints[2].addresses[0]", Message: "not an IP address"},
	})
	r.ServiceHealthCheckFailed(svcA, 30001, errors.New("address already in use"))

	want := []recorded{
		{&v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: "ns1", Name: "a"}, "Warning", ReasonFailedToProgramService, "Sync",
			"IPv6 rules of Service ns1/a could not be programmed and will be retried: boom"},
		{&v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: "ns1", Name: "b"}, "Warning", ReasonInvalidService, "Parse",
			"Service ns1/b has invalid fields, which are ignored (the rest is programmed): Service spec.externalIPs[1]: not an IP address; EndpointSlice ns1/b-x endpoints[2].addresses[0]: not an IP address"},
		{&v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: "ns1", Name: "a"}, "Warning", ReasonFailedToStartServiceHealthcheck, "Listen",
			`node node-a failed to start health check "ns1/a" on port 30001: address already in use`},
	}
	got := rec.take()
	if len(got) != len(want) {
		t.Fatalf("got %d Events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if *g.regarding != *w.regarding || g.eventType != w.eventType || g.reason != w.reason || g.action != w.action || g.note != w.note {
			t.Errorf("Event %d:\n got %+v %+v\nwant %+v %+v", i, *g.regarding, g, *w.regarding, w)
		}
	}
}

func TestNoProblemsNoEvent(t *testing.T) {
	r, rec, _ := newTestReporter()
	if r.ServiceProblems(svcA, nil) || len(rec.take()) != 0 {
		t.Error("an Event was written for a Service without problems")
	}
}

func TestForgetLetsTheNextWarningThrough(t *testing.T) {
	r, rec, _ := newTestReporter()
	r.ServiceFailed(svcA, model.IPv4, errors.New("boom"))
	r.ServiceFailed(svcB, model.IPv4, errors.New("boom"))
	rec.take()
	r.Forget(svcA)
	if !r.ServiceFailed(svcA, model.IPv4, errors.New("boom")) {
		t.Error("a Forgotten Service is still rate limited")
	}
	if r.ServiceFailed(svcB, model.IPv4, errors.New("boom")) {
		t.Error("Forget of one Service lifted the limit of another")
	}
}

func TestStartingIsANormalEventOnTheNode(t *testing.T) {
	r, rec, _ := newTestReporter()
	r.Starting("sluice v1.0.0 starting in nftables mode")
	r.Starting("again")
	got := rec.take()
	if len(got) != 2 {
		t.Fatalf("got %d Events, want 2 (Starting is not rate limited)", len(got))
	}
	wantRef := v1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"}
	if *got[0].regarding != wantRef || got[0].eventType != "Normal" || got[0].reason != "Starting" || got[0].action == "" {
		t.Errorf("Starting Event = %+v on %+v", got[0], *got[0].regarding)
	}
}

func TestNodeWarningsAreRateLimitedPerReason(t *testing.T) {
	r, rec, c := newTestReporter()
	if !r.NodeWarning(ReasonFailedToStartProxierHealthcheck, "listen tcp 0.0.0.0:10256: address already in use") {
		t.Fatal("first node warning not written")
	}
	if r.NodeWarning(ReasonFailedToStartProxierHealthcheck, "again") {
		t.Error("second node warning within the interval was written")
	}
	if !r.NodeWarning(ReasonFailedToStartMetricServer, "busy") {
		t.Error("node warning with another reason was held back")
	}
	c.Step(interval)
	if !r.NodeWarning(ReasonFailedToStartProxierHealthcheck, "still busy") {
		t.Error("node warning after the interval was held back")
	}
	got := rec.take()
	if len(got) != 3 || got[0].regarding.Kind != "Node" || got[0].eventType != "Warning" {
		t.Errorf("Events = %+v", got)
	}
}

func TestLongNotesAreTruncatedToTheAPILimit(t *testing.T) {
	r, rec, _ := newTestReporter()
	long := errors.New(strings.Repeat("é", 2000)) // 2 bytes per character
	r.ServiceFailed(svcA, model.IPv4, long)
	got := rec.take()[0].note
	if len(got) > noteLengthLimit || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("note of %d bytes (valid UTF-8: %v) ending %q", len(got), utf8.ValidString(got), got[len(got)-8:])
	}
}

func TestOldEntriesAreSwept(t *testing.T) {
	r, _, c := newTestReporter()
	for i := range 100 {
		r.ServiceFailed(types.NamespacedName{Namespace: "ns", Name: fmt.Sprint(i)}, model.IPv4, errors.New("boom"))
	}
	c.Step(interval)
	r.ServiceFailed(svcA, model.IPv4, errors.New("boom"))
	r.mu.Lock()
	n := len(r.lastSent)
	r.mu.Unlock()
	if n != 1 {
		t.Errorf("%d rate-limit entries kept after the interval, want 1", n)
	}
}

func TestDefaultInterval(t *testing.T) {
	r := NewReporter(&fakeRecorder{}, "node-a", 0)
	if r.interval != DefaultInterval {
		t.Errorf("interval = %v, want %v", r.interval, DefaultInterval)
	}
}

// The method value must fit health.ServiceHealthConfig.OnListenError (checked here by
// type, without importing pkg/health).
var _ func(types.NamespacedName, int32, error) = (*Reporter)(nil).ServiceHealthCheckFailed
