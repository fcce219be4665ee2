package reexec

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestRunPatternSelectsExactlyTheTest(t *testing.T) {
	for _, tt := range []struct {
		name    string
		matches []string
		not     []string
	}{
		{name: "TestA", matches: []string{"TestA"}, not: []string{"TestAB", "XTestA"}},
		{name: "TestA/sub_(x)", matches: []string{"TestA", "sub_(x)"}, not: []string{"sub_x"}},
	} {
		pattern := RunPattern(tt.name)
		parts := strings.Split(pattern, "/")
		for i, m := range tt.matches {
			if !regexp.MustCompile(parts[i]).MatchString(m) {
				t.Errorf("%s: level %d pattern %q does not match %q", tt.name, i, parts[i], m)
			}
		}
		for _, n := range tt.not {
			matched := false
			for _, p := range parts {
				matched = matched || regexp.MustCompile(p).MatchString(n)
			}
			if matched {
				t.Errorf("%s: pattern %q matches %q", tt.name, pattern, n)
			}
		}
	}
}

func TestPassedWantsTheTestsOwnPassLine(t *testing.T) {
	for _, tt := range []struct {
		output, name string
		want         bool
	}{
		{"=== RUN   TestA\n--- PASS: TestA (0.01s)\nPASS\n", "TestA", true},
		{"testing: warning: no tests to run\nPASS\n", "TestA", false},
		{"=== RUN   TestA\n    a_test.go:1: needs root\n--- SKIP: TestA (0.00s)\nPASS\n", "TestA", false},
		{"--- PASS: TestAB (0.01s)\n", "TestA", false},
		{"    --- PASS: TestA/x (0.01s)\n--- PASS: TestA (0.01s)\n", "TestA/x", true},
		{"  | --- PASS: TestA (0.01s)\n", "TestA", false}, // a grandchild's line logged by the child
	} {
		if got := Passed(tt.output, tt.name); got != tt.want {
			t.Errorf("Passed(%q, %s) = %v, want %v", tt.output, tt.name, got, tt.want)
		}
	}
}

const envChild = "SLUICE_REEXEC_TEST_CHILD"

// TestRunChecksTheChildRanTheTest re-executes itself: the child passes, and Run sees that.
func TestRunChecksTheChildRanTheTest(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Log("in the child")
		return
	}
	Run(t, nil, []string{envChild + "=1"})
}
