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
	"fmt"
	"os"
	"os/exec"
	"testing"
)

const envMarker = "SLUICE_TEST_IN_NETNS"

// Main runs m inside a new network namespace with loopback up, re-executing the test binary
// there if needed, and exits with the tests' status. It fails (rather than skips) when not
// run as root: the kernel build tag asks for these tests explicitly.
func Main(m *testing.M) {
	if os.Getenv(envMarker) == "" {
		if os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "netnstest: kernel tests need root (they create network namespaces)")
			os.Exit(1)
		}
		args := append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)
		cmd := exec.Command("unshare", args...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), envMarker+"=1")
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				os.Exit(ee.ExitCode())
			}
			fmt.Fprintf(os.Stderr, "netnstest: re-executing in a new network namespace: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "netnstest: bringing up loopback: %v: %s\n", err, out)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// InNetns reports whether the process runs in the private namespace Main created.
func InNetns() bool { return os.Getenv(envMarker) != "" }
