package results

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Backends are the proxy modes, in the capability table's column order.
var Backends = []string{"iptables", "nftables", "ipvs"}

// Table is the capability table: where backends legitimately differ, as what a client
// receives. Capability name, then variant ("tcp IPv6"), then backend, to the outcome
// sluice's runs showed. It is generated from the runs (Derive, Update) into
// test/conformance/capabilities.json and never written by hand; the suite reads it for the
// outcome each backend must show.
type Table map[string]map[string]map[string]string

// Lookup returns the outcome a backend shows for a capability's variant.
func (t Table) Lookup(capability, variant, backend string) (string, bool) {
	v, ok := t[capability][variant][backend]
	return v, ok
}

func (t Table) set(capability, variant, backend, outcome string) {
	if t[capability] == nil {
		t[capability] = map[string]map[string]string{}
	}
	if t[capability][variant] == nil {
		t[capability][variant] = map[string]string{}
	}
	t[capability][variant][backend] = outcome
}

// ParseTable reads capabilities.json.
func ParseTable(data []byte) (Table, error) {
	t := Table{}
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("capability table: %w", err)
	}
	return t, nil
}

// Marshal renders the table as capabilities.json (keys sorted, so diffs stay small).
func (t Table) Marshal() []byte {
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return append(data, '\n')
}

// Derive builds the part of the capability table that sluice's runs show: for each check
// that read the table, the outcome it observed (whether or not it matched). Two checks of
// one run that observed different outcomes for the same entry are reported: the entry is
// not a property of the backend then.
func Derive(runs []*Run) (Table, []string) {
	t := Table{}
	var problems []string
	for _, r := range runs {
		if r.Proxy != Sluice {
			continue
		}
		where := map[string]string{}
		for _, c := range r.Checks {
			if c.Capability == "" {
				continue
			}
			key := c.Capability + " " + c.Variant
			if prev, ok := t.Lookup(c.Capability, c.Variant, r.Backend); ok && prev != c.Outcome {
				problems = append(problems, fmt.Sprintf("%s: %s is %q in %s but %q in %s", r.Name(), key, prev, where[key], c.Outcome, c.Key()))
				continue
			}
			t.set(c.Capability, c.Variant, r.Backend, c.Outcome)
			where[key] = c.Key()
		}
	}
	sort.Strings(problems)
	return t, problems
}

// CheckTable compares the checked-in table with the one derived from runs, for the
// backends the runs cover. An entry a complete run never exercised is stale.
func CheckTable(checkedIn, derived Table, runs []*Run) []string {
	var problems []string
	for capability, variants := range derived {
		for variant, byBackend := range variants {
			for backend, got := range byBackend {
				want, ok := checkedIn.Lookup(capability, variant, backend)
				switch {
				case !ok:
					problems = append(problems, fmt.Sprintf("capabilities.json has no %s %s for %s; the run shows %q", capability, variant, backend, got))
				case want != got:
					problems = append(problems, fmt.Sprintf("capabilities.json says %s %s is %q for %s; the run shows %q", capability, variant, want, backend, got))
				}
			}
		}
	}
	for _, r := range runs {
		if r.Proxy != Sluice || !r.Complete {
			continue
		}
		for capability, variants := range checkedIn {
			for variant, byBackend := range variants {
				if _, ok := byBackend[r.Backend]; !ok {
					continue
				}
				if _, ok := derived.Lookup(capability, variant, r.Backend); !ok {
					problems = append(problems, fmt.Sprintf("capabilities.json has %s %s for %s, which no check of the complete run %s used", capability, variant, r.Backend, r.Name()))
				}
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// Update returns the checked-in table with the derived entries written over it; for a
// backend with a complete sluice run, entries the run did not exercise are dropped.
func Update(checkedIn, derived Table, runs []*Run) Table {
	out := Table{}
	complete := map[string]bool{}
	for _, r := range runs {
		if r.Proxy == Sluice && r.Complete {
			complete[r.Backend] = true
		}
	}
	for capability, variants := range checkedIn {
		for variant, byBackend := range variants {
			for backend, v := range byBackend {
				if !complete[backend] {
					out.set(capability, variant, backend, v)
				}
			}
		}
	}
	for capability, variants := range derived {
		for variant, byBackend := range variants {
			for backend, v := range byBackend {
				out.set(capability, variant, backend, v)
			}
		}
	}
	return out
}

// Doc explains one capability in the README's table: the question it answers and, per
// backend, why the backend answers as it does. Written by hand; the outcomes are not.
type Doc struct {
	Question string
	Why      map[string]string
}

// TableStart and TableEnd delimit the generated table in test/conformance/README.md.
const (
	TableStart = "<!-- capability table: generated from capabilities.json by `go run ./test/conformance/checkresults -update`; do not edit -->"
	TableEnd   = "<!-- end of the generated capability table -->"
)

// Render renders the table as the README's markdown table, one row per capability: for each
// backend, its outcome, or the outcome of each group of variants when they differ, then why.
func Render(t Table, docs map[string]Doc) string {
	var b strings.Builder
	b.WriteString("| what the client receives | " + strings.Join(Backends, " | ") + " |\n")
	b.WriteString("|---" + strings.Repeat("|---", len(Backends)) + "|\n")
	var names []string
	for name := range t {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		doc := docs[name]
		fmt.Fprintf(&b, "| `%s`: %s |", name, doc.Question)
		for _, backend := range Backends {
			cell := renderCell(t[name], backend)
			if why := doc.Why[backend]; why != "" {
				cell += "<br>" + why
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// renderCell groups a capability's variants by the backend's outcome: "refused" when all
// agree, else "tcp IPv4, udp IPv4: refused; tcp IPv6: timeout".
func renderCell(variants map[string]map[string]string, backend string) string {
	byOutcome := map[string][]string{}
	var keys []string
	for variant, byBackend := range variants {
		v, ok := byBackend[backend]
		if !ok {
			v = "(not run)"
		}
		if byOutcome[v] == nil {
			keys = append(keys, v)
		}
		byOutcome[v] = append(byOutcome[v], variant)
	}
	if len(keys) == 1 {
		return "**" + keys[0] + "**"
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		vs := byOutcome[k]
		sort.Strings(vs)
		parts = append(parts, strings.Join(vs, ", ")+": **"+k+"**")
	}
	return strings.Join(parts, "; ")
}

// ReplaceTable returns readme with the text between TableStart and TableEnd replaced by
// table.
func ReplaceTable(readme, table string) (string, error) {
	start := strings.Index(readme, TableStart)
	end := strings.Index(readme, TableEnd)
	if start < 0 || end < start {
		return "", fmt.Errorf("README has no %q ... %q section", TableStart, TableEnd)
	}
	return readme[:start+len(TableStart)] + "\n\n" + table + "\n" + readme[end:], nil
}

// WriteFileAtomic writes data to path through a temporary file.
func WriteFileAtomic(path string, data []byte) error {
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
