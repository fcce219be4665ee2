package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

// envInNetns marks the re-executed process, already inside its private network namespace.
const envInNetns = "SLUICE_SCALE_IN_NETNS"

// options are the command line.
type options struct {
	// sizes are the numbers of bulk Services the nftables runs are measured at;
	// iptablesSizes those of the iptables modes; churnSize that of the churn runs (0: none).
	sizes         []int
	iptablesSizes []int
	churnSize     int
	endpoints     int
	proxies       []string
	modes         []string
	skip          []string
	repeat        int

	changes             int
	changeGap           time.Duration
	probeInterval       time.Duration
	changeProbeInterval time.Duration
	firstPacketSamples  int
	coldTimeout         time.Duration
	listTimeout         time.Duration
	createWorkers       int
	resyncs             int
	apiListRepeat       int
	floorRepeat         int

	churn churnOptions

	sluiceBin      string
	kubeProxyBin   string
	echoServer     string
	shippedConfig  string
	outDir         string
	jsonPath       string
	saveRulesets   bool
	syncPeriod     string
	sluiceEnv      []string
	profile        bool
	reportFrom     string
	markdown       bool
	profileWindow  time.Duration
	profileChanges int
	proxyV         int
}

// churnOptions shape the churn runs (churn.go).
type churnOptions struct {
	// runs are the proxies and minSyncPeriods measured under churn.
	runs          []churnRun
	rates         []float64
	probes        int
	flips         int
	flipGap       time.Duration
	probeInterval time.Duration
	flipTimeout   time.Duration
	warmup        time.Duration
	burst         int
	seed          int64
}

