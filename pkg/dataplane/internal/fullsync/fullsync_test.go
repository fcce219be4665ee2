package fullsync

import (
	"testing"
	"time"
)

// t0 is when the last full sync of the states synced and failed started.
var (
	t0     = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	synced = State{LastFull: t0}
	failed = State{NeedFull: true, LastFull: t0}
)

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		name      string
		state     State
		requested bool
		now       time.Time
		period    time.Duration
		want      string
	}{
		{name: "first", state: New(true), now: t0, period: time.Hour, want: ReasonFirst},
		{name: "first even when requested", state: New(false), requested: true, now: t0, want: ReasonFirst},
		{name: "after a failure", state: failed, requested: true, now: t0, want: ReasonFailed},
		{name: "requested", state: synced, requested: true, now: t0, want: ReasonRequested},
		{name: "period passed", state: synced, now: t0.Add(time.Hour), period: time.Hour, want: ReasonPeriodic},
		{name: "period not passed", state: synced, now: t0.Add(59 * time.Minute), period: time.Hour, want: ""},
		{name: "no period", state: synced, now: t0.Add(1000 * time.Hour), want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.state.Reason(tc.requested, tc.now, tc.period); got != tc.want {
				t.Fatalf("Reason = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	s := New(true)
	if s.Trusted() {
		t.Fatal("a new state is trusted")
	}
	s.FullSynced(t0)
	if !s.LeftoversDue() {
		t.Fatal("the first full sync does not remove leftovers")
	}
	if !s.Trusted() || s.Reason(false, t0, 0) != "" {
		t.Fatalf("after a full sync: trusted=%v reason=%q", s.Trusted(), s.Reason(false, t0, 0))
	}
	s.Failed()
	if s.Trusted() || s.Reason(false, t0, 0) != ReasonFailed {
		t.Fatalf("after a failure: trusted=%v reason=%q", s.Trusted(), s.Reason(false, t0, 0))
	}
	s.FullSynced(t0.Add(time.Minute))
	if s.LeftoversDue() {
		t.Fatal("leftovers removed twice")
	}
	if s := New(false); s.LeftoversDue() {
		t.Fatal("leftovers removed when told not to")
	}
}

func TestReasonWithModel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		state    State
		hasModel bool
		want     string
	}{
		{"synced, with a model", synced, true, ""},
		{"synced, model lost", synced, false, ReasonFirst},
		{"failed, with a model", failed, true, ReasonFailed},
		{"failed, model lost", failed, false, ReasonFailed},
		{"new", New(true), false, ReasonFirst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.state.ReasonWithModel(tc.hasModel, false, t0, 0); got != tc.want {
				t.Errorf("ReasonWithModel = %q, want %q", got, tc.want)
			}
		})
	}
}
