// Command testcount reads a test run's output, passes it on, counts the tests that passed,
// failed and skipped, and fails when fewer passed than the floor the tier states.
//
// A tier whose tests are skipped or never run still "passes" under go test: a build tag
// lost, a -run pattern that matches nothing after a rename, a TestMain that exits early, a
// feature probe that says no. Every tier script pipes its run through testcount with a
// floor set from a known-good count, so such a run fails instead.
//
//	go test -json ./... | go run ./hack/testcount -tier unit -floor 1500
//	TESTBIN -test.v | testcount -text -tier ipvs -floor 40
//
// Input: `go test -json` events (the default), or with -text the plain -test.v output of a
// test binary (the IPVS VM runs test binaries directly). Output: with -json, go test's usual
// terse output (package results, the output of failed tests) or, with -v, everything the
// tests printed; with -text, the input unchanged. Then one summary line:
//
//	testcount: unit: 1523 passed, 0 failed, 12 skipped (floor 1500)
//
// and one line per skipped test with its reason, so skips are never silent. Every test
// counts, subtests included. Exit status: 1 when a test failed, a package failed to build,
// fewer than -floor passed, or the input held no test at all; 0 otherwise.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

func main() {
	tier := flag.String("tier", "tests", "name of the tier or suite, for the summary")
	floor := flag.Int("floor", 0, "fail when fewer tests than this passed")
	text := flag.Bool("text", false, "input is the plain -test.v output of a test binary, not go test -json")
	verbose := flag.Bool("v", false, "with go test -json input: print everything the tests printed, like go test -v")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: testcount [-tier NAME] [-floor N] [-text] [-v] < test output")
		os.Exit(2)
	}

	var c counter
	var err error
	if *text {
		err = c.readText(os.Stdin, os.Stdout)
	} else {
		err = c.readJSON(os.Stdin, os.Stdout, *verbose)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testcount: %s: reading the test output: %v\n", *tier, err)
		os.Exit(1)
	}
	ok := c.report(os.Stdout, *tier, *floor)
	if !ok {
		os.Exit(1)
	}
}

// counter accumulates the results of one run.
type counter struct {
	passed, failed int
	// skipped holds "name: reason" for every skipped test, in the order they ended.
	skipped []string
	// brokenPackages names packages that failed without a failing test (build errors,
	// a panic or os.Exit outside any test, a timeout).
	brokenPackages []string
}

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// readJSON reads go test -json events from r and writes go test's output to w: all of it
// with verbose, otherwise what plain `go test` prints (package lines, the output of failed
// tests and of packages that did not build).
func (c *counter) readJSON(r io.Reader, w io.Writer, verbose bool) error {
	// A failed write sticks to out: the loop keeps counting and the last Flush reports it.
	out := bufio.NewWriter(w)
	// Output of each running test, kept until it passes (dropped) or fails (printed).
	buffered := map[string][]string{}
	// Packages with a failed test: their FAIL line is expected.
	failedTests := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			// Not an event: go test's own messages (e.g. a build error on older Go).
			fmt.Fprintf(out, "%s\n", line)
			_ = out.Flush()
			continue
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "build-output":
			fmt.Fprint(out, ev.Output)
		case "output":
			switch {
			case verbose:
				fmt.Fprint(out, ev.Output)
			case ev.Test != "":
				buffered[key] = append(buffered[key], ev.Output)
			case !isFraming(ev.Output):
				fmt.Fprint(out, ev.Output)
			}
		case "pass", "fail", "skip":
			if ev.Test == "" {
				if ev.Action == "fail" && !failedTests[ev.Package] {
					c.brokenPackages = append(c.brokenPackages, ev.Package)
				}
				break
			}
			switch ev.Action {
			case "pass":
				c.passed++
			case "fail":
				c.failed++
				failedTests[ev.Package] = true
				if !verbose {
					fmt.Fprint(out, strings.Join(buffered[key], ""))
				}
			case "skip":
				c.skipped = append(c.skipped, ev.Package+" "+ev.Test+": "+skipReason(buffered[key]))
			}
			delete(buffered, key)
		}
		_ = out.Flush()
	}
	// Tests that never ended (the binary died): show what they printed.
	if !verbose {
		keys := make([]string, 0, len(buffered))
		for k := range buffered {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(out, "testcount: %s did not finish; its output:\n%s", k, strings.Join(buffered[k], ""))
		}
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("writing go test's output: %w", err)
	}
	return sc.Err()
}

// isFraming reports whether a package-level output line is one plain go test does not print.
func isFraming(s string) bool {
	return s == "PASS\n" || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "testing: warning: no tests to run")
}

// resultLine matches a test's result line in -test.v output, top-level or subtest.
var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// readText copies r to w line by line (so a hung test shows what it printed) and counts the
// result lines of -test.v output.
func (c *counter) readText(r io.Reader, w io.Writer) error {
	rd := bufio.NewReader(r)
	var pendingSkip string
	var reason []string
	for {
		line, err := rd.ReadString('\n')
		if line != "" {
			if _, werr := io.WriteString(w, line); werr != nil {
				return werr
			}
			if pendingSkip != "" {
				// The reason of a skip follows its result line, indented.
				if strings.HasPrefix(line, "    ") && resultLine.FindStringSubmatch(line) == nil {
					reason = append(reason, line)
				} else {
					c.skipped = append(c.skipped, pendingSkip+": "+skipReason(reason))
					pendingSkip, reason = "", nil
				}
			}
			if m := resultLine.FindStringSubmatch(line); m != nil {
				switch m[1] {
				case "PASS":
					c.passed++
				case "FAIL":
					c.failed++
				case "SKIP":
					pendingSkip = m[2]
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if pendingSkip != "" {
		c.skipped = append(c.skipped, pendingSkip+": "+skipReason(reason))
	}
	return nil
}

// skipReason picks the t.Skip message out of a skipped test's output: its last line (what
// the test logged before is left out).
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "=== ") || resultLine.MatchString(l) {
			continue
		}
		return l
	}
	return "no reason given"
}

// report prints the summary and the skipped tests, and says whether the run is good.
func (c *counter) report(w io.Writer, tier string, floor int) bool {
	fmt.Fprintf(w, "testcount: %s: %d passed, %d failed, %d skipped (floor %d)\n", tier, c.passed, c.failed, len(c.skipped), floor)
	for _, s := range c.skipped {
		fmt.Fprintf(w, "testcount: %s: skipped %s\n", tier, s)
	}
	ok := true
	for _, p := range c.brokenPackages {
		fmt.Fprintf(w, "testcount: %s: FAIL: package %s failed outside any test\n", tier, p)
		ok = false
	}
	if c.failed > 0 {
		ok = false
	}
	if c.passed+c.failed+len(c.skipped) == 0 {
		fmt.Fprintf(w, "testcount: %s: FAIL: the output holds no test at all\n", tier)
		ok = false
	}
	if c.passed < floor {
		fmt.Fprintf(w, "testcount: %s: FAIL: %d tests passed, fewer than the tier's floor of %d: tests were skipped or not run "+
			"(lower the floor, next to the tier, only when tests were removed on purpose)\n", tier, c.passed, floor)
		ok = false
	}
	return ok
}