func defaultKubeProxy() string {
	if p := os.Getenv("KUBE_PROXY"); p != "" {
		return p
	}
	cache := os.Getenv("SLUICE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "sluice")
	}
	return filepath.Join(cache, "bin", "kube-proxy-v1.37.2")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	sizes := fs.String("sizes", "100,1000,10000,50000", "numbers of ClusterIP Services (plus the sentinel) the nftables runs are measured at, smallest first; the dataset grows from one to the next")
	iptablesSizes := fs.String("iptables-sizes", "10000", "sizes the iptables modes are measured at")
	fs.IntVar(&o.churnSize, "churn-size", 10000, "size the churn runs are measured at (0: no churn runs)")
	fs.IntVar(&o.endpoints, "endpoints", 10, "endpoints in each Service's EndpointSlice")
	proxies := fs.String("proxies", "sluice,kube-proxy", "proxies to measure: sluice, kube-proxy")
	modes := fs.String("modes", "nftables,iptables-legacy,iptables-nft", "modes to measure: nftables, iptables-legacy, iptables-nft")
	skip := fs.String("skip", "kube-proxy/iptables-nft", "proxy/mode pairs not to run (upstream does not finish a cold start on iptables-nft at 10 000 Services, see baseline.md)")
	fs.IntVar(&o.repeat, "repeat", 1, "measure each proxy/mode this many times (each on a fresh node); the table shows medians")
	fs.IntVar(&o.changes, "changes", 5, "endpoint moves per run (the table shows the median)")
	fs.DurationVar(&o.changeGap, "change-gap", 3*time.Second, "pause before each endpoint move (longer than minSyncPeriod, 1s by default, so the move is not rate-limited)")
	fs.DurationVar(&o.probeInterval, "probe-interval", 50*time.Millisecond, "interval between probes while waiting for a cold start")
	fs.DurationVar(&o.changeProbeInterval, "change-probe-interval", 20*time.Millisecond, "interval between probes while waiting for an endpoint move")
	fs.IntVar(&o.firstPacketSamples, "first-packet-samples", 1000, "connects to the ClusterIP (and as many straight to the pod) per run")
	fs.DurationVar(&o.coldTimeout, "cold-timeout", 10*time.Minute, "give up a cold start after this long (the run is reported as timed out)")
	fs.DurationVar(&o.listTimeout, "list-timeout", 3*time.Minute, "give up listing a ruleset (nft list ruleset, iptables-save) after this long")
	fs.IntVar(&o.createWorkers, "create-workers", 64, "concurrent requests writing the dataset")
	fs.IntVar(&o.resyncs, "resyncs", 2, "keep each run going until the proxy has made this many periodic full resyncs after its cold start (for a proxy that makes none, as long as sluice would need), so that peak RSS covers them")
	fs.IntVar(&o.apiListRepeat, "api-list-repeat", 3, "bare client LISTs and watch-lists of the dataset timed at each size (medians)")
	fs.IntVar(&o.floorRepeat, "floor-repeat", 5, "iptables-restore --noflush runs of one chain timed after each iptables run (the floor; median)")
	fs.StringVar(&o.sluiceBin, "sluice", envOr("SLUICE_BIN", "bin/sluice"), "sluice binary ($SLUICE_BIN)")
	fs.StringVar(&o.kubeProxyBin, "kube-proxy", defaultKubeProxy(), "upstream kube-proxy binary ($KUBE_PROXY; hack/bench.sh builds it)")
	fs.StringVar(&o.echoServer, "echoserver", envOr("SLUICE_ECHOSERVER", "bin/echoserver"), "echo server binary ($SLUICE_ECHOSERVER; `make build` builds it)")
	fs.StringVar(&o.shippedConfig, "shipped-config", "deploy/base/config.conf", "the configuration sluice ships: its nftables minSyncPeriod and syncPeriod are \"shipped\" in -churn-runs")
	fs.StringVar(&o.outDir, "out", "", "directory for logs, profiles and results (default _output/scale/<time>)")
	fs.StringVar(&o.jsonPath, "json", "", "results as JSON (default <out>/results.json)")
	fs.BoolVar(&o.profile, "profile", false, "after the measured runs, run each sluice mode once more at the largest size taking a CPU profile of its cold start and heap profiles (/debug/pprof, enableProfiling) into <out>; profiled runs are kept out of the summary")
	fs.DurationVar(&o.profileWindow, "profile-window", 30*time.Second, "length of the cold-start CPU profile (from when the metrics server answers)")
	fs.IntVar(&o.profileChanges, "profile-changes", 30, "endpoint moves in a profiled run, under a CPU profile of their own")
	fs.BoolVar(&o.saveRulesets, "save-rulesets", false, "keep each run's ruleset listing in its log directory (ruleset.txt; tens of MB at 10 000 Services in iptables modes)")
	fs.StringVar(&o.syncPeriod, "sync-period", "30s", "syncPeriod of both proxies (upstream's default); sluice's nftables mode resyncs fully this often, which -resyncs waits for")
	fs.StringVar(&o.reportFrom, "report", "", "print the table of an earlier run's results JSON (summarised again) and exit")
	fs.BoolVar(&o.markdown, "markdown", false, "with -report: print the Markdown tables of docs/benchmarks.md instead")
	sluiceEnv := fs.String("sluice-env", "", "comma-separated NAME=VALUE added to sluice's environment, e.g. GOMEMLIMIT=150MiB (experiments; recorded in the results)")
	fs.IntVar(&o.proxyV, "proxy-v", 0, "log verbosity of the proxies (0 is upstream's default)")

	churnRuns := fs.String("churn-runs", "sluice@shipped,kube-proxy@default,kube-proxy@shipped",
		"proxy@minSyncPeriod pairs measured under churn, in nftables mode; minSyncPeriod is a duration, \"default\" (the proxy's own, upstream's 1s) or \"shipped\" (-shipped-config's)")
	churnRates := fs.String("churn-rates", "20,100", "background endpoint changes per second, one churn phase each")
	fs.IntVar(&o.churn.probes, "churn-probes", 10, "single-endpoint probe Services flipped between two pods of the node")
	fs.IntVar(&o.churn.flips, "churn-flips", 40, "flips of each probe Service per churn phase (one at a time, probes in turn)")
	fs.DurationVar(&o.churn.flipGap, "churn-flip-gap", 200*time.Millisecond, "mean pause between a flip being served and the next (uniform in [gap/2, 3gap/2], seeded), so flips fall at random points of the sync loop")
	fs.DurationVar(&o.churn.probeInterval, "churn-probe-interval", 2*time.Millisecond, "a new connection from the node to the flipped Service this often")
	fs.DurationVar(&o.churn.flipTimeout, "churn-flip-timeout", 30*time.Second, "give up a flip after this long")
	fs.DurationVar(&o.churn.warmup, "churn-warmup", 3*time.Second, "background churn before a phase's first flip")
	fs.IntVar(&o.churn.burst, "churn-burst", 1000, "endpoint changes sent as fast as the apiserver takes them after the phases, to count the syncs they collapse into (0: no burst)")
	fs.Int64Var(&o.churn.seed, "seed", 1, "seed of every random choice (which Services churn, flip gaps)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var err error
	if o.sizes, err = parseInts(*sizes); err != nil {
		return nil, fmt.Errorf("-sizes: %w", err)
	}
	if o.iptablesSizes, err = parseInts(*iptablesSizes); err != nil {
		return nil, fmt.Errorf("-iptables-sizes: %w", err)
	}
	if o.churn.runs, err = parseChurnRuns(*churnRuns); err != nil {
		return nil, fmt.Errorf("-churn-runs: %w", err)
	}
	if o.churn.rates, err = parseRates(*churnRates); err != nil {
		return nil, fmt.Errorf("-churn-rates: %w", err)
	}
	o.proxies, o.modes, o.skip = splitList(*proxies), splitList(*modes), splitList(*skip)
	o.sluiceEnv = splitList(*sluiceEnv)
	for _, kv := range o.sluiceEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("-sluice-env: %q is not NAME=VALUE", kv)
		}
	}
	for _, p := range o.proxies {
		if p != proxySluice && p != proxyUpstream {
			return nil, fmt.Errorf("-proxies: unknown proxy %q (want sluice, kube-proxy)", p)
		}
	}
	for _, m := range o.modes {
		if !slices.Contains(allModes, m) {
			return nil, fmt.Errorf("-modes: unknown mode %q (want %s)", m, strings.Join(allModes, ", "))
		}
	}
	if _, err := time.ParseDuration(o.syncPeriod); err != nil {
		return nil, fmt.Errorf("-sync-period: %w", err)
	}
	switch {
	case o.endpoints < 1 || o.repeat < 1 || o.changes < 0 || o.firstPacketSamples < 0 || o.churnSize < 0 || o.resyncs < 0:
		return nil, errors.New("-endpoints and -repeat must be positive; -changes, -first-packet-samples, -churn-size and -resyncs not negative")
	case o.churnSize > 0 && (o.churn.probes < 1 || o.churn.flips < 1 || o.churn.probeInterval <= 0):
		return nil, errors.New("-churn-probes, -churn-flips and -churn-probe-interval must be positive")
	case uint64(o.largestSize())*uint64(o.endpoints) >= 1<<21:
		return nil, errors.New("too many endpoints: fake endpoint addresses come from the lower half of 100.64.0.0/10")
	case o.churn.probes > maxProbes:
		return nil, fmt.Errorf("-churn-probes: at most %d", maxProbes)
	case o.largestSize() >= 1<<20-1:
		return nil, errors.New("too many Services: churn's added endpoints come from 100.96.0.0/12")
	}
	if o.outDir == "" {
		o.outDir = filepath.Join("_output", "scale", time.Now().Format("20060102-150405"))
	}
	if o.jsonPath == "" {
		o.jsonPath = filepath.Join(o.outDir, "results.json")
	}
	return o, nil
}

