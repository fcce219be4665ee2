package results

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

func run(proxy, backend string, complete bool, checks ...Check) *Run {
	r := &Run{Proxy: proxy, Backend: backend, Complete: complete}
	seen := map[string]bool{}
	for _, c := range checks {
		if !seen[c.Case+"/"+c.Family] {
			seen[c.Case+"/"+c.Family] = true
			r.Cases = append(r.Cases, CaseResult{Case: c.Case, Family: c.Family, Result: "pass"})
		}
	}
	r.Checks = checks
	return r
}

func chk(caseName, family string, seq int, what, outcome string) Check {
	return Check{Case: caseName, Family: family, Seq: seq, Check: what, Outcome: outcome, OK: true}
}

func TestCompare(t *testing.T) {
	refusedV4 := chk("NoEndpoints", "IPv4", 1, "b1 -> ClusterIP IPv4 http/tcp", "refused")
	diff := Difference{Case: "NoEndpoints", Backend: "ipvs", Family: "IPv4", Check: "b1 -> ClusterIP IPv4 http/tcp", Sluice: "refused", Upstream: "timeout", Why: "w"}
	other := func(c Check, outcome string) Check { c.Outcome = outcome; return c }
	for _, tc := range []struct {
		name             string
		sluice, upstream *Run
		diffs            []Difference
		want             []string // substrings, one per problem
	}{
		{"equal outcomes", run(Sluice, "ipvs", true, refusedV4), run(Upstream, "ipvs", true, refusedV4), nil, nil},
		{"undeclared difference", run(Sluice, "ipvs", true, refusedV4), run(Upstream, "ipvs", true, other(refusedV4, "timeout")), nil,
			[]string{`sluice "refused", upstream "timeout"; fix sluice, or declare`}},
		{"declared difference", run(Sluice, "ipvs", true, refusedV4), run(Upstream, "ipvs", true, other(refusedV4, "timeout")), []Difference{diff}, nil},
		{"declared difference for another backend does not count", run(Sluice, "iptables", true, refusedV4), run(Upstream, "iptables", true, other(refusedV4, "timeout")), []Difference{diff},
			[]string{"fix sluice"}},
		{"declared difference with other outcomes", run(Sluice, "ipvs", true, refusedV4), run(Upstream, "ipvs", true, other(refusedV4, "unreachable")), []Difference{diff},
			[]string{`differences.yaml declares sluice "refused" and upstream "timeout"`}},
		{"stale declared difference", run(Sluice, "ipvs", true, refusedV4), run(Upstream, "ipvs", true, refusedV4), []Difference{diff},
			[]string{"differences.yaml declares"}},
		{"stale entry for a check that is gone", run(Sluice, "ipvs", true, other(refusedV4, "refused")), run(Upstream, "ipvs", true, refusedV4),
			[]Difference{{Case: "NoEndpoints", Backend: "ipvs", Check: "gone", Sluice: "a", Upstream: "b", Why: "w"}},
			[]string{"no such check in the runs of ipvs"}},
		{"a check only one run made", run(Sluice, "ipvs", true, refusedV4, chk("NoEndpoints", "IPv4", 2, "x", "y")), run(Upstream, "ipvs", true, refusedV4), nil,
			[]string{"sluice-ipvs made this check, kube-proxy-ipvs did not"}},
		{"cases only one run ran are not compared", run(Sluice, "ipvs", false, refusedV4, chk("Other", "IPv6", 1, "x", "y")), run(Upstream, "ipvs", false, refusedV4), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compare(tc.sluice, tc.upstream, tc.diffs)
			if len(got) != len(tc.want) {
				t.Fatalf("Compare = %q, want %d problem(s) like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestComparedCountsOnlyCasesBothRunsPassed(t *testing.T) {
	shared := chk("NoEndpoints", "IPv4", 1, "b1 -> ClusterIP IPv4 http/tcp", "refused")
	sluiceOnly := chk("TrafficCounters", "IPv4", 1, "node-a's traffic counters", "+5")
	s := run(Sluice, "nftables", true, shared, sluiceOnly)
	u := run(Upstream, "nftables", true, shared)
	if got := Compared(s, u); got != 1 {
		t.Errorf("Compared = %d, want 1 (the sluice-only case's check is not compared)", got)
	}
	if got := Compare(s, u, nil); len(got) != 0 {
		t.Errorf("Compare = %q, want no problem", got)
	}
}

func TestParseDifferencesRequiresEveryField(t *testing.T) {
	good := "- case: C\n  backend: ipvs\n  check: x\n  sluice: refused\n  upstream: timeout\n  why: because\n"
	if d, err := ParseDifferences([]byte(good)); err != nil || len(d) != 1 || d[0].Family != "" {
		t.Fatalf("ParseDifferences(good) = %+v, %v", d, err)
	}
	for name, bad := range map[string]string{
		"no why":        "- case: C\n  backend: ipvs\n  check: x\n  sluice: refused\n  upstream: timeout\n",
		"same outcomes": "- case: C\n  backend: ipvs\n  check: x\n  sluice: refused\n  upstream: refused\n  why: w\n",
		"unknown field": good + "  note: n\n",
		"not a list":    "case: C\n",
		"no upstream":   "- case: C\n  backend: ipvs\n  check: x\n  sluice: refused\n  why: w\n",
	} {
		if _, err := ParseDifferences([]byte(bad)); err == nil {
			t.Errorf("%s: ParseDifferences accepted %q", name, bad)
		}
	}
}

func capCheck(seq int, capability, variant, outcome string) Check {
	c := chk("Case", "IPv4", seq, "x", outcome)
	c.Capability, c.Variant = capability, variant
	return c
}

func TestDeriveCheckAndUpdateTheTable(t *testing.T) {
	runs := []*Run{
		run(Sluice, "iptables", true, capCheck(1, "Unused", "tcp IPv4", "timeout"), capCheck(2, "Unused", "tcp IPv4", "timeout"), capCheck(3, "Local", "tcp IPv6", "answered by a0")),
		run(Sluice, "ipvs", false, capCheck(1, "Unused", "tcp IPv4", "refused")),
		// Upstream's outcomes are compared with sluice's, not made into the table.
		run(Upstream, "iptables", true, capCheck(1, "Unused", "tcp IPv4", "unreachable")),
	}
	derived, problems := Derive(runs)
	if len(problems) > 0 {
		t.Fatalf("Derive problems: %v", problems)
	}
	want := Table{
		"Unused": {"tcp IPv4": {"iptables": "timeout", "ipvs": "refused"}},
		"Local":  {"tcp IPv6": {"iptables": "answered by a0"}},
	}
	if !reflect.DeepEqual(derived, want) {
		t.Fatalf("Derive = %v, want %v", derived, want)
	}

	checkedIn := Table{
		"Unused": {"tcp IPv4": {"iptables": "refused", "ipvs": "refused", "nftables": "refused"}},
		"Stale":  {"udp IPv4": {"iptables": "timeout", "ipvs": "timeout"}},
	}
	got := CheckTable(checkedIn, derived, runs)
	wantProblems := []string{
		`capabilities.json has Stale udp IPv4 for iptables, which no check of the complete run sluice-iptables used`,
		`capabilities.json has no Local tcp IPv6 for iptables; the run shows "answered by a0"`,
		`capabilities.json says Unused tcp IPv4 is "refused" for iptables; the run shows "timeout"`,
	}
	if !reflect.DeepEqual(got, wantProblems) {
		t.Errorf("CheckTable =\n%q\nwant\n%q", got, wantProblems)
	}

	updated := Update(checkedIn, derived, runs)
	wantUpdated := Table{
		// iptables' complete run replaces its column; ipvs' partial run only overwrites.
		"Unused": {"tcp IPv4": {"iptables": "timeout", "ipvs": "refused", "nftables": "refused"}},
		"Stale":  {"udp IPv4": {"ipvs": "timeout"}},
		"Local":  {"tcp IPv6": {"iptables": "answered by a0"}},
	}
	if !reflect.DeepEqual(updated, wantUpdated) {
		t.Errorf("Update = %v, want %v", updated, wantUpdated)
	}
	if p := CheckTable(updated, derived, runs); len(p) > 0 {
		t.Errorf("the updated table does not check: %v", p)
	}
}

func TestDeriveReportsAnEntryARunSawTwoWays(t *testing.T) {
	_, problems := Derive([]*Run{run(Sluice, "nftables", true, capCheck(1, "Unused", "tcp IPv4", "timeout"), capCheck(2, "Unused", "tcp IPv4", "refused"))})
	if len(problems) != 1 || !strings.Contains(problems[0], `Unused tcp IPv4 is "timeout"`) {
		t.Errorf("Derive problems = %q", problems)
	}
}

func TestRenderGroupsVariantsByOutcome(t *testing.T) {
	table := Table{"Unused": {
		"tcp IPv4": {"iptables": "timeout", "nftables": "refused"},
		"tcp IPv6": {"iptables": "timeout", "nftables": "refused after a SYN retransmission"},
	}}
	got := Render(table, map[string]Doc{"Unused": {Question: "q", Why: map[string]string{"ipvs": "because"}}})
	want := "| what the client receives | iptables | nftables | ipvs |\n|---|---|---|---|\n" +
		"| `Unused`: q | **timeout** | tcp IPv4: **refused**; tcp IPv6: **refused after a SYN retransmission** | **(not run)**<br>because |\n"
	if got != want {
		t.Errorf("Render =\n%s\nwant\n%s", got, want)
	}
}

func TestSaveAndLoad(t *testing.T) {
	dir := t.TempDir()
	r := run(Sluice, "nftables", true, chk("B", "IPv6", 2, "x", "y"), chk("A", "IPv4", 1, "x", "y"))
	if err := r.Save(dir); err != nil {
		t.Fatal(err)
	}
	runs, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Name() != "sluice-nftables" || runs[0].Checks[0].Case != "A" {
		t.Errorf("Load = %+v", runs)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("Load of an empty directory: no error")
	}
}

// The README's capability table is the rendering of the checked-in capabilities.json, and
// every capability in it is documented.
func TestCheckedInTableAndREADMEAgree(t *testing.T) {
	data, err := os.ReadFile("../capabilities.json")
	if err != nil {
		t.Fatal(err)
	}
	table, err := ParseTable(data)
	if err != nil {
		t.Fatal(err)
	}
	for name := range table {
		if _, ok := Docs[name]; !ok {
			t.Errorf("capability %s has no entry in Docs", name)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ReplaceTable(string(readme), Render(table, Docs))
	if err != nil {
		t.Fatal(err)
	}
	if want != string(readme) {
		t.Error("test/conformance/README.md's capability table is not the rendering of capabilities.json; run go run ./test/conformance/checkresults -update DIR")
	}
	if _, err := ParseDifferences(mustRead(t, "../differences.yaml")); err != nil {
		t.Error(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
