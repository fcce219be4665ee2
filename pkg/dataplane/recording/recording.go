// Package recording provides a dataplane.Backend that programs nothing and remembers what
// it was asked to program. It serves three purposes:
//
//   - tests of the sync loop and the daemon: what the last Apply received, how many applies
//     (full or partial) ran, and what a real backend would now have in the kernel
//     (Programmed), with failures injected for chosen Services or for whole applies;
//   - `sluice render`: the desired state of a cluster as JSON, without touching a kernel;
//   - e2e tests, which run the daemon with this backend against a real apiserver.
//
// The JSON dump is model.StateView (schema model.StateViewSchema): every Service port with
// its addresses, ports, policies, affinity, health check port and endpoint lists, sorted,
// so equal states dump to equal bytes.
package recording

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Backend records what it is asked to program for one IP family. All methods are safe for
// concurrent use: the sync loop calls Apply while tests read.
type Backend struct {
	family model.IPFamily

	mu sync.Mutex
	// last is a clone of the desired state of the last Apply, nil before the first.
	last        *model.NodeState
	lastChanges model.Changes
	lastResult  dataplane.Result
	// programmed is what a real backend would have in the kernel after the applies so far:
	// it follows desired only for the Services an apply was asked to (re)program and did
	// not fail.
	programmed *model.NodeState

	applies, fullApplies int
	// applied is closed and replaced after every Apply, to wake WaitForApplies.
	applied chan struct{}

	failApply    error
	failServices map[types.NamespacedName]error
}

var _ dataplane.Backend = (*Backend)(nil)

// New returns a recording backend for family.
func New(family model.IPFamily) *Backend {
	return &Backend{
		family:       family,
		programmed:   model.NewNodeState(family, model.NodeInfo{}),
		applied:      make(chan struct{}),
		failServices: map[types.NamespacedName]error{},
	}
}

// Mode returns dataplane.ModeRecording.
func (b *Backend) Mode() dataplane.Mode { return dataplane.ModeRecording }

// Family returns the family given to New.
func (b *Backend) Family() model.IPFamily { return b.family }

// Apply records desired and changes. It fails as a whole when FailApply is set (nothing
// is recorded as programmed), and reports the Services set by FailService that this apply
// had to change (on a full apply, those whose desired version differs from the programmed
// one; else those in changes.Services) as Failed, keeping their programmed version, as a
// real backend keeps a rejected Service's last good rules; everything else it was asked
// for counts as programmed.
func (b *Backend) Apply(ctx context.Context, desired *model.NodeState, changes model.Changes) dataplane.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.notifyLocked()

	b.applies++
	if changes.Full {
		b.fullApplies++
	}
	b.last = desired.Clone()
	b.lastChanges = model.Changes{Full: changes.Full, Services: sets.New[types.NamespacedName]()}
	if changes.Services != nil {
		b.lastChanges.Services = changes.Services.Clone()
	}

	res := dataplane.Result{Full: changes.Full}
	switch {
	case ctx.Err() != nil:
		res.Err = fmt.Errorf("recording apply: %w", ctx.Err())
	case b.failApply != nil:
		res.Err = b.failApply
	default:
		res.Failed = b.programLocked(desired, changes)
	}
	b.lastResult = res
	return res
}

// programLocked updates b.programmed as a real backend would and returns the injected
// per-Service failures. It assumes b.mu is held.
func (b *Backend) programLocked(desired *model.NodeState, changes model.Changes) map[types.NamespacedName]error {
	todo := changes.Services // nil: nothing changed
	if changes.Full {
		// A full apply rewrites everything: every desired Service, and removes whatever
		// is programmed but no longer desired.
		todo = desired.ServiceNames().Union(b.programmed.ServiceNames())
		for name := range desired.Problems {
			todo.Insert(name)
		}
	}
	prev := b.programmed
	next := prev.Clone()
	next.Family, next.Node, next.ServiceCIDRs = desired.Family, desired.Node, desired.ServiceCIDRs
	var failed map[types.NamespacedName]error
	for name := range todo {
		if err, fail := b.failServices[name]; fail && (!changes.Full || !samePorts(prev.PortsOf(name), desired.PortsOf(name))) {
			if failed == nil {
				failed = map[types.NamespacedName]error{}
			}
			failed[name] = err
			continue // what was programmed before stays
		}
		next.SetService(name, desired.PortsOf(name), desired.Problems[name])
	}
	b.programmed = next
	return failed
}

// samePorts reports whether two versions of a Service's ports are equal.
func samePorts(a, b []*model.ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func (b *Backend) notifyLocked() {
	close(b.applied)
	b.applied = make(chan struct{})
}

// FailApply makes every following Apply fail as a whole with err (nil stops it).
func (b *Backend) FailApply(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failApply = err
}

// FailService makes every following Apply report name as Failed with err whenever it has
// to change name; nil err stops it.
func (b *Backend) FailService(name types.NamespacedName, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.failServices, name)
		return
	}
	b.failServices[name] = err
}

// Last returns a copy of the desired state and the changes the last Apply received, and
// false if there has been no Apply.
func (b *Backend) Last() (*model.NodeState, model.Changes, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		return nil, model.Changes{}, false
	}
	return b.last.Clone(), model.Changes{Full: b.lastChanges.Full, Services: b.lastChanges.Services.Clone()}, true
}

// LastResult returns what the last Apply returned.
func (b *Backend) LastResult() dataplane.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.lastResult
	r.Failed = maps.Clone(r.Failed)
	return r
}

// Programmed returns a copy of what a real backend would have programmed after the
// applies so far: the desired state of each Service as of the last apply that was asked
// to program it and did not fail. When the sync loop passes correct Changes and no
// failure is injected, it equals the last desired state.
func (b *Backend) Programmed() *model.NodeState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.programmed.Clone()
}

// Applies returns the number of Apply calls so far, and how many of them were full.
func (b *Backend) Applies() (total, full int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.applies, b.fullApplies
}

// WaitForApplies blocks until at least n Apply calls have happened in total, or ctx ends.
func (b *Backend) WaitForApplies(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		done, wake := b.applies >= n, b.applied
		b.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d applies: %w", n, ctx.Err())
		case <-wake:
		}
	}
}

// View returns the JSON view of the last desired state, and false if there has been no
// Apply.
func (b *Backend) View() (model.StateView, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		return model.StateView{}, false
	}
	return b.last.View(), true
}

// WriteJSON writes the view of the last desired state to w as indented JSON followed by a
// newline (an empty state of the family if there has been no Apply).
func (b *Backend) WriteJSON(w io.Writer) error {
	v, ok := b.View()
	if !ok {
		v = model.NewNodeState(b.family, model.NodeInfo{}).View()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s state as JSON: %w", b.family, err)
	}
	return nil
}