// largestSize is the largest number of bulk Services any part of the run needs.
func (o *options) largestSize() int {
	n := o.churnSize
	for _, s := range append(slices.Clone(o.sizes), o.iptablesSizes...) {
		n = max(n, s)
	}
	return n
}

// plan lists the dataset sizes in the order they are written, each with the runs measured
// there: nftables runs at -sizes, iptables runs at -iptables-sizes (proxies alternating
// within a mode, as runSpecs orders them), and whether the churn runs happen there.
func (o *options) plan() []sizePlan {
	all := runSpecs(o.proxies, o.modes, o.skip)
	var sizes []int
	for _, s := range append(append(slices.Clone(o.sizes), o.iptablesSizes...), o.churnSize) {
		if s > 0 && !slices.Contains(sizes, s) {
			sizes = append(sizes, s)
		}
	}
	slices.Sort(sizes)
	var out []sizePlan
	for _, size := range sizes {
		p := sizePlan{services: size, churn: size == o.churnSize && len(o.churn.runs) > 0 && len(o.churn.rates) > 0}
		for _, r := range all {
			at := o.iptablesSizes
			if r.Mode == modeNFTables {
				at = o.sizes
			}
			if slices.Contains(at, size) {
				p.runs = append(p.runs, r)
			}
		}
		if len(p.runs) > 0 || p.churn {
			out = append(out, p)
		}
	}
	return out
}

