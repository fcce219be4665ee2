package errtest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
)

// recorder is a testing.TB that records the failure Want reports instead of failing the test.
type recorder struct {
	testing.TB
	failure string // what Fatalf was given; empty when Want returned without failing
}

func (r *recorder) Helper() {}

// Fatalf records the failure and ends the goroutine, as t.Fatalf ends a test's.
func (r *recorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// want runs Want on a recorder in a goroutine of its own, and says what it returned and
// how it failed.
func want(t *testing.T, err error, wantErr string) (wanted bool, failure string) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wanted = Want(r, err, wantErr)
	}()
	<-done
	return wanted, r.failure
}

func TestWantChecksTheErrorARowAsksFor(t *testing.T) {
	for _, tt := range []struct {
		name        string
		err         error
		wantErr     string
		wantWanted  bool
		wantFailure string // "" when Want must not fail
	}{
		{name: "no error wanted, none returned"},
		{name: "no error wanted, one returned", err: errors.New("boom"), wantFailure: "unexpected error: boom"},
		{name: "an error wanted and returned", err: errors.New("decoding Service a: boom"), wantErr: "Service a", wantWanted: true},
		{name: "an error wanted, none returned", wantErr: "Service a", wantFailure: `error <nil>, want one containing "Service a"`},
		{name: "an error wanted, another returned", err: errors.New("boom"), wantErr: "Service a", wantFailure: `error boom, want one containing "Service a"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wanted, failure := want(t, tt.err, tt.wantErr)
			if failure != tt.wantFailure {
				t.Errorf("failure %q, want %q", failure, tt.wantFailure)
			}
			if tt.wantFailure == "" && wanted != tt.wantWanted {
				t.Errorf("Want = %v, want %v", wanted, tt.wantWanted)
			}
		})
	}
}
