package sandbox

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// runTB lets a program (not a test) use the test helpers the sandbox is built from
// (test/topology takes a testing.TB): logs go to a function, Fatal unwinds to catch, and
// Cleanup functions run when the sandbox closes.
//
// testing.TB has an unexported method, so only an embedded TB satisfies the interface; it
// stays nil, and a helper calling a method not overridden here panics loudly instead of
// misbehaving quietly. test/topology uses Helper, Logf, Errorf, Fatal(f), Cleanup and
// Failed.
type runTB struct {
	testing.TB

	logf  func(format string, args ...any)
	warnf func(format string, args ...any)
	ctx   context.Context

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	// errors counts Error calls (not Fatal ones), so that a caller can tell whether the
	// cleanups reported any.
	errors int
}

// fatalError is what Fatal unwinds with; catch turns it back into an error.
type fatalError struct{ err error }

// newRunTB returns a TB whose Log goes to logf and Error to warnf.
func newRunTB(ctx context.Context, logf, warnf func(string, ...any)) *runTB {
	return &runTB{ctx: ctx, logf: logf, warnf: warnf}
}

func (t *runTB) Helper()                  {}
func (t *runTB) Name() string             { return "sandbox" }
func (t *runTB) Context() context.Context { return t.ctx }
func (t *runTB) Log(args ...any)          { t.logf("%s", fmt.Sprint(args...)) }
func (t *runTB) Logf(f string, args ...any) {
	t.logf(f, args...)
}

func (t *runTB) Error(args ...any) { t.Errorf("%s", fmt.Sprint(args...)) }
func (t *runTB) Errorf(f string, args ...any) {
	t.mu.Lock()
	t.failed = true
	t.errors++
	t.mu.Unlock()
	t.warnf("error: "+f, args...)
}

func (t *runTB) Fatal(args ...any) { t.Fatalf("%s", fmt.Sprint(args...)) }
func (t *runTB) Fatalf(f string, args ...any) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	panic(fatalError{fmt.Errorf(f, args...)})
}
func (t *runTB) FailNow() { t.Fatal("FailNow") }
func (t *runTB) Fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *runTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *runTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

func (t *runTB) TempDir() string {
	dir, err := os.MkdirTemp("", "sandbox-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runCleanups runs the Cleanup functions, newest first, as testing does. A panic in one
// (a Fatal) is logged and the others still run. It returns how many errors they reported.
func (t *runTB) runCleanups() int {
	t.mu.Lock()
	before := t.errors
	t.mu.Unlock()
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			errs := t.errors - before
			t.mu.Unlock()
			return errs
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		if err := catch(f); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// catch runs f and returns the error a Fatal inside it unwound with. Other panics go on.
func catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = fe.err
		}
	}()
	f()
	return nil
}
