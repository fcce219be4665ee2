// Package fullsync is the state every backend keeps between syncs to decide whether the
// next sync is full, and why: one vocabulary for the iptables, ipvs and nftables backends.
//
// A full sync reads the kernel and converges everything, which repairs drift; a partial
// sync converges only the Services that changed, trusting that the kernel holds what the
// backend last wrote. That trust is NeedFull's opposite: it starts false (nothing written
// yet) and is lost after every failure whose effect on the kernel is not known.
package fullsync

import "time"

// The reasons Reason returns; backends add their own (a canary gone, node-wide rules
// changed) after asking Reason.
const (
	ReasonFirst     = "first sync"
	ReasonFailed    = "previous sync failed"
	ReasonRequested = "requested"
	ReasonPeriodic  = "periodic"
)

// State is what a backend remembers between syncs.
type State struct {
	// NeedFull: the kernel may not hold what the backend believes it wrote (before the
	// first sync, after a sync that failed as a whole).
	NeedFull bool
	// LastFull is when the last successful full sync started; zero before the first.
	LastFull time.Time
	// LeftoversPending is set until the first successful full sync has removed the other
	// modes' leftovers (leftovers.RemoveOtherModes).
	LeftoversPending bool
}

// New returns the state of a backend that has not synced yet. removeLeftovers is false
// when the backend was told not to touch the other modes' state.
func New(removeLeftovers bool) State {
	return State{NeedFull: true, LeftoversPending: removeLeftovers}
}

// Reason returns why the next sync must be full, or "" when a partial sync will do:
// the first sync, the previous one failed, the caller asked (requested), or period
// (when positive) has passed since the last full sync.
func (s *State) Reason(requested bool, now time.Time, period time.Duration) string {
	switch {
	case s.NeedFull && s.LastFull.IsZero():
		return ReasonFirst
	case s.NeedFull:
		return ReasonFailed
	case requested:
		return ReasonRequested
	case period > 0 && now.Sub(s.LastFull) >= period:
		return ReasonPeriodic
	}
	return ""
}

// ReasonWithModel is Reason for a backend that keeps a model of the kernel: without one
// (hasModel false: none read or written yet) the sync is full as the first one is.
func (s *State) ReasonWithModel(hasModel, requested bool, now time.Time, period time.Duration) string {
	if reason := s.Reason(requested, now, period); reason != "" || hasModel {
		return reason
	}
	return ReasonFirst
}

// Trusted reports whether the backend knows what the kernel holds from a successful full
// sync and no failure since: only then is a difference found in the kernel drift.
func (s *State) Trusted() bool { return !s.NeedFull && !s.LastFull.IsZero() }

// Failed records a sync whose effect on the kernel is not known: the next is full.
func (s *State) Failed() { s.NeedFull = true }

// FullSynced records that a full sync was taken by the kernel at t.
func (s *State) FullSynced(t time.Time) { s.NeedFull, s.LastFull = false, t }

// LeftoversDue reports whether the other modes' leftovers are to be removed now: once,
// after the first successful full sync (call it only after one).
func (s *State) LeftoversDue() bool {
	due := s.LeftoversPending
	s.LeftoversPending = false
	return due
}
