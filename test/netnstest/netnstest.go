// Package netnstest runs a package's kernel tests inside a network namespace of their own.
//
// A Go process cannot move all its threads into another network namespace after start, and
// a backend may exec iptables-restore or open netlink sockets from any goroutine. So instead
// of switching namespaces per test, Main re-executes the test binary under `unshare --net`:
// the whole process, every goroutine and every child it execs, then lives in a fresh
// namespace that disappears when the process exits. Nothing a test does can reach the root
// namespace's rules or routes, and nothing is left behind even when a test crashes.
//
// Use it from TestMain in files built with the kernel tag:
//
//	//go:build kernel
//	func TestMain(m *testing.M) { netnstest.Main(m) }
package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const (
	envMarker = "SLUICE_TEST_IN_NETNS"
	// envReport names the file where the re-executed process writes the status m.Run
	// returned: the proof that the child reached the tests rather than exiting early.
	envReport = "SLUICE_TEST_NETNS_REPORT"
)

// Main runs m inside a new network namespace with loopback up, re-executing the test binary
// there if needed, and exits with the tests' status. It fails (rather than skips) when not
// run as root: the kernel build tag asks for these tests explicitly.
func Main(m *testing.M) {
	if os.Getenv(envMarker) == "" {
		if os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "netnstest: kernel tests need root (they create network namespaces)")
			os.Exit(1)
		}
		os.Exit(reexec())
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "netnstest: bringing up loopback: %v: %s\n", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if report := os.Getenv(envReport); report != "" {
		if err := os.WriteFile(report, []byte(strconv.Itoa(code)), 0o600); err != nil {
			fmt.Fprintf(os.Stderr, "netnstest: writing the run report: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(code)
}

// reexec runs this test binary again under `unshare --net` and returns the exit status to
// leave with. A child that exits 0 without having run m.Run (an early os.Exit in an init
// or TestMain path) would look like a passing package; the report file it writes after
// m.Run tells the two apart.
func reexec() int {
	dir, err := os.MkdirTemp("", "netnstest-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "netnstest: %v\n", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	report := filepath.Join(dir, "status")
	args := append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)
	cmd := exec.Command("unshare", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envMarker+"=1", envReport+"="+report)
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "netnstest: re-executing in a new network namespace: %v\n", err)
		return 1
	}
	b, err := os.ReadFile(report)
	if err != nil || strings.TrimSpace(string(b)) != "0" {
		fmt.Fprintf(os.Stderr, "netnstest: the test binary re-executed in a new network namespace exited 0 without "+
			"running its tests to a status of 0 (report %q: %v)\n", b, err)
		return 1
	}
	return 0
}

// InNetns reports whether the process runs in the private namespace Main created.
func InNetns() bool { return os.Getenv(envMarker) != "" }
