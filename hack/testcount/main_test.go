package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// fixtureOutput runs the fixture module in testdata/fixture once with go test -json and
// returns each package's events ("fixture/pass": four pass, two skip; "fixture/fail": three
// pass, one fails, two skip).
var fixtureOutput = sync.OnceValues(func() (map[string][]byte, error) {
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = "testdata/fixture"
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	raw, err := cmd.Output()
	if len(raw) == 0 {
		return nil, fmt.Errorf("go test -json in testdata/fixture: %w", err)
	}
	byPkg := map[string][]byte{}
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		var ev event
		if json.Unmarshal(line, &ev) == nil && ev.Package != "" {
			byPkg[ev.Package] = append(byPkg[ev.Package], line...)
		}
	}
	return byPkg, nil
})

// runFixture feeds one fixture package's real output to testcount: its go test -json events,
// or with text the -test.v output they carry (what a test binary prints, the IPVS VM's way).
func runFixture(t *testing.T, text, fail bool, floor int) (ok bool, c counter, out string) {
	t.Helper()
	byPkg, err := fixtureOutput()
	if err != nil {
		t.Fatal(err)
	}
	pkg := "fixture/pass"
	if fail {
		pkg = "fixture/fail"
	}
	input := byPkg[pkg]
	if text {
		var plain bytes.Buffer
		for _, line := range bytes.SplitAfter(input, []byte("\n")) {
			var ev event
			if json.Unmarshal(line, &ev) == nil && ev.Action == "output" {
				plain.WriteString(ev.Output)
			}
		}
		input = plain.Bytes()
	}
	var w bytes.Buffer
	if text {
		err = c.readText(bytes.NewReader(input), &w)
	} else {
		err = c.readJSON(bytes.NewReader(input), &w, false)
	}
	if err != nil {
		t.Fatal(err)
	}
	ok = c.report(&w, "fixture", floor)
	return ok, c, w.String()
}

func TestCountsAndFloors(t *testing.T) {
	for _, tt := range []struct {
		name       string
		text, fail bool
		floor      int
		wantOK     bool
		wantPassed int
		wantFailed int
		wantOut    []string
		wantNot    []string
	}{
		{name: "json, all pass, floor met", floor: 4, wantOK: true, wantPassed: 4,
			wantOut: []string{"ok  \tfixture/pass", "fixture: 4 passed, 0 failed, 2 skipped (floor 4)",
				"skipped fixture/pass TestSub/b: ", "no b here", "skipped fixture/pass TestSkip: ", "kernel has no frobnicator"},
			wantNot: []string{"a line a passing test logs", "=== RUN", "setting up b"}},
		{name: "json, floor above the count", floor: 5, wantPassed: 4,
			wantOut: []string{"4 tests passed, fewer than the tier's floor of 5"}},
		{name: "json, a failure", fail: true, floor: 1, wantPassed: 3, wantFailed: 1,
			wantOut: []string{"boom", "--- FAIL: TestFails", "FAIL\tfixture/fail"},
			wantNot: []string{"failed outside any test"}},
		{name: "text, all pass, floor met", text: true, floor: 4, wantOK: true, wantPassed: 4,
			wantOut: []string{"=== RUN   TestPass", "a line a passing test logs", "skipped TestSkip: ", "kernel has no frobnicator", "skipped TestSub/b: "}},
		{name: "text, floor above the count", text: true, floor: 10, wantPassed: 4,
			wantOut: []string{"fewer than the tier's floor of 10"}},
		{name: "text, a failure", text: true, fail: true, wantPassed: 3, wantFailed: 1,
			wantOut: []string{"boom", "1 failed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ok, c, out := runFixture(t, tt.text, tt.fail, tt.floor)
			if ok != tt.wantOK || c.passed != tt.wantPassed || c.failed != tt.wantFailed || len(c.skipped) != 2 {
				t.Errorf("ok %v, %d passed, %d failed, skipped %q; want ok %v, %d passed, %d failed, 2 skipped\n%s",
					ok, c.passed, c.failed, c.skipped, tt.wantOK, tt.wantPassed, tt.wantFailed, out)
			}
			for _, want := range tt.wantOut {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			for _, not := range tt.wantNot {
				if strings.Contains(out, not) {
					t.Errorf("output has %q:\n%s", not, out)
				}
			}
		})
	}
}

func TestBrokenRunsFail(t *testing.T) {
	for _, tt := range []struct {
		name, input string
		text        bool
		wantOut     string
	}{
		{name: "no test at all", input: `{"Action":"output","Package":"p","Output":"ok  \tp\t0.1s [no tests to run]\n"}` + "\n" +
			`{"Action":"pass","Package":"p"}` + "\n", wantOut: "holds no test at all"},
		{name: "package failed outside a test", input: `{"Action":"run","Package":"p","Test":"TestA"}` + "\n" +
			`{"Action":"pass","Package":"p","Test":"TestA"}` + "\n" +
			`{"Action":"output","Package":"p","Output":"panic: in TestMain\n"}` + "\n" +
			`{"Action":"fail","Package":"p"}` + "\n", wantOut: "package p failed outside any test"},
		{name: "a test that never ended", input: `{"Action":"run","Package":"p","Test":"TestA"}` + "\n" +
			`{"Action":"output","Package":"p","Test":"TestA","Output":"still waiting\n"}` + "\n" +
			`{"Action":"fail","Package":"p"}` + "\n", wantOut: "p TestA did not finish; its output:\nstill waiting"},
		{name: "text without results", text: true, input: "testing: warning: no tests to run\nPASS\n", wantOut: "holds no test at all"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c counter
			var w bytes.Buffer
			var err error
			if tt.text {
				err = c.readText(strings.NewReader(tt.input), &w)
			} else {
				err = c.readJSON(strings.NewReader(tt.input), &w, false)
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.report(&w, "t", 0) {
				t.Errorf("report says ok:\n%s", w.String())
			}
			if !strings.Contains(w.String(), tt.wantOut) {
				t.Errorf("output lacks %q:\n%s", tt.wantOut, w.String())
			}
		})
	}
}
