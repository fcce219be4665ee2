package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// programTB lets this program use the test helpers it is built from (test/topology takes a
// testing.TB): Log goes to a function, Fatal unwinds to the nearest catchFatal, and
// Cleanup functions run at close, newest first, as in a test.
//
// testing.TB has an unexported method, so only a struct embedding a TB satisfies it. The
// embedded TB stays nil: a helper calling a method not defined here panics loudly rather
// than misbehaving quietly.
type programTB struct {
	testing.TB

	name string
	ctx  context.Context
	logf func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

// fatalUnwind is what Fatal panics with; catchFatal turns it back into an error.
type fatalUnwind struct{ err error }

func newProgramTB(ctx context.Context, name string, logf func(string, ...any)) *programTB {
	return &programTB{ctx: ctx, name: name, logf: logf}
}

func (t *programTB) Helper()                    {}
func (t *programTB) Name() string               { return t.name }
func (t *programTB) Context() context.Context   { return t.ctx }
func (t *programTB) Log(args ...any)            { t.logf("%s", fmt.Sprint(args...)) }
func (t *programTB) Logf(f string, args ...any) { t.logf(f, args...) }
func (t *programTB) Error(args ...any)          { t.Errorf("%s", fmt.Sprint(args...)) }
func (t *programTB) Fatal(args ...any)          { t.Fatalf("%s", fmt.Sprint(args...)) }
func (t *programTB) FailNow()                   { t.Fatal("FailNow") }
func (t *programTB) Fail()                      { t.setFailed() }

func (t *programTB) Errorf(f string, args ...any) {
	t.setFailed()
	t.logf("error: "+f, args...)
}

func (t *programTB) Fatalf(f string, args ...any) {
	t.setFailed()
	panic(fatalUnwind{fmt.Errorf(f, args...)})
}

func (t *programTB) setFailed() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *programTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *programTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

func (t *programTB) TempDir() string {
	dir, err := os.MkdirTemp("", "sluice-scale-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// close runs the Cleanup functions, newest first. A Fatal inside one is logged and the
// others still run.
func (t *programTB) close() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		if err := catchFatal(f); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// catchFatal runs f and returns the error a Fatal inside it unwound with. Other panics
// propagate.
func catchFatal(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fu, ok := r.(fatalUnwind)
			if !ok {
				panic(r)
			}
			err = fu.err
		}
	}()
	f()
	return nil
}
