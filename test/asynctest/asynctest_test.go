package asynctest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestLogTakesWhatWasAddedSinceTheLastTake(t *testing.T) {
	var l Log[int]
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); l.Add(i) }()
	}
	wg.Wait()
	got := l.Take()
	slices.Sort(got)
	if !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Errorf("Take = %v, want 0..9", got)
	}
	if got := l.Take(); got != nil {
		t.Errorf("second Take = %v, want nothing", got)
	}
}

func TestStopReturnsOnceTheLoopHasReturned(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { <-ctx.Done(); done <- nil }()
	Stop(t, "loop", cancel, done)
}

// TestStoppedDuringWork: the two ways a loop stopped during its work may end, each passing.
func TestStoppedDuringWork(t *testing.T) {
	t.Run("work finishes, then the loop returns", func(t *testing.T) {
		done, release := make(chan error, 1), make(chan struct{})
		go func() { <-release; done <- nil }()
		StoppedDuringWork(t, "loop", "work", done, 10*time.Millisecond, false, func() { close(release) })
	})
	t.Run("work cut short, the loop returns at once", func(t *testing.T) {
		done := make(chan error, 1)
		done <- context.Canceled
		StoppedDuringWork(t, "loop", "work", done, time.Second, true, func() { t.Error("release called") })
	})
}
