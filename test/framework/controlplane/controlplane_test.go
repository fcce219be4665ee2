package controlplane

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// unreachable is a transport that never connects: these tests use no network.
type unreachable struct{}

func (unreachable) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused (test)")
}

func TestWaitReadyReportsAnEarlyExitWithTheLog(t *testing.T) {
	p, err := startProcess("fake-apiserver", "/bin/sh", []string{"-c", "echo 'error: bad flag --foo' >&2; exit 1"}, filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	err = waitReady(t.Context(), p, 10*time.Second, "https://127.0.0.1:1/readyz", &http.Client{Transport: unreachable{}}, func(int, string) bool { return true })
	if err == nil {
		t.Fatal("no error for a process that exited")
	}
	for _, want := range []string{"fake-apiserver exited: exit status 1 during start-up", "error: bad flag --foo"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestWaitReadyRecognisesAPortTakenMeanwhile(t *testing.T) {
	p, err := startProcess("etcd", "/bin/sh", []string{"-c", "echo 'listen tcp 127.0.0.1:2379: bind: address already in use' >&2; exit 1"}, filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	err = waitReady(t.Context(), p, 10*time.Second, "http://127.0.0.1:1/health", &http.Client{Transport: unreachable{}}, func(int, string) bool { return true })
	if !errors.Is(err, errAddressInUse) {
		t.Errorf("error = %v, want errAddressInUse (so the caller retries with other ports)", err)
	}
}

func TestWaitReadyTimeoutCarriesTheLastAnswerAndLog(t *testing.T) {
	p, err := startProcess("slow", "/bin/sh", []string{"-c", "echo still-starting; sleep 30"}, filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.stop(time.Second) }()
	time.Sleep(100 * time.Millisecond) // let it write its line
	err = waitReady(context.Background(), p, 300*time.Millisecond, "https://127.0.0.1:1/readyz", &http.Client{Transport: unreachable{}}, func(int, string) bool { return true })
	if err == nil {
		t.Fatal("no error after the timeout")
	}
	for _, want := range []string{"slow not ready after", "connection refused (test)", "still-starting"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
