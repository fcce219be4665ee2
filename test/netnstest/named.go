package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

var seq atomic.Int64

// NewNamed creates a named network namespace (`ip netns add`) with loopback up, and deletes
// it when the test ends. The name is unique per process: prefix-<pid>-<n>.
func NewNamed(t testing.TB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	MustRun(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// Do runs fn on an OS thread switched into the named namespace, then switches the thread
// back. Sockets fn creates stay in that namespace after Do returns, so a test can listen
// or dial "inside" a pod namespace from its own process. fn must not start goroutines that
// expect to run in the namespace.
func Do(name string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter netns %s: %w", name, err)
	}
	defer func() {
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread is in the wrong namespace; never hand it back to the scheduler.
			runtime.Goexit()
		}
	}()
	return fn()
}

// MustRun runs a command and fails the test with its output when it fails.
func MustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
