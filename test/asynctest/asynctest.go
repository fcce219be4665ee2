// Package asynctest has helpers for tests of code that runs goroutines: stopping a loop and
// checking how it returns, and a log that goroutines append to and the test takes from.
package asynctest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// StopWithin is how long Stop waits for a loop to return after its context is cancelled.
const StopWithin = 5 * time.Second

// Stop cancels the context of a loop started as done <- loop(ctx) and checks that it
// returns nil within StopWithin; what names the loop in failures ("Loop", "Run").
func Stop(t testing.TB, what string, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s returned %v after cancel, want nil", what, err)
		}
	case <-time.After(StopWithin):
		t.Fatalf("%s did not return after cancel", what)
	}
}

// StoppedDuringWork checks how a loop returns when its context was cancelled while it was
// doing a piece of work (a run, a sync). When cut is true the work was cut short, and the
// loop must return within wait. Otherwise the work goes on: the loop must not return within
// wait, and once release lets the work finish it must return nil. what names the loop in
// failures ("Loop", "Run"), work the piece of work ("run", "sync").
func StoppedDuringWork(t testing.TB, what, work string, done <-chan error, wait time.Duration, cut bool, release func()) {
	t.Helper()
	select {
	case err := <-done:
		if !cut {
			t.Fatalf("%s returned (%v) while the %s was still going", what, err, work)
		}
	case <-time.After(wait):
		if cut {
			t.Fatalf("%s did not return after its %s was cancelled", what, work)
		}
		release()
		if err := <-done; err != nil {
			t.Fatalf("%s returned %v", what, err)
		}
	}
}

// Log is a list that goroutines append to and a test takes from; the zero Log is empty
// and ready.
type Log[T any] struct {
	mu    sync.Mutex
	items []T
}

// Add appends x.
func (l *Log[T]) Add(x T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.items = append(l.items, x)
}

// Take returns what was added since the last Take, oldest first, and empties the log.
func (l *Log[T]) Take() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.items
	l.items = nil
	return out
}
