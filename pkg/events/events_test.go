package events

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// sinkRecorder is an events.EventSink that keeps what it is asked to create.
type sinkRecorder struct {
	mu      sync.Mutex
	created []*eventsv1.Event
}

func (s *sinkRecorder) Create(_ context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created = append(s.created, ev.DeepCopy())
	return ev, nil
}

func (s *sinkRecorder) Update(_ context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	return ev, nil
}

func (s *sinkRecorder) Patch(_ context.Context, ev *eventsv1.Event, _ []byte) (*eventsv1.Event, error) {
	return ev, nil
}

func (s *sinkRecorder) events() []*eventsv1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*eventsv1.Event(nil), s.created...)
}

func TestBroadcasterWritesEventsV1(t *testing.T) {
	sink := &sinkRecorder{}
	b := newBroadcaster(sink)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()

	r := NewReporter(b.Recorder(), "node-a", 0)
	r.Starting("starting")
	r.ServiceFailed(svcA, model.IPv4, errors.New("boom"))

	// The broadcaster writes asynchronously.
	var got []*eventsv1.Event
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if got = sink.events(); len(got) == 2 {
			break
		}
	}
	if len(got) != 2 {
		t.Fatalf("sink got %d Events, want 2", len(got))
	}
	byReason := map[string]*eventsv1.Event{}
	for _, ev := range got {
		byReason[ev.Reason] = ev
		if ev.ReportingController != "sluice" || !strings.HasPrefix(ev.ReportingInstance, "sluice-") || ev.Action == "" {
			t.Errorf("Event %s: controller %q, instance %q, action %q", ev.Reason, ev.ReportingController, ev.ReportingInstance, ev.Action)
		}
	}
	if ev := byReason["Starting"]; ev == nil || ev.Namespace != metav1.NamespaceDefault || ev.Type != "Normal" || ev.Regarding.Kind != "Node" || ev.Regarding.Name != "node-a" {
		t.Errorf("Starting Event = %+v", ev)
	}
	if ev := byReason[ReasonFailedToProgramService]; ev == nil || ev.Namespace != "ns1" || ev.Type != "Warning" || ev.Regarding.Kind != "Service" || ev.Regarding.Name != "a" {
		t.Errorf("FailedToProgramService Event = %+v", ev)
	}
}
