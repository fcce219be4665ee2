package xtables

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

// Flavour is the iptables implementation: "legacy" (x_tables, the ip_tables kernel
// modules, one blob per table) or "nft" (the iptables-nft tools writing nf_tables rules
// that emulate x_tables).
type Flavour string

// The two flavours.
const (
	Legacy Flavour = "legacy"
	NFT    Flavour = "nft"
)

// Flavours are both flavours, in the order detection looks at them.
var Flavours = []Flavour{NFT, Legacy}

// Other returns the flavour that is not f.
func (f Flavour) Other() Flavour {
	if f == Legacy {
		return NFT
	}
	return Legacy
}

// Table names, as iptables spells them.
const (
	TableFilter = "filter"
	TableNAT    = "nat"
	TableMangle = "mangle"
)

// DefaultWaitSeconds bounds the wait for the xtables lock (--wait). Upstream waits 5 s; a
// legacy restore of a large ruleset by someone else can take longer than that. Only the
// legacy flavour takes the lock.
const DefaultWaitSeconds = 30

// Commander runs a program with stdin and returns its stdout and stderr. Exec runs real
// programs; unit tests script a fake kernel behind it.
type Commander interface {
	Run(ctx context.Context, name string, args []string, stdin []byte) (stdout, stderr []byte, err error)
	LookPath(name string) (string, error)
}

// Exec is the Commander of real programs.
type Exec struct{}

// Run implements Commander.
func (Exec) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

// LookPath implements Commander.
func (Exec) LookPath(name string) (string, error) { return exec.LookPath(name) }

// ErrExit lets a fake Commander report a non-zero exit without an *exec.ExitError.
var ErrExit = errors.New("exit status non-zero")

// Runner reads and writes one flavour's tables of one family. *Tools is the real one; the
// ipvs backend's unit tests have a fake.
type Runner interface {
	// Save returns iptables-save output of the tables (every table the kernel holds when
	// none is named: naming a table of the legacy flavour creates it).
	Save(ctx context.Context, tables ...string) ([]byte, error)
	// Restore feeds input to iptables-restore --noflush; a rejection is a *RestoreError.
	Restore(ctx context.Context, input []byte) error
}

// Tools are the iptables programs of one flavour and family.
type Tools struct {
	Flavour Flavour
	// Installed is the flavour of the plain `iptables` program.
	Installed Flavour
	Family    model.IPFamily
	// IPTables, RestoreProgram and SaveProgram are program names, e.g.
	// "iptables-nft-restore", or plain "iptables-restore" for the installed flavour.
	IPTables, RestoreProgram, SaveProgram string
	// WaitSeconds is passed to --wait.
	WaitSeconds int
	Cmd         Commander
}

var _ Runner = (*Tools)(nil)

// NewTools returns the programs of flavour for family, waiting DefaultWaitSeconds for the
// xtables lock.
func NewTools(cmd Commander, family model.IPFamily, flavour, installed Flavour) *Tools {
	ipt, restore, save := ToolNames(family, flavour, installed)
	return &Tools{Flavour: flavour, Installed: installed, Family: family, IPTables: ipt, RestoreProgram: restore, SaveProgram: save,
		WaitSeconds: DefaultWaitSeconds, Cmd: cmd}
}

// ToolNames returns the program names of a flavour: the plain names when the flavour is
// the one installed as `iptables`, the flavour's own names otherwise.
func ToolNames(family model.IPFamily, flavour, installed Flavour) (iptables, restore, save string) {
	base := "iptables"
	if family == model.IPv6 {
		base = "ip6tables"
	}
	if flavour != installed {
		base += "-" + string(flavour)
	}
	return base, base + "-restore", base + "-save"
}

// Available reports whether the flavour's save and restore programs are installed.
func (t *Tools) Available() bool {
	_, errRestore := t.Cmd.LookPath(t.RestoreProgram)
	_, errSave := t.Cmd.LookPath(t.SaveProgram)
	return errRestore == nil && errSave == nil
}

// Restore implements Runner: never flush tables (other software owns chains there), keep
// counters, honour the xtables lock.
func (t *Tools) Restore(ctx context.Context, in []byte) error {
	args := []string{"--noflush", "--counters", "--wait", strconv.Itoa(t.WaitSeconds)}
	stdout, stderr, err := t.Cmd.Run(ctx, t.RestoreProgram, args, in)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", t.RestoreProgram, ctx.Err())
	}
	out := strings.TrimSpace(string(stderr) + string(stdout))
	re := &RestoreError{Program: t.RestoreProgram, Output: out, Lines: restoreErrorLines(out)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		re.ExitCode = ee.ExitCode()
	} else if !errors.Is(err, ErrExit) {
		return fmt.Errorf("running %s: %w", t.RestoreProgram, err)
	}
	return re
}

// Save implements Runner, one run per table named.
func (t *Tools) Save(ctx context.Context, tables ...string) ([]byte, error) {
	if len(tables) == 0 {
		return t.save(ctx, nil)
	}
	var all []byte
	for _, table := range tables {
		out, err := t.save(ctx, []string{"-t", table})
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
	}
	return all, nil
}

func (t *Tools) save(ctx context.Context, args []string) ([]byte, error) {
	stdout, stderr, err := t.Cmd.Run(ctx, t.SaveProgram, args, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", t.SaveProgram, strings.Join(args, " "), err, bytes.TrimSpace(stderr))
	}
	return stdout, nil
}

// RestoreError is iptables-restore refusing its input. Nothing of the table whose section
// failed was committed; tables before it were.
type RestoreError struct {
	Program  string
	Output   string
	ExitCode int
	// Lines are the input lines the program blamed, in the order it printed them.
	Lines []int
}

func (e *RestoreError) Error() string {
	out := e.Output
	if i := strings.IndexByte(out, '\n'); i >= 0 && len(e.Lines) == 0 {
		out = out[:i]
	}
	out = strings.ReplaceAll(out, "\n", "; ")
	if len(out) > 300 {
		out = out[:300] + "..."
	}
	if len(e.Lines) == 0 {
		return fmt.Sprintf("%s failed: %s", e.Program, out)
	}
	return fmt.Sprintf("%s rejected its input: %s", e.Program, out)
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
