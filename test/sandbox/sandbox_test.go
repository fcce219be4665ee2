package sandbox

// Unit tests of the sandbox's pure parts: the TB adapter, the traffic expectations and
// table, the state file. The sandbox itself is tested end to end in sandbox_e2e_test.go.

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

func TestRunTBFatalUnwindsAndCleanupsRunNewestFirst(t *testing.T) {
	var logs, warnings []string
	tb := newRunTB(context.Background(),
		func(f string, a ...any) { logs = append(logs, f) },
		func(f string, a ...any) { warnings = append(warnings, f) })
	var order []int
	tb.Cleanup(func() { order = append(order, 1) })
	tb.Cleanup(func() { tb.Errorf("cleanup two failed") })
	tb.Cleanup(func() { order = append(order, 3); tb.Fatal("cleanup three died") })

	err := catch(func() {
		tb.Logf("building")
		tb.Fatalf("broke at step %d", 2)
		t.Error("Fatalf returned")
	})
	if err == nil || err.Error() != "broke at step 2" || !tb.Failed() {
		t.Errorf("catch = %v, Failed = %v", err, tb.Failed())
	}
	if n := tb.runCleanups(); n != 2 {
		t.Errorf("runCleanups reported %d errors, want 2 (an Errorf and a Fatal)", n)
	}
	if len(order) != 2 || order[0] != 3 || order[1] != 1 {
		t.Errorf("cleanups ran in order %v, want [3 1]", order)
	}
	if len(logs) != 1 || len(warnings) != 2 {
		t.Errorf("logs %v, warnings %v", logs, warnings)
	}
	if n := tb.runCleanups(); n != 0 {
		t.Errorf("a second runCleanups reported %d errors", n)
	}
}

func TestCatchLetsOtherPanicsThrough(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recovered %v, want the original panic", r)
		}
	}()
	_ = catch(func() { panic("boom") })
}

func answered(pod, remote string) echo.Outcome {
	return echo.Outcome{Result: echo.Answered, Reply: echo.Reply{Pod: pod, Remote: netip.MustParseAddrPort(remote)}}
}

func TestProbeExpectations(t *testing.T) {
	ext := netip.MustParseAddr("172.18.0.100")
	tests := []struct {
		name     string
		c        probeCase
		outcomes []echo.Outcome
		wantWhy  string // "" when ok
	}{
		{
			name:     "answers from allowed pods",
			c:        probeCase{wantResult: echo.Answered, wantPods: []string{"a0", "b0"}},
			outcomes: []echo.Outcome{answered("a0", "10.244.1.10:4000"), answered("b0", "10.244.1.10:4001")},
		},
		{
			name:     "an answer from another pod",
			c:        probeCase{wantResult: echo.Answered, wantPods: []string{"a1"}},
			outcomes: []echo.Outcome{answered("a1", "1.2.3.4:1"), answered("b1", "1.2.3.4:2")},
			wantWhy:  "try 2: answered by b1, not one of [a1]",
		},
		{
			name:     "a source that should have been kept",
			c:        probeCase{wantResult: echo.Answered, wantPods: []string{"a1"}, wantSources: []netip.Addr{ext}},
			outcomes: []echo.Outcome{answered("a1", "172.18.0.2:1")},
			wantWhy:  "saw source 172.18.0.2, want one of [172.18.0.100]",
		},
		{
			name:     "affinity broken",
			c:        probeCase{wantResult: echo.Answered, wantPods: []string{"a0", "b0"}, sticky: true},
			outcomes: []echo.Outcome{answered("a0", "1.2.3.4:1"), answered("b0", "1.2.3.4:2")},
			wantWhy:  "answered by 2 different pods, want one (session affinity)",
		},
		{
			name:     "a drop that is expected",
			c:        probeCase{wantResult: echo.Timeout},
			outcomes: []echo.Outcome{{Result: echo.Timeout}, {Result: echo.Timeout}},
		},
		{
			name:     "an answer where a drop is expected",
			c:        probeCase{wantResult: echo.Timeout},
			outcomes: []echo.Outcome{answered("a0", "1.2.3.4:1")},
			wantWhy:  "try 1: answered pod=a0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &probeResult{c: &tt.c, outcomes: tt.outcomes}
			ok, why := r.ok()
			if ok != (tt.wantWhy == "") || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("ok() = %v, %q; want why %q", ok, why, tt.wantWhy)
			}
		})
	}
}

func TestTrafficTableMarksEachLine(t *testing.T) {
	c1 := &probeCase{service: "web", clientName: "pod a0 (node-a)", proto: echo.TCP, target: netip.MustParseAddrPort("10.96.100.10:80"),
		wantResult: echo.Answered, wantPods: []string{"a0", "b0"}, note: "pods keep their address"}
	c2 := &probeCase{service: "web-local", clientName: "external 172.18.0.100", proto: echo.TCP, target: netip.MustParseAddrPort("172.18.0.3:30082"),
		wantResult: echo.Timeout, note: "dropped"}
	results := []*probeResult{
		{c: c1, outcomes: []echo.Outcome{answered("b0", "10.244.1.10:1"), answered("a0", "10.244.1.1:2"), answered("b0", "10.244.1.10:3")}},
		{c: c2, outcomes: []echo.Outcome{{Result: echo.Refused}, {Result: echo.Timeout}}},
	}
	var b strings.Builder
	if err := writeTraffic(&b, results, map[netip.Addr]string{netip.MustParseAddr("10.244.1.10"): "pod a0"}); err != nil {
		t.Fatal(err)
	}
	want := `
demo/web: ClusterIP: every pod on both nodes, client addresses kept for pods
  pod a0 (node-a)        -> tcp 10.96.100.10:80    ok   answered by a0 b0 (3/3)
                                                        pods saw 10.244.1.1, 10.244.1.10 (pod a0); pods keep their address

demo/web-local: externalTrafficPolicy Local, one pod (a1, on node-a): client address kept, node-b drops external traffic
  external 172.18.0.100  -> tcp 172.18.0.3:30082   FAIL refused (1/2), timeout (1/2)
                                                        try 1: refused, want timeout; dropped
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if ok, _ := allOK(results); ok {
		t.Error("allOK with a failing line")
	}
}

func TestStateFileAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	st := newState("nftables", dir)
	if err := st.write(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *st || !got.Alive() {
		t.Errorf("read back %+v (alive %v), wrote %+v", got, got.Alive(), st)
	}
	if _, err := ReadState(filepath.Join(dir, "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadState of a missing directory: %v", err)
	}
	// A state whose process and names do not exist: only the directory is left.
	gone := &State{PID: 1 << 22, RunDir: dir, NetnsPrefix: "slct-none-", LinkPrefix: "slctnone"}
	if left := Leftovers(gone); len(left) != 1 || left[0] != "directory "+dir {
		t.Errorf("Leftovers = %v", left)
	}
	if gone.Alive() {
		t.Error("a state without a process is alive")
	}
}
