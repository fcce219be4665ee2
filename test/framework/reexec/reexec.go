// Package reexec runs a test again in a child process of its own test binary, usually
// wrapped in unshare(1) so the child lives in private namespaces, and checks that the child
// really ran that test.
//
// A child started with -test.run that matches nothing (the test was renamed, the pattern
// misquoted) runs no test and exits 0, and a child that skips exits 0 as well: the parent
// would pass having proved nothing. Run requires the child's own "--- PASS: <name>" line.
package reexec

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Run runs t's test again as `wrapper... <this test binary> -test.run=<t's name, anchored>
// -test.v -test.count=1 args...` with env added to this process's environment, logs the
// child's output, and fails t unless the child exited 0 having passed that very test. The
// caller tells the child apart from the parent by a variable in env.
func Run(t *testing.T, wrapper, env []string, args ...string) {
	t.Helper()
	argv := append(append([]string{}, wrapper...), os.Args[0], "-test.run="+RunPattern(t.Name()), "-test.v", "-test.count=1")
	argv = append(argv, args...)
	cmd := exec.CommandContext(t.Context(), argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("the child (%s):\n%s", strings.Join(argv, " "), indent(string(out)))
	if err != nil {
		t.Fatalf("the child running %s: %v", t.Name(), err)
	}
	if !Passed(string(out), t.Name()) {
		t.Fatalf("the child exited 0 but did not pass %s: it ran no such test or skipped it", t.Name())
	}
}

// RunPattern is the -test.run pattern that selects exactly the test named name (as
// t.Name() gives it, subtests separated by "/").
func RunPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// Passed reports whether -test.v output holds the result line of test name passing.
func Passed(output, name string) bool {
	depth := strings.Count(name, "/")
	want := strings.Repeat("    ", depth) + "--- PASS: " + name + " ("
	for _, line := range strings.Split(output, "\n") {
		if strings.HasPrefix(line, want) {
			return true
		}
	}
	return false
}

// indent marks the child's lines so that its result lines are not taken for the parent's
// by whoever reads the parent's output (go test -json, hack/testcount).
func indent(s string) string {
	return "  | " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  | ")
}
