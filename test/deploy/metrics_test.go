package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// The metric names sluice exports, per mode, come from pkg/metrics.Registry itself.
// metrics.Register works once per process, so each mode is registered in a child process
// (this test binary, re-run with metricsModeEnv set), which reports what its registry holds.
//
// A Registry cannot list its collectors, and a vector without series gathers nothing, so
// the child asks the registry about each collector pkg/metrics declares (registering an
// already registered collector fails with AlreadyRegisteredError) and takes the names from
// the collector's descriptions. TestCollectorListCoversPkgMetrics keeps that list complete.

const metricsModeEnv = "SLUICE_TEST_METRICS_MODE"

// modes are the modes metrics.Register knows.
var modes = []string{"iptables", "nftables", "ipvs", "recording"}

func TestMain(m *testing.M) {
	if mode := os.Getenv(metricsModeEnv); mode != "" {
		if err := json.NewEncoder(os.Stdout).Encode(registeredMetrics(mode)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// collectors are pkg/metrics' collector variables by name.
var collectors = map[string]prometheus.Collector{
	"SyncProxyRulesLatency":                      metrics.SyncProxyRulesLatency,
	"SyncFullProxyRulesLatency":                  metrics.SyncFullProxyRulesLatency,
	"SyncPartialProxyRulesLatency":               metrics.SyncPartialProxyRulesLatency,
	"SyncProxyRulesLastTimestamp":                metrics.SyncProxyRulesLastTimestamp,
	"SyncProxyRulesLastQueuedTimestamp":          metrics.SyncProxyRulesLastQueuedTimestamp,
	"NetworkProgrammingLatency":                  metrics.NetworkProgrammingLatency,
	"EndpointChangesPending":                     metrics.EndpointChangesPending,
	"EndpointChangesTotal":                       metrics.EndpointChangesTotal,
	"ServiceChangesPending":                      metrics.ServiceChangesPending,
	"ServiceChangesTotal":                        metrics.ServiceChangesTotal,
	"ProxyHealthzTotal":                          metrics.ProxyHealthzTotal,
	"ProxyLivezTotal":                            metrics.ProxyLivezTotal,
	"SyncProxyRulesNoLocalEndpointsTotal":        metrics.SyncProxyRulesNoLocalEndpointsTotal,
	"IPTablesRestoreFailuresTotal":               metrics.IPTablesRestoreFailuresTotal,
	"IPTablesPartialRestoreFailuresTotal":        metrics.IPTablesPartialRestoreFailuresTotal,
	"IPTablesRulesTotal":                         metrics.IPTablesRulesTotal,
	"IPTablesRulesLastSync":                      metrics.IPTablesRulesLastSync,
	"NFTablesSyncFailuresTotal":                  metrics.NFTablesSyncFailuresTotal,
	"NFTablesCleanupFailuresTotal":               metrics.NFTablesCleanupFailuresTotal,
	"ReconcileConntrackFlowsLatency":             metrics.ReconcileConntrackFlowsLatency,
	"ReconcileConntrackFlowsDeletedEntriesTotal": metrics.ReconcileConntrackFlowsDeletedEntriesTotal,
	"SyncFailuresTotal":                          metrics.SyncFailuresTotal,
	"ServicesFailed":                             metrics.ServicesFailed,
	"ServicePortsDesired":                        metrics.ServicePortsDesired,
	"InputProblemsTotal":                         metrics.InputProblemsTotal,
	"DriftRepairsTotal":                          metrics.DriftRepairsTotal,
	"ConfigWarnings":                             metrics.ConfigWarnings,
	"NodeSetupWarningsTotal":                     metrics.NodeSetupWarningsTotal,
	"LocalTrafficDetectionMissing":               metrics.LocalTrafficDetectionMissing,
}

// descs are pkg/metrics' bare descriptions: series a collector produces at scrape time,
// that of a mode (the iptables nfacct counters, when the kernel supports them) or, with
// mode "", that of every mode (the conntrack table's health, registered by pkg/app).
var descs = map[string]struct {
	desc *prometheus.Desc
	mode string
	typ  string
}{
	"IPTablesCTStateInvalidDroppedPacketsDesc": {metrics.IPTablesCTStateInvalidDroppedPacketsDesc, "iptables", "counter"},
	"LocalhostNodePortAcceptedPacketsDesc":     {metrics.LocalhostNodePortAcceptedPacketsDesc, "iptables", "counter"},
	"ConntrackEntriesDesc":                     {metrics.ConntrackEntriesDesc, "", "gauge"},
	"ConntrackLimitDesc":                       {metrics.ConntrackLimitDesc, "", "gauge"},
	"ConntrackFoundDesc":                       {metrics.ConntrackFoundDesc, "", "counter"},
	"ConntrackInvalidDesc":                     {metrics.ConntrackInvalidDesc, "", "counter"},
	"ConntrackInsertDesc":                      {metrics.ConntrackInsertDesc, "", "counter"},
	"ConntrackInsertFailedDesc":                {metrics.ConntrackInsertFailedDesc, "", "counter"},
	"ConntrackDropDesc":                        {metrics.ConntrackDropDesc, "", "counter"},
	"ConntrackEarlyDropDesc":                   {metrics.ConntrackEarlyDropDesc, "", "counter"},
	"ConntrackErrorDesc":                       {metrics.ConntrackErrorDesc, "", "counter"},
	"ConntrackSearchRestartDesc":               {metrics.ConntrackSearchRestartDesc, "", "counter"},
	"ConntrackClashResolveDesc":                {metrics.ConntrackClashResolveDesc, "", "counter"},
	"ConntrackChainTooLongDesc":                {metrics.ConntrackChainTooLongDesc, "", "counter"},
	"ConntrackReadFailuresDesc":                {metrics.ConntrackReadFailuresDesc, "", "counter"},
}

// exportedMetric is one metric family as a mode serves it.
type exportedMetric struct {
	Name string `json:"name"`
	Type string `json:"type"` // counter, gauge, histogram, summary or untyped
	// Labels are the variable label names.
	Labels []string `json:"labels,omitempty"`
}

// series are the names a query may use for the family: a histogram's are its _bucket,
// _sum and _count, a summary's its own name, _sum and _count.
func (m exportedMetric) series() []string {
	switch m.Type {
	case "histogram":
		return []string{m.Name + "_bucket", m.Name + "_sum", m.Name + "_count"}
	case "summary":
		return []string{m.Name, m.Name + "_sum", m.Name + "_count"}
	}
	return []string{m.Name}
}

var descString = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", help: .*variableLabels: \{([^}]*)\}\}$`)

// describe returns the name and variable labels of a description. client_golang has no
// accessor for them; its String form is documented as for debugging, hence the test
// TestDescriptionsParse that fails loudly if the form changes.
func describeDesc(d *prometheus.Desc) (name string, labels []string, ok bool) {
	m := descString.FindStringSubmatch(d.String())
	if m == nil {
		return "", nil, false
	}
	if m[2] != "" {
		labels = strings.Split(m[2], ",")
	}
	return m[1], labels, true
}

func collectorType(c prometheus.Collector) string {
	// Gauge before Counter: a Gauge has Inc and Add, so it is a Counter too.
	switch c.(type) {
	case prometheus.Histogram, *prometheus.HistogramVec:
		return "histogram"
	case prometheus.Gauge, *prometheus.GaugeVec:
		return "gauge"
	case prometheus.Counter, *prometheus.CounterVec:
		return "counter"
	// A prometheus.Summary has a Histogram's methods, so it lands in the first case; sluice
	// exports no Summary (a *SummaryVec is still told apart).
	case *prometheus.SummaryVec:
		return "summary"
	}
	return "untyped"
}

// registeredMetrics registers mode and reports every metric family its registry serves.
// It runs in the child process.
func registeredMetrics(mode string) []exportedMetric {
	metrics.Register(mode)
	var out []exportedMetric
	for name, c := range collectors {
		err := metrics.Registry.Register(c)
		if err == nil {
			metrics.Registry.Unregister(c) // it was not part of this mode
			continue
		}
		if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(fmt.Sprintf("%s: %v", name, err))
		}
		ch := make(chan *prometheus.Desc, 8)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			fq, labels, ok := describeDesc(d)
			if !ok {
				panic("cannot read " + d.String())
			}
			out = append(out, exportedMetric{Name: fq, Type: collectorType(c), Labels: labels})
		}
	}
	for _, d := range descs {
		if d.mode != mode && d.mode != "" {
			continue
		}
		fq, labels, ok := describeDesc(d.desc)
		if !ok {
			panic("cannot read " + d.desc.String())
		}
		out = append(out, exportedMetric{Name: fq, Type: d.typ, Labels: labels})
	}
	// The Go and process collectors: these are not vectors, so gathering lists them all.
	families, err := metrics.Registry.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "go_") || strings.HasPrefix(f.GetName(), "process_") {
			out = append(out, exportedMetric{Name: f.GetName(), Type: strings.ToLower(f.GetType().String())})
		}
	}
	slices.SortFunc(out, func(a, b exportedMetric) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// exportedByMode runs a child per mode and returns its metric families.
func exportedByMode(t *testing.T) map[string][]exportedMetric {
	t.Helper()
	out := map[string][]exportedMetric{}
	for _, mode := range modes {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), metricsModeEnv+"="+mode)
		stdout, err := cmd.Output()
		if err != nil {
			t.Fatalf("listing %s mode's metrics: %v", mode, err)
		}
		var ms []exportedMetric
		if err := json.Unmarshal(stdout, &ms); err != nil {
			t.Fatalf("listing %s mode's metrics: %v: %s", mode, err, stdout)
		}
		out[mode] = ms
	}
	return out
}

