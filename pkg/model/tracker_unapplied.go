package model

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// Unapplied returns, sorted, the Services of family whose desired state (as Snapshot
// shows it) the backend has not applied yet: changed since the last successful apply, or
// failed in it. A sync that fails as a whole leaves the rules of the other Services as
// they were, so these are the Services it affects (for `sluice status`). Changes recorded
// by handlers but not yet drained are not in the snapshot, and not here either. A failed
// Service held until its retry (Hold) is here only when its last good version is unknown:
// otherwise the snapshot shows that version, which is applied.
//
// Safe from any goroutine; takes stateMu for reading.
func (t *Tracker) Unapplied(family IPFamily) []types.NamespacedName {
	t.stateMu.RLock()
	defer t.stateMu.RUnlock()
	p := t.progress[family]
	if p == nil {
		return nil
	}
	out := p.pending.UnsortedList()
	for name := range p.held {
		if _, known := p.lastGood[name]; !known {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}
