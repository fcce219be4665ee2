package xtables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"
)

// Saved is iptables-save output by table name.
type Saved map[string]*SavedTable

// SavedTable is one table of iptables-save output.
type SavedTable struct {
	// Chains are the table's chains, built-in ones included, in the order printed.
	Chains []string
	// Rules are its "-A" lines, in the order printed.
	Rules []SavedRule
}

// SavedRule is one "-A chain ..." line.
type SavedRule struct {
	Chain string
	// Line is the whole line, as iptables-save printed it.
	Line string
}

// maxSaveLine bounds one line of iptables-save output (a rule with a long comment or
// match list); the scanner grows its buffer up to it.
const maxSaveLine = 64 << 20

// ParseSave reads iptables-save output. Rules are kept as text: Args and Target split one
// when a caller needs its arguments, so that reading a table of a million rules costs a
// copy of their lines, not of their words.
func ParseSave(out []byte) (Saved, error) {
	tables := Saved{}
	var cur *SavedTable
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), maxSaveLine)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(l, "*"):
			cur = &SavedTable{}
			tables[l[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			if name, _, _ := strings.Cut(l[1:], " "); name != "" {
				cur.Chains = append(cur.Chains, name)
			}
		case strings.HasPrefix(l, "-A "):
			if chain, _, _ := strings.Cut(l[3:], " "); chain != "" {
				cur.Rules = append(cur.Rules, SavedRule{Chain: chain, Line: l})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	return tables, nil
}

// ReadSaved runs r's iptables-save of the tables (every table the kernel holds when none
// is named, like Runner.Save) and parses its output.
func ReadSaved(ctx context.Context, r Runner, tables ...string) (Saved, error) {
	out, err := r.Save(ctx, tables...)
	if err != nil {
		return nil, err
	}
	return ParseSave(out)
}

// ChainSet returns the table's chains as a set (an empty one for a nil table).
func (t *SavedTable) ChainSet() map[string]bool {
	out := map[string]bool{}
	if t != nil {
		for _, c := range t.Chains {
			out[c] = true
		}
	}
	return out
}

// Args returns the rule's arguments after "-A chain", quotes undone.
func (r SavedRule) Args() []string {
	args := SplitArgs(r.Line)
	if len(args) < 2 {
		return nil
	}
	return args[2:]
}

// Target returns the rule's -j or -g target ("" when it has none).
func (r SavedRule) Target() string { return TargetOf(r.Args()) }

// TargetOf returns the -j or -g target of a rule's arguments ("" when it has none).
func TargetOf(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" {
			return args[i+1]
		}
	}
	return ""
}

// Delete returns the restore line that deletes the rule ("-D chain ...").
func (r SavedRule) Delete() string { return "-D" + strings.TrimPrefix(r.Line, "-A") }

// SplitArgs splits a rule line into arguments as iptables-restore reads it: blanks
// separate them except inside double quotes, which are not part of the argument, and a
// backslash inside quotes escapes the next character.
func SplitArgs(l string) []string {
	var out []string
	var cur strings.Builder
	inQuote, escaped, have := false, false, false
	for _, r := range l {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && inQuote:
			escaped = true
		case r == '"':
			inQuote = !inQuote
			have = true
		case (r == ' ' || r == '\t') && !inQuote:
			if have || cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
		}
	}
	if have || cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}
