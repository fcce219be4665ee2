package results

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Difference is a place where sluice's outcome is meant to differ from upstream
// kube-proxy's: one entry of test/conformance/differences.yaml. The comparison accepts
// exactly the two outcomes it names, and fails on an entry that no run shows any more.
type Difference struct {
	// Case, Backend and Check name the check ("b1 -> ClusterIP IPv4 http/tcp", as in the
	// results); Family restricts the entry to one family variant (empty: every variant).
	Case    string `json:"case"`
	Backend string `json:"backend"`
	Family  string `json:"family,omitempty"`
	Check   string `json:"check"`
	// Sluice and Upstream are the two outcomes.
	Sluice   string `json:"sluice"`
	Upstream string `json:"upstream"`
	// Why says why sluice's outcome is the better one.
	Why string `json:"why"`
}

// Matches reports whether the entry is about check c of a run of backend.
func (d Difference) Matches(backend string, c Check) bool {
	return d.Case == c.Case && d.Backend == backend && (d.Family == "" || d.Family == c.Family) && d.Check == c.Check
}

func (d Difference) String() string {
	fam := d.Family
	if fam == "" {
		fam = "every family"
	}
	return fmt.Sprintf("%s (%s, %s) %q", d.Case, d.Backend, fam, d.Check)
}

// ParseDifferences reads differences.yaml: a list of Difference. Every field but Family
// must be set.
func ParseDifferences(data []byte) ([]Difference, error) {
	var diffs []Difference
	if err := yaml.UnmarshalStrict(data, &diffs); err != nil {
		return nil, fmt.Errorf("differences: %w", err)
	}
	var errs []error
	for i, d := range diffs {
		if d.Case == "" || d.Backend == "" || d.Check == "" || d.Sluice == "" || d.Upstream == "" || strings.TrimSpace(d.Why) == "" {
			errs = append(errs, fmt.Errorf("differences entry %d (%s): case, backend, check, sluice, upstream and why are all required", i+1, d))
		}
		if d.Sluice == d.Upstream {
			errs = append(errs, fmt.Errorf("differences entry %d (%s): sluice and upstream have the same outcome %q", i+1, d, d.Sluice))
		}
	}
	return diffs, errors.Join(errs...)
}

// Find returns the entry about check c of a run of backend, if there is one.
func Find(diffs []Difference, backend string, c Check) (Difference, bool) {
	for _, d := range diffs {
		if d.Matches(backend, c) {
			return d, true
		}
	}
	return Difference{}, false
}

// Compared counts the checks of sluice's run that Compare compares with upstream's: those
// of the cases that passed in both runs in the same family variant (a sluice-only case,
// which upstream's run has no result for, is not among them).
func Compared(sluice, upstream *Run) int {
	n := 0
	for _, c := range sluice.Checks {
		_, passedS := sluice.ranCase(c.Case, c.Family)
		_, passedU := upstream.ranCase(c.Case, c.Family)
		if passedS && passedU {
			n++
		}
	}
	return n
}

// Compare compares sluice's run with upstream's run of the same backend, check by check,
// over the cases that passed in both in the same family variant (a failed case is a
// failure of its own). Every outcome must be equal unless a
// difference declares both outcomes; a declared difference that the runs do not show, for a
// case both ran, is reported too (the entry is stale).
func Compare(sluice, upstream *Run, diffs []Difference) []string {
	var problems []string
	if sluice.Backend != upstream.Backend {
		return []string{fmt.Sprintf("comparing %s with %s: different backends", sluice.Name(), upstream.Name())}
	}
	backend := sluice.Backend
	// A case that failed in a run stopped early there; it is reported as a failure, and
	// its checks are compared only where it passed in both runs.
	both := func(c Check) bool {
		_, passedS := sluice.ranCase(c.Case, c.Family)
		_, passedU := upstream.ranCase(c.Case, c.Family)
		return passedS && passedU
	}
	up := map[string]Check{}
	for _, c := range upstream.Checks {
		up[c.Key()] = c
	}
	seen := map[string]bool{}
	used := map[int]bool{}
	for _, s := range sluice.Checks {
		if !both(s) {
			continue
		}
		seen[s.Key()] = true
		u, ok := up[s.Key()]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: %s made this check, %s did not", s.Key(), sluice.Name(), upstream.Name()))
			continue
		}
		idx := -1
		for i, d := range diffs {
			if d.Matches(backend, s) {
				idx = i
				break
			}
		}
		switch {
		case idx >= 0:
			used[idx] = true
			d := diffs[idx]
			if s.Outcome != d.Sluice || u.Outcome != d.Upstream {
				problems = append(problems, fmt.Sprintf("%s (%s): sluice %q and upstream %q, but differences.yaml declares sluice %q and upstream %q",
					s.Key(), backend, s.Outcome, u.Outcome, d.Sluice, d.Upstream))
			}
		case s.Outcome != u.Outcome:
			problems = append(problems, fmt.Sprintf("%s (%s): sluice %q, upstream %q; fix sluice, or declare the difference in test/conformance/differences.yaml with why sluice's is better",
				s.Key(), backend, s.Outcome, u.Outcome))
		}
	}
	for _, u := range upstream.Checks {
		if both(u) && !seen[u.Key()] {
			problems = append(problems, fmt.Sprintf("%s: %s made this check, %s did not", u.Key(), upstream.Name(), sluice.Name()))
		}
	}
	for i, d := range diffs {
		if d.Backend != backend || used[i] {
			continue
		}
		// Stale only if the case passed in both runs (in the entry's family, or any).
		ran := false
		for _, c := range sluice.Cases {
			if c.Case == d.Case && (d.Family == "" || d.Family == c.Family) {
				_, ps := sluice.ranCase(c.Case, c.Family)
				_, pu := upstream.ranCase(c.Case, c.Family)
				ran = ran || (ps && pu)
			}
		}
		if ran {
			problems = append(problems, fmt.Sprintf("differences.yaml: %s: no such check in the runs of %s; remove or correct the entry", d, backend))
		}
	}
	sort.Strings(problems)
	return problems
}
