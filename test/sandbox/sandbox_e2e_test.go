//go:build e2e

package sandbox_test

// The sandbox end to end, as a user runs it: hack/demo.sh up --once in each mode (the
// printed traffic lines must show the answers each Service must give), then up followed
// by hack/demo.sh down from another process, and down after the sandbox was killed. After
// each, nothing of the sandbox may be left: network namespaces, links (the root bridge
// included), processes, the run directory.
//
// The test binary runs in a network namespace of its own (netnstest.Main), so the
// sandbox's "root" bridge is in that namespace and the machine's is never touched. It
// needs root, Go, and kube-apiserver and etcd (hack/control-plane.sh, or $KUBE_APISERVER
// and $ETCD as hack/test-e2e.sh exports them).

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/netnstest"
	"github.com/sluiceproxy/sluice/test/require"
	"github.com/sluiceproxy/sluice/test/sandbox"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

// repoRoot is where hack/demo.sh is.
func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hack", "demo.sh")); err != nil {
		t.Fatal(err)
	}
	return root
}

// demo returns the command hack/demo.sh ARGS with the sandbox's environment.
func demo(t *testing.T, ctx context.Context, runDir, mode string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "hack", "demo.sh"), args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "SLUICE_DEMO_DIR="+runDir, "MODE="+mode)
	return cmd
}

// expectedLines are the traffic lines every run must print: client, target, and what the
// line must say after "ok".
var expectedLines = []struct{ client, target, result string }{
	{"pod a0 (node-a)", "tcp 10.96.100.10:80", "answered by"},
	{"pod a0 (node-a)", "udp 10.96.100.10:80", "answered by"},
	{"node node-b", "tcp 10.96.100.10:80", "answered by"},
	{"external 172.18.0.100", "tcp 172.18.0.2:30080", "answered by"},
	{"pod b0 (node-b)", "tcp 172.18.0.2:30080", "answered by"},
	{"node node-b", "tcp 172.18.0.2:30080", "answered by"},
	{"external 172.18.0.100", "tcp 192.0.2.10:80", "answered by"},
	{"pod b0 (node-b)", "tcp 192.0.2.10:80", "answered by"},
	{"external 172.18.0.100", "tcp 192.0.2.11:80", "answered by a1 (4/4)"},
	{"external 172.18.0.100", "tcp 172.18.0.3:30082", "timeout (2/2)"},
	{"pod b0 (node-b)", "tcp 192.0.2.11:80", "answered by a1 (4/4)"},
	{"pod a0 (node-a)", "tcp 10.96.100.14:80", "answered by"},
	{"node node-b", "tcp 10.96.100.14:80", "answered by"},
}

// checkTraffic checks the printed table line by line.
func checkTraffic(t *testing.T, out string) {
	t.Helper()
	if strings.Contains(out, " FAIL ") {
		t.Errorf("a traffic line failed:\n%s", out)
	}
	for _, want := range expectedLines {
		re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(want.client) + ` +-> ` + regexp.QuoteMeta(want.target) + ` +ok +` + regexp.QuoteMeta(want.result))
		if !re.MatchString(out) {
			t.Errorf("no line %q -> %q ok %q in the output", want.client, want.target, want.result)
		}
	}
	// The sticky Service: one pod per client. externalTrafficPolicy Local: the client's
	// address is kept.
	for _, re := range []string{
		`(?m)^  pod a0 \(node-a\) +-> tcp 10\.96\.100\.14:80 +ok +answered by [ab][01] \(8/8\)$`,
		`(?m)^  node node-b +-> tcp 10\.96\.100\.14:80 +ok +answered by [ab][01] \(8/8\)$`,
		`pods saw 172\.18\.0\.100 \(external\); node-a's own pod`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("the output does not match %s", re)
		}
	}
}

var netnsRe = regexp.MustCompile(`netns slct-(\d+)-\d+-node-a`)

// sandboxPID finds the sandbox's process id in its output (its namespaces carry it).
func sandboxPID(t *testing.T, out string) int {
	t.Helper()
	m := netnsRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no node-a namespace in the output:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// checkNothingLeft checks that nothing of the sandbox with that pid and run directory
// exists any more.
func checkNothingLeft(t *testing.T, pid int, runDir string) {
	t.Helper()
	st := &sandbox.State{PID: pid, RunDir: runDir,
		NetnsPrefix: fmt.Sprintf("slct-%d-", pid), LinkPrefix: fmt.Sprintf("slct%06x", pid)}
	if left := sandbox.Leftovers(st); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("the sandbox process %d still runs", pid)
	}
	// Every process the sandbox started ran a binary copied into, or a file written in,
	// its run directory; the namespaces' processes die with the namespaces (checked above).
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	if bytes.Contains(out, []byte(st.LinkPrefix)) {
		t.Errorf("links of the sandbox remain:\n%s", out)
	}
}

