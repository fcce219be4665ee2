package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// commander runs a program with stdin and returns its stdout and stderr. The real one is
// os/exec; unit tests script a fake kernel behind it.
type commander interface {
	Run(ctx context.Context, name string, args []string, stdin []byte) (stdout, stderr []byte, err error)
	LookPath(name string) (string, error)
}

// execCommander runs real programs.
type execCommander struct{}

func (execCommander) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

// Flavour is the iptables implementation: "legacy" (x_tables, the ip_tables kernel
// modules, one blob per table) or "nft" (the iptables-nft tools writing nf_tables rules
// that emulate x_tables).
type Flavour string

const (
	FlavourLegacy Flavour = "legacy"
	FlavourNFT    Flavour = "nft"
)

// tools are the iptables programs of one flavour and family.
type tools struct {
	flavour Flavour
	// installed is the flavour of the plain `iptables` program.
	installed Flavour
	family    model.IPFamily
	// iptables, restore and save are program names or paths, e.g. "iptables-nft-restore",
	// or plain "iptables-restore" when that is the installed flavour.
	iptables, restore, save string
	// waitSeconds is passed to --wait: how long to wait for the xtables lock (legacy only
	// takes it; nft ignores it) before failing.
	waitSeconds int
	cmd         commander
}

// toolNames returns the program names of a flavour: the plain names when the flavour is the
// one installed as `iptables`, the flavour's own names otherwise.
func toolNames(family model.IPFamily, flavour, installed Flavour) (iptables, restore, save string) {
	base := "iptables"
	if family == model.IPv6 {
		base = "ip6tables"
	}
	if flavour != installed {
		base += "-" + string(flavour)
	}
	return base, base + "-restore", base + "-save"
}

// restoreArgs are the arguments of every restore: never flush tables (other software owns
// chains there), keep counters, honour the xtables lock.
func (t *tools) restoreArgs() []string {
	return []string{"--noflush", "--counters", "--wait", strconv.Itoa(t.waitSeconds)}
}

func (execCommander) LookPath(name string) (string, error) { return exec.LookPath(name) }

// runRestore feeds in to iptables-restore. A rejection comes back as *restoreError.
func (t *tools) runRestore(ctx context.Context, in []byte) error {
	stdout, stderr, err := t.cmd.Run(ctx, t.restore, t.restoreArgs(), in)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", t.restore, ctx.Err())
	}
	out := strings.TrimSpace(string(stderr) + string(stdout))
	re := &restoreError{program: t.restore, output: out, lines: restoreErrorLines(out)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		re.exitCode = ee.ExitCode()
	} else if !errors.Is(err, errFakeExit) {
		return fmt.Errorf("running %s: %w", t.restore, err)
	}
	return re
}

// runSave returns iptables-save output for one table ("" for all tables).
func (t *tools) runSave(ctx context.Context, table string) ([]byte, error) {
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	stdout, stderr, err := t.cmd.Run(ctx, t.save, args, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", t.save, strings.Join(args, " "), err, bytes.TrimSpace(stderr))
	}
	return stdout, nil
}

// errFakeExit lets a fake commander report a non-zero exit without an *exec.ExitError.
var errFakeExit = errors.New("exit status non-zero")

// restoreError is iptables-restore refusing its input. Nothing of the table whose section
// failed was committed; tables before it were.
type restoreError struct {
	program  string
	output   string
	exitCode int
	// lines are the input lines the program blamed, in the order it printed them.
	lines []int
}

func (e *restoreError) Error() string {
	out := e.output
	if i := strings.IndexByte(out, '\n'); i >= 0 && len(e.lines) == 0 {
		out = out[:i]
	}
	out = strings.ReplaceAll(out, "\n", "; ")
	if len(out) > 300 {
		out = out[:300] + "..."
	}
	if len(e.lines) == 0 {
		return fmt.Sprintf("%s failed: %s", e.program, out)
	}
	return fmt.Sprintf("%s rejected its input: %s", e.program, out)
}

// The messages iptables-restore uses to point at a line:
//
//	legacy and nft, parsing:         "Error occurred at line: 4"
//	legacy, kernel refused a table:  "iptables-restore: line 8 failed" (the COMMIT line)
//	nft, kernel refused a rule:      "line 6: RULE_APPEND failed (Invalid argument): rule in chain X"
var restoreLineRE = regexp.MustCompile(`(?m)(?:Error occurred at line: (\d+))|(?:line (\d+) failed)|(?:^line (\d+): )`)

func restoreErrorLines(out string) []int {
	var lines []int
	for _, m := range restoreLineRE.FindAllStringSubmatch(out, -1) {
		for _, g := range m[1:] {
			if g == "" {
				continue
			}
			if n, err := strconv.Atoi(g); err == nil {
				lines = append(lines, n)
			}
		}
	}
	return lines
}