// exportedSeries maps every series name any mode exports to its family.
func exportedSeries(t *testing.T) map[string]exportedMetric {
	t.Helper()
	out := map[string]exportedMetric{}
	for _, ms := range exportedByMode(t) {
		for _, m := range ms {
			for _, s := range m.series() {
				out[s] = m
			}
		}
	}
	return out
}

func TestDescriptionsParse(t *testing.T) {
	d := prometheus.NewDesc("a_b", "help, with: {braces}", []string{"x", "y"}, nil)
	name, labels, ok := describeDesc(d)
	if !ok || name != "a_b" || !slices.Equal(labels, []string{"x", "y"}) {
		t.Fatalf("client_golang's Desc.String changed form: %s", d.String())
	}
}

func TestCollectorListCoversPkgMetrics(t *testing.T) {
	// Every package-level variable of pkg/metrics initialised by prometheus.New*, or by a
	// function of pkg/metrics that returns a prometheus type (its counterVec and the like),
	// must be in collectors or descs, or the other tests would miss its metric.
	path := filepath.Join(repoRoot(t), "pkg", "metrics", "metrics.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	constructors := map[string]bool{}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || fn.Type.Results == nil || len(fn.Type.Results.List) != 1 {
			continue
		}
		typ := fn.Type.Results.List[0].Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if sel, ok := typ.(*ast.SelectorExpr); ok {
			if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "prometheus" {
				constructors[fn.Name.Name] = true
			}
		}
	}
	var declared []string
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) || !name.IsExported() {
					continue
				}
				call, ok := vs.Values[i].(*ast.CallExpr)
				if !ok {
					continue
				}
				if fn, ok := call.Fun.(*ast.Ident); ok && constructors[fn.Name] {
					declared = append(declared, name.Name)
					continue
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
					continue
				}
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "prometheus" && sel.Sel.Name != "NewRegistry" {
					declared = append(declared, name.Name)
				}
			}
		}
	}
	var known []string
	for n := range collectors {
		known = append(known, n)
	}
	for n := range descs {
		known = append(known, n)
	}
	slices.Sort(declared)
	slices.Sort(known)
	if !slices.Equal(declared, known) {
		t.Errorf("pkg/metrics declares %v\nthis test knows %v\nadd the new ones to collectors or descs (and to docs/metrics.md)", declared, known)
	}
}