// sizePlan is what is measured at one dataset size.
type sizePlan struct {
	services int
	runs     []runSpec
	churn    bool
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("not a positive number: %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	if o.reportFrom != "" {
		os.Exit(reprint(o.reportFrom, o.markdown))
	}
	if os.Getenv(envInNetns) == "" {
		os.Exit(outside(o))
	}
	os.Exit(inside(o))
}

// outside checks and resolves everything that needs the machine's namespace (building
// binaries may need the Go module proxy), then re-executes this program in a private
// network namespace and waits for it.
func outside(o *options) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "scale: needs root (network namespaces, netfilter)")
		return 1
	}
	if err := resolveBinaries(o); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	bins, err := controlplane.FindBinaries(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale: control plane binaries:", err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	// Flags are passed again with the resolved paths; later flags win.
	args := append([]string{"--net", "--", exe}, os.Args[1:]...)
	args = append(args, "-sluice", o.sluiceBin, "-kube-proxy", o.kubeProxyBin, "-echoserver", o.echoServer, "-shipped-config", o.shippedConfig,
		"-out", o.outDir, "-json", o.jsonPath)
	cmd := exec.Command("unshare", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envInNetns+"=1", "KUBE_APISERVER="+bins.KubeAPIServer, "ETCD="+bins.Etcd,
		"SLUICE_ECHOSERVER="+o.echoServer)
	// The child gets the terminal's signals too and tears down; this process only waits.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "scale: re-executing in a private network namespace:", err)
		return 1
	}
	return 0
}

// resolveBinaries makes every binary path absolute and checks it can run.
func resolveBinaries(o *options) error {
	var err error
	needUpstream := slices.Contains(o.proxies, proxyUpstream) ||
		(o.churnSize > 0 && slices.ContainsFunc(o.churn.runs, func(c churnRun) bool { return c.Proxy == proxyUpstream }))
	for _, b := range []struct {
		flag string
		path *string
		need bool
		hint string
	}{
		{"-sluice", &o.sluiceBin, slices.Contains(o.proxies, proxySluice), "make build"},
		{"-kube-proxy", &o.kubeProxyBin, needUpstream, "hack/bench.sh builds it from the Go module proxy"},
		{"-echoserver", &o.echoServer, true, "make build"},
	} {
		abs, err := filepath.Abs(*b.path)
		if err != nil {
			return err
		}
		*b.path = abs
		if !b.need {
			continue
		}
		if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s %s: not an executable file (%s)", b.flag, abs, b.hint)
		}
	}
	if o.shippedConfig, err = filepath.Abs(o.shippedConfig); err != nil {
		return err
	}
	out, err := filepath.Abs(o.outDir)
	if err != nil {
		return err
	}
	o.outDir = out
	if o.jsonPath, err = filepath.Abs(o.jsonPath); err != nil {
		return err
	}
	return os.MkdirAll(o.outDir, 0o755)
}

// reprint prints the table of a results file, summarised again (summaries follow this
// program's current rules).
func reprint(path string, markdown bool) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	// The summaries are made again: leave out those of the file, whose shape may be older.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		fmt.Fprintf(os.Stderr, "scale: %s: %v\n", path, err)
		return 1
	}
	delete(raw, "summary")
	delete(raw, "ratios")
	delete(raw, "churnSummary")
	if b, err = json.Marshal(raw); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		fmt.Fprintf(os.Stderr, "scale: %s: %v\n", path, err)
		return 1
	}
	r.summarise()
	if markdown {
		r.printMarkdown(os.Stdout)
	} else {
		r.printTable(os.Stdout)
	}
	return 0
}
