package controlplane

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLastLines(t *testing.T) {
	tests := []struct {
		data string
		n    int
		want string
	}{
		{data: "a\nb\nc\n", n: 2, want: "b\nc"},
		{data: "a\nb\nc", n: 5, want: "a\nb\nc"},
		{data: "", n: 3, want: ""},
	}
	for _, tt := range tests {
		if got := lastLines([]byte(tt.data), tt.n); got != tt.want {
			t.Errorf("lastLines(%q, %d) = %q, want %q", tt.data, tt.n, got, tt.want)
		}
	}
}

func TestLogTailShowsOnlyTheCurrentRun(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	first, err := startProcess("first", "/bin/sh", []string{"-c", "echo from-first"}, log)
	if err != nil {
		t.Fatal(err)
	}
	<-first.exited
	second, err := startProcess("second", "/bin/sh", []string{"-c", "echo from-second; exit 3"}, log)
	if err != nil {
		t.Fatal(err)
	}
	<-second.exited
	tail := second.logTail(10)
	if tail != "from-second" {
		t.Errorf("tail = %q, want only the second run's output", tail)
	}
	if err := second.stop(time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("stop of a process that died = %v, want its exit status", err)
	}
	data, _ := os.ReadFile(log)
	if !strings.Contains(string(data), "from-first") || strings.Count(string(data), "==== ") != 2 {
		t.Errorf("log does not keep both runs with a header each:\n%s", data)
	}
}

func TestStopKillsTheWholeProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// The shell ignores SIGTERM, and so does its child, which inherits the disposition:
	// stop has to escalate to SIGKILL and reach the child through the process group.
	p, err := startProcess("sh", "/bin/sh", []string{"-c", "trap '' TERM; sleep 300 & echo $! > " + pidFile + "; while :; do sleep 0.05; done"}, filepath.Join(dir, "sh.log"))
	if err != nil {
		t.Fatal(err)
	}
	var childPID int
	for deadline := time.Now().Add(5 * time.Second); childPID == 0; {
		if data, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(data), "\n") {
			childPID, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
		if time.Now().After(deadline) {
			t.Fatal("shell did not start its child")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !running(childPID) {
		t.Fatalf("child %d is not running before the stop", childPID)
	}
	began := time.Now()
	if err := p.stop(200 * time.Millisecond); err != nil {
		t.Errorf("stop = %v", err)
	}
	if !p.hasExited() {
		t.Errorf("process still running after stop")
	}
	if elapsed := time.Since(began); elapsed > 5*time.Second {
		t.Errorf("stop took %s, want about the 200ms grace", elapsed)
	}
	// The child was reparented and is reaped by init; give that a moment.
	for deadline := time.Now().Add(2 * time.Second); running(childPID); {
		if time.Now().After(deadline) {
			t.Fatalf("child %d survived the stop", childPID)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// running reports whether pid exists and is not a zombie awaiting its reaper.
func running(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