// The descriptions listed for every mode are exactly those of the conntrack collector
// pkg/app registers in every mode.
func TestEveryModeDescsAreTheConntrackCollectors(t *testing.T) {
	ch := make(chan *prometheus.Desc, 32)
	conntrack.NewMonitor().Describe(ch)
	close(ch)
	var described, listed []string
	for d := range ch {
		described = append(described, d.String())
	}
	for _, d := range descs {
		if d.mode == "" {
			listed = append(listed, d.desc.String())
		}
	}
	slices.Sort(described)
	slices.Sort(listed)
	if !slices.Equal(described, listed) {
		t.Errorf("the conntrack collector describes\n%v\nthis test lists for every mode\n%v", described, listed)
	}
}

func TestEveryModeExportsTheUpstreamCoreMetrics(t *testing.T) {
	for mode, ms := range exportedByMode(t) {
		names := map[string]bool{}
		for _, m := range ms {
			names[m.Name] = true
		}
		for _, want := range []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "process_resident_memory_bytes"} {
			if !names[want] {
				t.Errorf("%s mode does not export %s", mode, want)
			}
		}
	}
}

// promqlExprs returns every PromQL expression of the dashboard (targets and template
// variable queries) and of the rules.
func promqlExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	root := filepath.Join(repoRoot(t), "deploy", "observability")

	data, err := os.ReadFile(filepath.Join(root, "sluice-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[fmt.Sprintf("dashboard panel %q target %s", p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				t.Fatalf("variable %s: query is neither an object nor a string", v.Name)
			}
			q.Query = s
		}
		// label_values(expr, label): the expression is PromQL.
		m := regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_]+\)$`).FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: unexpected query %q", v.Name, q.Query)
		}
		out["dashboard variable "+v.Name] = m[1]
	}

	data, err = os.ReadFile(filepath.Join(root, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule prometheusRule
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert+r.Record] = r.Expr
		}
	}
	return out
}

type dashboardPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// prometheusSeries are series Prometheus makes itself for every target.
var prometheusSeries = map[string]bool{"up": true, "scrape_duration_seconds": true}

func TestDashboardAndAlertsQueryOnlyMetricsSluiceExports(t *testing.T) {
	exported := exportedSeries(t)
	exprs := promqlExprs(t)
	if len(exprs) < 20 {
		t.Fatalf("found only %d expressions; is the dashboard or the rule file being read?", len(exprs))
	}
	for where, expr := range exprs {
		names, err := promqlMetricNames(expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", where, err, expr)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s names no metric: %s", where, expr)
		}
		for _, n := range names {
			if _, ok := exported[n]; !ok && !prometheusSeries[n] {
				t.Errorf("%s queries %s, which sluice does not export", where, n)
			}
		}
	}
}

func TestDashboardChartsEveryProxyMetric(t *testing.T) {
	used := map[string]bool{}
	for _, expr := range promqlExprs(t) {
		names, _ := promqlMetricNames(expr)
		for _, n := range names {
			used[n] = true
		}
	}
	// Not charted on purpose: counters of one iptables detail that most kernels lack.
	notCharted := map[string]string{
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     "nfacct only",
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": "nfacct only",
	}
	for _, ms := range exportedByMode(t) {
		for _, m := range ms {
			if !strings.HasPrefix(m.Name, "kubeproxy_") && !strings.HasPrefix(m.Name, "sluice_") {
				continue
			}
			if _, skip := notCharted[m.Name]; skip {
				continue
			}
			if !slices.ContainsFunc(m.series(), func(s string) bool { return used[s] }) {
				t.Errorf("%s is neither charted nor alerted on", m.Name)
			}
		}
	}
}

func TestMetricsDocListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	byMode := exportedByMode(t)
	modesOf := map[string][]string{}
	for _, mode := range modes {
		for _, m := range byMode[mode] {
			modesOf[m.Name] = append(modesOf[m.Name], mode)
		}
	}
	for mode, ms := range byMode {
		for _, m := range ms {
			if strings.HasPrefix(m.Name, "go_") || strings.HasPrefix(m.Name, "process_") {
				continue
			}
			prefix := "| `" + m.Name + "` | " + m.Type + " |"
			var row string
			for _, l := range strings.Split(string(doc), "\n") {
				if strings.HasPrefix(l, prefix) {
					row = l
				}
			}
			if row == "" {
				t.Errorf("docs/metrics.md has no row starting %q (%s mode exports it)", prefix, mode)
				continue
			}
			for _, l := range m.Labels {
				if !strings.Contains(row, "`"+l+"`") {
					t.Errorf("docs/metrics.md: the row of %s does not name its label %s", m.Name, l)
				}
			}
			// The modes column: "all", or the modes other than recording (which registers
			// the configured mode's metrics, never its own).
			want := "all"
			if in := modesOf[m.Name]; len(in) < len(modes) {
				want = strings.Join(slices.DeleteFunc(slices.Clone(in), func(s string) bool { return s == "recording" }), ", ")
			}
			if cols := strings.Split(row, "|"); len(cols) < 5 || strings.TrimSpace(cols[4]) != want {
				t.Errorf("docs/metrics.md: %s's modes column should be %q: %s", m.Name, want, row)
			}
		}
	}
}