func TestSandboxOnceShowsEveryServiceAndLeavesNothing(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			runDir := filepath.Join(t.TempDir(), "run")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := demo(t, ctx, runDir, mode, "up", "--once")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			outBytes, err := cmd.Output()
			out := string(outBytes)
			t.Logf("hack/demo.sh up --once (MODE=%s):\n%s", mode, out)
			if err != nil {
				t.Fatalf("hack/demo.sh up --once: %v\n%s", err, stderr.String())
			}
			checkTraffic(t, out)
			for _, want := range []string{"sluice sandbox, " + mode + " mode", "sluice status    # the default --server 127.0.0.1", "sluice explain demo/web-local",
				"export KUBECONFIG=" + runDir + "/kubeconfig", "Torn down in"} {
				if !strings.Contains(out, want) {
					t.Errorf("the output lacks %q", want)
				}
			}
			checkNothingLeft(t, sandboxPID(t, out), runDir)
		})
	}
}

// startSandbox runs hack/demo.sh up in the background and returns once it is up, with the
// output so far, the command, and a function returning the whole output once it ended.
func startSandbox(t *testing.T, runDir string) (*exec.Cmd, string, func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	cmd := demo(t, ctx, runDir, "nftables", "up")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	up := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if !signalled && strings.HasPrefix(sc.Text(), "The sandbox stays up.") {
				signalled = true
				close(up)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-up:
	case <-done:
		_ = cmd.Wait()
		t.Fatalf("the sandbox ended before it was up:\n%s\n%s", out.String(), stderr.String())
	case <-time.After(5 * time.Minute):
		t.Fatalf("the sandbox was not up after 5 minutes:\n%s\n%s", out.String(), stderr.String())
	}
	return cmd, out.String(), func() string { <-done; return out.String() + stderr.String() }
}

func TestSandboxDownFromAnotherShell(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	cmd, out, rest := startSandbox(t, runDir)
	checkTraffic(t, out)
	pid := sandboxPID(t, out)
	if _, err := os.Stat(filepath.Join(runDir, sandbox.StateFile)); err != nil {
		t.Errorf("no state file while up: %v", err)
	}

	downOut, err := demo(t, context.Background(), runDir, "", "down").CombinedOutput()
	t.Logf("hack/demo.sh down:\n%s", downOut)
	if err != nil {
		t.Fatalf("hack/demo.sh down: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("the sandbox exited with %v after down:\n%s", err, rest())
	}
	if all := rest(); !strings.Contains(all, "Torn down in") {
		t.Errorf("the sandbox did not tear itself down:\n%s", all)
	}
	checkNothingLeft(t, pid, runDir)
}

func TestSandboxDownAfterTheSandboxWasKilled(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	cmd, out, _ := startSandbox(t, runDir)
	pid := sandboxPID(t, out)
	if cmd.Process.Pid != pid {
		t.Fatalf("hack/demo.sh should exec the sandbox: pid %d, sandbox %d", cmd.Process.Pid, pid)
	}
	// SIGKILL: no tear-down runs; its children die with it, its namespaces stay.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if left := sandbox.Leftovers(&sandbox.State{PID: pid, RunDir: runDir, NetnsPrefix: fmt.Sprintf("slct-%d-", pid), LinkPrefix: fmt.Sprintf("slct%06x", pid)}); len(left) == 0 {
		t.Fatal("a killed sandbox left nothing: the test proves nothing")
	}
	downOut, err := demo(t, context.Background(), runDir, "", "down").CombinedOutput()
	t.Logf("hack/demo.sh down:\n%s", downOut)
	if err != nil {
		t.Fatalf("hack/demo.sh down: %v", err)
	}
	if !strings.Contains(string(downOut), "is gone; removing what it left") {
		t.Errorf("down did not notice the sandbox was gone")
	}
	checkNothingLeft(t, pid, runDir)
}

func TestSandboxIPVSWithoutIPVSFailsAtOnce(t *testing.T) {
	hasIPVS := func() bool { _, err := os.Stat("/proc/net/ip_vs"); return err == nil }
	if !hasIPVS() {
		_ = exec.Command("modprobe", "-q", "ip_vs").Run()
	}
	require.Feature(t, require.NoIPVS, !hasIPVS(), "this kernel has IPVS")
	runDir := filepath.Join(t.TempDir(), "run")
	start := time.Now()
	out, err := demo(t, context.Background(), runDir, "ipvs", "up", "--once").CombinedOutput()
	if err == nil {
		t.Fatalf("MODE=ipvs succeeded without IPVS:\n%s", out)
	}
	for _, want := range []string{"MODE=ipvs needs a kernel with IPVS (the ip_vs module)", "MODE=nftables or MODE=iptables", "make test-ipvs"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the message lacks %q:\n%s", want, out)
		}
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("failing took %s: it should fail before building anything", elapsed)
	}
	if _, err := os.Stat(runDir); err == nil {
		t.Errorf("MODE=ipvs created %s", runDir)
	}
}
