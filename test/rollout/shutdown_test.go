//go:build e2e

package rollout

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gatedRestore puts, in a new directory, an iptables-restore and an ip6tables-restore that
// run the real ones, except while the file gate in that directory holds a string that their
// input contains: then they first create the file held and wait for gate to go (at most a
// minute). It returns the directory; run sluice with it first in PATH.
func gatedRestore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"iptables-restore", "ip6tables-restore"} {
		real, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		script := fmt.Sprintf(`#!/bin/sh
[ -s %[1]s/gate ] || exec %[2]s "$@"
in=%[1]s/input.$$
cat > "$in"
if grep -qF -f %[1]s/gate "$in"; then
  : > %[1]s/held
  i=0
  while [ -e %[1]s/gate ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
%[2]s "$@" < "$in"
rc=$?
rm -f "$in"
exit $rc
`, dir, real)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// waitFile waits until path exists.
func waitFile(t *testing.T, s *Sluice, path string) {
	t.Helper()
	deadline := time.Now().Add(convergeTimeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		s.RequireRunning(t)
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared\n%s", path, s.Proc.Tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SIGTERM (the kubelet stopping the pod, a DaemonSet rollout) while a sync is writing the
// kernel: sluice lets that sync finish, exits 0, and leaves every rule in place, so the
// Service whose change the sync was applying and the ones before it are served with no
// sluice running. The sync is held inside iptables-restore (a wrapper that waits while
// the test says so), so SIGTERM lands in it every time. iptables mode only: the nftables
// backend writes over netlink, with no program to hold.
func TestSIGTERMLetsTheSyncInProgressFinish(t *testing.T) {
	env := NewEnv(t)
	gate := gatedRestore(t)
	node := env.RegisterNode(t, nodeName("sigterm", "iptables"), NodeOptions{PodCIDRs: true})
	s := env.StartSluice(t, SluiceOptions{Node: node, Config: env.Config(t, node, "iptables", nil),
		Wrap: []string{"env", "PATH=" + gate + ":" + os.Getenv("PATH")}})
	s.WaitSynced(t)
	before := env.EchoService(t, node)
	env.ExpectServed(t, s, before)

	// Hold the first ip6tables-restore that programs the next Service with its IPv6
	// endpoint (a0's jump rule's comment names both): the sync held is the one that makes
	// it answer, not an earlier one that saw the Service before its EndpointSlices, and
	// the IPv4 slice, created before the IPv6 one, is programmed by then.
	ns := env.NewNamespaceName()
	pattern := fmt.Sprintf("%s/echo:tcp -> %s", ns, netip.AddrPortFrom(env.Server.IPv6, echoPort))
	if err := os.WriteFile(filepath.Join(gate, "gate"), []byte(pattern+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inFlight := env.EchoServiceIn(t, node, ns)
	waitFile(t, s, filepath.Join(gate, "held")) // that sync is inside iptables-restore
	if err := syscall.Kill(s.Proc.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.WaitLog(t, `"Stopping; letting the run in progress finish first"`)
	time.Sleep(time.Second)
	s.RequireRunning(t) // still waiting for the sync, not gone
	if err := os.Remove(filepath.Join(gate, "gate")); err != nil {
		t.Fatal(err)
	}
	if code := s.WaitExit(t, convergeTimeout); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0\n%s", code, s.Proc.Tail(30))
	}
	if log := s.Log(); strings.Contains(log, "did not finish within the stop grace period") {
		t.Errorf("the sync in progress was cancelled:\n%s", s.Proc.Tail(30))
	}

	// No sluice runs now: what serves is what it left in the kernel.
	env.ExpectServed(t, nil, inFlight)
	env.ExpectServed(t, nil, before)
}
