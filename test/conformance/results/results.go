// Package results holds what the conformance suite records about a run, and the tools that
// judge those records: the comparison of sluice's outcomes with upstream kube-proxy's
// (Compare, with the differences declared in test/conformance/differences.yaml) and the
// capability table derived from the runs (Derive, test/conformance/capabilities.json).
//
// A run is one proxy (sluice or upstream kube-proxy) in one mode on one kernel. The suite
// writes one JSON file per run (Run.Save); `go run ./test/conformance/checkresults DIR`
// reads them all. Nothing here needs root or the kernel: the package is tested by
// `make test-unit`.
package results

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The proxies a run can be of.
const (
	// Sluice is the proxy under test.
	Sluice = "sluice"
	// Upstream is upstream kube-proxy, the reference.
	Upstream = "kube-proxy"
)

// Check is one assertion of one case in one run: what the clients were expected to receive
// and what they received.
type Check struct {
	// Case is the case's name (TestConformance/<Case>).
	Case string `json:"case"`
	// Family is the case's family variant: IPv4, IPv6, DualStack, or "all" for a disruptive
	// case, which covers every variant in one go.
	Family string `json:"family"`
	// Seq numbers the checks of one case and family in the order the case makes them: the
	// same code makes the same sequence in every run.
	Seq int `json:"seq"`
	// Check says who probed what, in words that do not change between runs:
	// "b1 -> ClusterIP IPv6 http/tcp".
	Check string `json:"check"`
	// Capability and Variant, when set, name the entry of the capability table whose value
	// the check expected: "UnusedClusterIPPort" and "tcp IPv6".
	Capability string `json:"capability,omitempty"`
	Variant    string `json:"variant,omitempty"`
	// Want are the outcomes the check accepted.
	Want []string `json:"want"`
	// Outcome is what the clients received (the last observation when the check failed).
	Outcome string `json:"outcome"`
	// OK says whether Outcome was one of Want.
	OK bool `json:"ok"`
}

// Key identifies a check across runs.
func (c Check) Key() string {
	return fmt.Sprintf("%s/%s #%02d %s", c.Case, c.Family, c.Seq, c.Check)
}

// CaseResult is how one case ended in one family variant.
type CaseResult struct {
	Case   string `json:"case"`
	Family string `json:"family"`
	// Result is "pass", "fail" or "skip".
	Result  string  `json:"result"`
	Seconds float64 `json:"seconds"`
}

// Run is everything the suite recorded about one proxy in one mode.
type Run struct {
	// Proxy is Sluice or Upstream.
	Proxy string `json:"proxy"`
	// Version is what the proxy's --version printed.
	Version string `json:"version,omitempty"`
	// Backend is the proxy mode: iptables, nftables or ipvs.
	Backend string `json:"backend"`
	// Kernel is the release of the kernel the run used (uname -r).
	Kernel string `json:"kernel,omitempty"`
	// Complete says that the run ran every case (no -run filter), so that an expectation
	// no check of it used is stale rather than merely not exercised.
	Complete bool `json:"complete"`
	// Seconds is how long the whole suite took, set-up included.
	Seconds float64      `json:"seconds"`
	Cases   []CaseResult `json:"cases"`
	Checks  []Check      `json:"checks"`
}

// Name is the run's file name stem and label: "<proxy>-<backend>".
func (r *Run) Name() string { return r.Proxy + "-" + r.Backend }

// Save writes the run to dir/<proxy>-<backend>.json, sorted so that two runs of the same
// code diff cleanly.
func (r *Run) Save(dir string) error {
	sort.SliceStable(r.Cases, func(i, j int) bool {
		return r.Cases[i].Case+"/"+r.Cases[i].Family < r.Cases[j].Case+"/"+r.Cases[j].Family
	})
	sort.SliceStable(r.Checks, func(i, j int) bool { return r.Checks[i].Key() < r.Checks[j].Key() })
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, r.Name()+".json")
	if err := os.WriteFile(path+".tmp", append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// Load reads every run in dir (the *.json files the suite wrote).
func Load(dir string) ([]*Run, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var runs []*Run
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r Run
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if r.Proxy == "" || r.Backend == "" {
			return nil, fmt.Errorf("%s: not a conformance run (no proxy or backend)", p)
		}
		runs = append(runs, &r)
	}
	if len(runs) == 0 {
		return nil, errors.New("no runs in " + dir)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Name() < runs[j].Name() })
	return runs, nil
}

// ranCase reports whether the run has a result for the case in the family, and whether the
// case passed.
func (r *Run) ranCase(name, family string) (ran, passed bool) {
	for _, c := range r.Cases {
		if c.Case == name && c.Family == family {
			return c.Result != "skip", c.Result == "pass"
		}
	}
	return false, false
}

// Summary is one line per run: cases passed, failed and skipped per family, and the time.
func Summary(runs []*Run) string {
	var b strings.Builder
	for _, r := range runs {
		counts := map[string]map[string]int{}
		var families []string
		for _, c := range r.Cases {
			if counts[c.Family] == nil {
				counts[c.Family] = map[string]int{}
				families = append(families, c.Family)
			}
			counts[c.Family][c.Result]++
		}
		sort.Strings(families)
		fmt.Fprintf(&b, "%-20s %4.0fs  %d checks;", r.Name(), r.Seconds, len(r.Checks))
		for _, f := range families {
			c := counts[f]
			fmt.Fprintf(&b, " %s %d passed", f, c["pass"])
			if c["fail"] > 0 {
				fmt.Fprintf(&b, " %d FAILED", c["fail"])
			}
			if c["skip"] > 0 {
				fmt.Fprintf(&b, " %d skipped", c["skip"])
			}
			b.WriteString(";")
		}
		b.WriteString("\n")
	}
	return b.String()
}
