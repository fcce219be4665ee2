// Command checkresults judges the conformance suite's recorded runs (test/conformance/results):
//
//	go run ./test/conformance/checkresults [flags] DIR...
//
// DIR holds the <proxy>-<mode>.json files the suite wrote (-results). For every mode with a
// sluice run and an upstream kube-proxy run, every check's outcome must be the same in both,
// except where test/conformance/differences.yaml declares the difference; the capability
// table derived from sluice's runs must equal test/conformance/capabilities.json. It prints a
// summary per run (cases per family, time) and exits 1 on any problem.
//
// With -update it writes the derived capability table into capabilities.json, for the modes
// the runs cover, and the README's generated table, instead of failing on a difference there.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/sluiceproxy/sluice/test/conformance/results"
)

func main() {
	update := flag.Bool("update", false, "write the capability table derived from the runs into -table and -readme")
	reference := flag.Bool("reference", true, "require an upstream kube-proxy run for every mode sluice ran in")
	tablePath := flag.String("table", "test/conformance/capabilities.json", "the checked-in capability table")
	diffPath := flag.String("differences", "test/conformance/differences.yaml", "the declared differences from upstream")
	readmePath := flag.String("readme", "test/conformance/README.md", "the README whose capability table -update rewrites")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: checkresults [flags] DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	problems, err := check(flag.Args(), *tablePath, *diffPath, *readmePath, *update, *reference)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkresults:", err)
		os.Exit(1)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "checkresults: %d problem(s):\n", len(problems))
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "  "+p)
		}
		os.Exit(1)
	}
	fmt.Println("checkresults: ok")
}

func check(dirs []string, tablePath, diffPath, readmePath string, update, reference bool) ([]string, error) {
	var runs []*results.Run
	for _, d := range dirs {
		rs, err := results.Load(d)
		if err != nil {
			return nil, err
		}
		runs = append(runs, rs...)
	}
	fmt.Print(results.Summary(runs))

	data, err := os.ReadFile(diffPath)
	if err != nil {
		return nil, err
	}
	diffs, err := results.ParseDifferences(data)
	if err != nil {
		return nil, err
	}
	data, err = os.ReadFile(tablePath)
	if err != nil {
		return nil, err
	}
	table, err := results.ParseTable(data)
	if err != nil {
		return nil, err
	}

	var problems []string
	byName := map[string]*results.Run{}
	var backends []string
	for _, r := range runs {
		if _, dup := byName[r.Name()]; dup {
			problems = append(problems, "two runs of "+r.Name())
		}
		byName[r.Name()] = r
		if r.Proxy == results.Sluice {
			backends = append(backends, r.Backend)
		}
	}
	sort.Strings(backends)
	for _, b := range backends {
		s, u := byName[results.Sluice+"-"+b], byName[results.Upstream+"-"+b]
		if u == nil {
			if reference {
				problems = append(problems, "no upstream kube-proxy run for "+b+" to compare sluice's with")
			}
			continue
		}
		ps := results.Compare(s, u, diffs)
		problems = append(problems, ps...)
		fmt.Printf("%s: sluice and upstream compared over %d of sluice's %d checks, %d problem(s)\n", b, results.Compared(s, u), len(s.Checks), len(ps))
		for _, d := range diffs {
			if d.Backend == b {
				fmt.Printf("  declared difference %s: sluice %q, upstream %q\n", d, d.Sluice, d.Upstream)
			}
		}
	}
	for _, r := range runs {
		for _, c := range r.Cases {
			if c.Result == "fail" {
				problems = append(problems, fmt.Sprintf("%s: %s/%s failed", r.Name(), c.Case, c.Family))
			}
		}
	}

	derived, ps := results.Derive(runs)
	problems = append(problems, ps...)
	for name := range derived {
		if _, ok := results.Docs[name]; !ok {
			problems = append(problems, "capability "+name+" has no entry in results.Docs")
		}
	}
	if !update {
		return append(problems, results.CheckTable(table, derived, runs)...), nil
	}
	updated := results.Update(table, derived, runs)
	if err := results.WriteFileAtomic(tablePath, updated.Marshal()); err != nil {
		return nil, err
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return nil, err
	}
	out, err := results.ReplaceTable(string(readme), results.Render(updated, results.Docs))
	if err != nil {
		return nil, err
	}
	if err := results.WriteFileAtomic(readmePath, []byte(out)); err != nil {
		return nil, err
	}
	fmt.Printf("checkresults: wrote %s and the table in %s (%s)\n", tablePath, readmePath, strings.Join(backends, ", "))
	return problems, nil
}
