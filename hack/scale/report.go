package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one invocation measured; it is written as JSON.
type Report struct {
	Started      time.Time  `json:"started"`
	Finished     time.Time  `json:"finished"`
	Machine      Machine    `json:"machine"`
	LoadAvgStart [3]float64 `json:"loadAvgStart"`
	LoadAvgEnd   [3]float64 `json:"loadAvgEnd"`
	Sluice       Binary     `json:"sluice"`
	KubeProxy    Binary     `json:"kubeProxy"`
	Options      Options    `json:"options"`
	// Datasets are the dataset's growth steps and how long writing each took.
	Datasets []DatasetStep `json:"datasets"`
	// Runs are the individual measurements, in the order they ran.
	Runs []RunResult `json:"runs"`
	// Summary has one row per size and proxy/mode (medians over -repeat runs).
	Summary []SummaryRow `json:"summary"`
	// Ratios compare sluice with upstream for each size and mode both ran in.
	Ratios []RatioRow `json:"ratios"`
}

// Machine describes where the run happened.
type Machine struct {
	Kernel      string `json:"kernel"`
	CPUs        int    `json:"cpus"`
	MemoryBytes int64  `json:"memoryBytes"`
	GoVersion   string `json:"goVersion"`
}

// Binary is one proxy binary.
type Binary struct {
	Path    string `json:"path"`
	Version string `json:"version"`
}

// Options are the settings that shape the numbers.
type Options struct {
	Services            int      `json:"services"`
	Endpoints           int      `json:"endpoints"`
	SmallSizes          []int    `json:"smallSizes"`
	SmallRuns           []string `json:"smallRuns"`
	Repeat              int      `json:"repeat"`
	Changes             int      `json:"changes"`
	ChangeGap           string   `json:"changeGap"`
	ProbeInterval       string   `json:"probeInterval"`
	ChangeProbeInterval string   `json:"changeProbeInterval"`
	FirstPacketSamples  int      `json:"firstPacketSamples"`
	ColdTimeout         string   `json:"coldTimeout"`
	Profile             bool     `json:"profile"`
	SyncPeriod          string   `json:"syncPeriod,omitempty"`
	SluiceEnv           []string `json:"sluiceEnv,omitempty"`
	ProxyVerbosity      int      `json:"proxyVerbosity"`
}

// DatasetStep is one growth of the dataset.
type DatasetStep struct {
	Services     int     `json:"services"`
	Endpoints    int     `json:"endpoints"`
	WriteSeconds float64 `json:"writeSeconds"`
}

// RunResult is one proxy measured on one fresh node.
type RunResult struct {
	Proxy     string `json:"proxy"`
	Mode      string `json:"mode"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Repeat    int    `json:"repeat"`
	// Profiled runs took profiles (-profile) and are left out of the summary.
	Profiled     bool       `json:"profiled,omitempty"`
	Node         string     `json:"node"`
	Started      time.Time  `json:"started"`
	LoadAvgStart [3]float64 `json:"loadAvgStart"`
	LoadAvgEnd   [3]float64 `json:"loadAvgEnd"`
	// Error says why the run stopped early; what was measured until then is kept.
	Error string      `json:"error,omitempty"`
	Cold  *ColdResult `json:"cold,omitempty"`
	// ServicesFailed is sluice's sluice_services_failed after the cold start.
	ServicesFailed *int           `json:"servicesFailed,omitempty"`
	Changes        []ChangeResult `json:"changes,omitempty"`
	// BulkChanges move one endpoint of a Service of -endpoints (the sentinel has one).
	BulkChanges []BulkChangeResult `json:"bulkChanges,omitempty"`
	FirstPacket *FirstPacketResult `json:"firstPacket,omitempty"`
	// Syncs and FullSyncs count the proxy's (IPv4) syncs over the run, and the full ones
	// among them.
	Syncs        int   `json:"syncs"`
	FullSyncs    int   `json:"fullSyncs"`
	PeakRSSBytes int64 `json:"peakRSSBytes"`
	// HelperPeakRSSBytes is the largest VmHWM of a program the proxy ran (HelperName).
	HelperPeakRSSBytes int64  `json:"helperPeakRSSBytes"`
	HelperName         string `json:"helperName,omitempty"`
	// CPUSeconds is the proxy's CPU time at the end of the run, ChildCPUSeconds the part
	// of it spent in the programs it ran.
	CPUSeconds      float64      `json:"cpuSeconds"`
	ChildCPUSeconds float64      `json:"childCPUSeconds"`
	Ruleset         *RulesetSize `json:"ruleset,omitempty"`
	LogPath         string       `json:"logPath,omitempty"`
	Profiles        []string     `json:"profiles,omitempty"`
}

// ColdResult is a cold start.
type ColdResult struct {
	TimedOut bool `json:"timedOut"`
	// SentinelSeconds is from the process start to the sentinel's first answer through
	// its ClusterIP.
	SentinelSeconds float64 `json:"sentinelSeconds"`
	// FirstSyncSeconds is from the process start to the first scrape showing a completed
	// sync (scraped every 100ms).
	FirstSyncSeconds float64 `json:"firstSyncSeconds"`
	// FirstSyncOwnSeconds is the sum of kubeproxy_sync_proxy_rules_duration_seconds at that
	// scrape (FirstSyncCount observations): the proxy's own account of its first sync.
	FirstSyncOwnSeconds float64 `json:"firstSyncOwnSeconds"`
	FirstSyncCount      int     `json:"firstSyncCount"`
	// CPUSeconds is the proxy's CPU time (its own and its finished children's) when the
	// sentinel answered.
	CPUSeconds float64 `json:"cpuSeconds"`
	// ChildCPUSeconds is the part of CPUSeconds spent in the programs the proxy ran (nft,
	// iptables-restore).
	ChildCPUSeconds float64 `json:"childCPUSeconds"`
	RSSBytesAtReady int64   `json:"rssBytesAtReady"`
	// PeakRSSBytes is VmHWM when the sentinel answered: the cold start's peak.
	PeakRSSBytes int64  `json:"peakRSSBytes,omitempty"`
	Probes       int    `json:"probes"`
	Note         string `json:"note,omitempty"`
}

// ChangeResult is one move of the sentinel's endpoint.
type ChangeResult struct {
	From string `json:"from"`
	To   string `json:"to"`
	// VisibleSeconds is from sending the patch to the first answer from the new pod.
	VisibleSeconds  float64 `json:"visibleSeconds"`
	APIWriteSeconds float64 `json:"apiWriteSeconds"`
	// SyncSeconds is the mean of the proxy's sync histogram over the syncs it observed
	// meanwhile (SyncCount, normally 1; PartialSyncCount of them partial).
	SyncSeconds      float64 `json:"syncSeconds"`
	SyncCount        int     `json:"syncCount"`
	PartialSyncCount int     `json:"partialSyncCount"`
	TimedOut         bool    `json:"timedOut,omitempty"`
}

// BulkChangeResult is one endpoint of a bulk Service moved to a new address.
type BulkChangeResult struct {
	Service         string  `json:"service"`
	APIWriteSeconds float64 `json:"apiWriteSeconds"`
	// SeenSeconds is from sending the patch to the scrape (every 20ms) that showed the sync.
	SeenSeconds float64 `json:"seenSeconds"`
	SyncSeconds float64 `json:"syncSeconds"`
	SyncCount   int     `json:"syncCount"`
}

// FirstPacketResult is the connect() time to the ClusterIP and straight to its pod.
type FirstPacketResult struct {
	ClusterIP Distribution `json:"clusterIP"`
	Direct    Distribution `json:"direct"`
	Failures  int          `json:"failures"`
}

// SummaryRow is one size and proxy/mode: medians over its runs (NaN-free: missing is 0 and
// Missing says which).
type SummaryRow struct {
	Services             int     `json:"services"`
	Proxy                string  `json:"proxy"`
	Mode                 string  `json:"mode"`
	Runs                 int     `json:"runs"`
	Failed               int     `json:"failed"`
	TimedOut             int     `json:"timedOut"`
	ColdSeconds          float64 `json:"coldSeconds"`
	FirstSyncSeconds     float64 `json:"firstSyncSeconds"`
	FirstSyncOwnSeconds  float64 `json:"firstSyncOwnSeconds"`
	ColdCPUSeconds       float64 `json:"coldCPUSeconds"`
	ColdChildCPUSeconds  float64 `json:"coldChildCPUSeconds"`
	ChangeVisibleSeconds float64 `json:"changeVisibleSeconds"`
	ChangeSyncSeconds    float64 `json:"changeSyncSeconds"`
	// BulkChangeSyncSeconds is the sync time for moving one endpoint of a Service with
	// -endpoints of them.
	BulkChangeSyncSeconds float64 `json:"bulkChangeSyncSeconds"`
	// ReadyRSSBytes is the RSS when the cold start was done (VmHWM then, or VmRSS for
	// results that lack it); PeakRSSBytes is the peak over the whole run.
	ReadyRSSBytes      float64 `json:"readyRSSBytes"`
	PeakRSSBytes       float64 `json:"peakRSSBytes"`
	HelperPeakRSSBytes float64 `json:"helperPeakRSSBytes"`
	// FullSyncs is the largest number of full syncs a run of this row made.
	FullSyncs            int     `json:"fullSyncs"`
	FirstPacketP50Micros float64 `json:"firstPacketP50Micros"`
	FirstPacketP99Micros float64 `json:"firstPacketP99Micros"`
	DirectP50Micros      float64 `json:"directP50Micros"`
	Chains               int     `json:"chains"`
	Rules                int     `json:"rules"`
	Elements             int     `json:"elements"`
	RulesetBytes         int     `json:"rulesetBytes"`
}

// RatioRow is sluice divided by upstream for one size and mode (0 where either is
// missing), with the goals of baseline.md checked where they apply.
type RatioRow struct {
	Services       int      `json:"services"`
	Mode           string   `json:"mode"`
	Cold           float64  `json:"cold"`
	ColdCPU        float64  `json:"coldCPU"`
	ChangeVisible  float64  `json:"changeVisible"`
	ChangeSync     float64  `json:"changeSync"`
	BulkChangeSync float64  `json:"bulkChangeSync"`
	ReadyRSS       float64  `json:"readyRSS"`
	PeakRSS        float64  `json:"peakRSS"`
	FirstPacketP50 float64  `json:"firstPacketP50"`
	FirstPacketP99 float64  `json:"firstPacketP99"`
	Goals          []string `json:"goals"`
}

func newReport(o *options) *Report {
	r := &Report{
		Started:      time.Now(),
		LoadAvgStart: loadAvg(),
		Machine:      machine(),
		Sluice:       Binary{Path: o.sluiceBin, Version: versionOf(o.sluiceBin, "version")},
		KubeProxy:    Binary{Path: o.kubeProxyBin, Version: versionOf(o.kubeProxyBin, "--version")},
		Options: Options{
			Services: o.services, Endpoints: o.endpoints, SmallSizes: o.smallSizes, SmallRuns: o.smallRuns,
			Repeat: o.repeat, Changes: o.changes, ChangeGap: o.changeGap.String(),
			ProbeInterval: o.probeInterval.String(), ChangeProbeInterval: o.changeProbeInterval.String(),
			FirstPacketSamples: o.firstPacketSamples, ColdTimeout: o.coldTimeout.String(), Profile: o.profile,
			SyncPeriod: o.syncPeriod, SluiceEnv: o.sluiceEnv, ProxyVerbosity: o.proxyV,
		},
	}
	// The cached upstream build does not stamp its version; its file name carries it.
	if strings.Contains(r.KubeProxy.Version, "v0.0.0-master") {
		r.KubeProxy.Version = filepath.Base(o.kubeProxyBin) + " (" + r.KubeProxy.Version + ")"
	}
	return r
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryBytes, _ = parseStatusField(b, "MemTotal")
	}
	return m
}

func versionOf(bin, arg string) string {
	out, err := exec.Command(bin, arg).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

func (r *Report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// oneLine is the run's result for the progress log.
func (res *RunResult) oneLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s at %d:", res.Proxy, res.Mode, res.Services)
	if res.Profiled {
		b.WriteString(" (profiled)")
	}
	if c := res.Cold; c != nil && !c.TimedOut && c.SentinelSeconds > 0 {
		fmt.Fprintf(&b, " cold %.2fs (cpu %.1fs)", c.SentinelSeconds, c.CPUSeconds)
	}
	if v := changeMedian(res.Changes, func(c ChangeResult) float64 { return c.VisibleSeconds }); !math.IsNaN(v) {
		fmt.Fprintf(&b, " change %s (sync %s)", seconds(v), seconds(changeMedian(res.Changes, func(c ChangeResult) float64 { return c.SyncSeconds })))
	}
	fmt.Fprintf(&b, " peak RSS %s", mib(float64(res.PeakRSSBytes)))
	if res.Error != "" {
		fmt.Fprintf(&b, " ERROR: %s", firstLine(res.Error))
	}
	return b.String()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// changeMedian is the median of f over the changes that completed (NaN if none).
func changeMedian(changes []ChangeResult, f func(ChangeResult) float64) float64 {
	var v []float64
	for _, c := range changes {
		if c.VisibleSeconds > 0 {
			v = append(v, f(c))
		}
	}
	return median(v)
}

// summarise fills Summary and Ratios from Runs.
func (r *Report) summarise() {
	r.Summary, r.Ratios = nil, nil
	type key struct {
		services    int
		proxy, mode string
	}
	var order []key
	groups := map[key][]RunResult{}
	for _, run := range r.Runs {
		if run.Profiled {
			continue
		}
		k := key{run.Services, run.Proxy, run.Mode}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], run)
	}
	rows := map[key]SummaryRow{}
	for _, k := range order {
		row := summaryOf(groups[k])
		row.Services, row.Proxy, row.Mode = k.services, k.proxy, k.mode
		r.Summary = append(r.Summary, row)
		rows[k] = row
	}
	for _, k := range order {
		if k.proxy != proxySluice {
			continue
		}
		up, ok := rows[key{k.services, proxyUpstream, k.mode}]
		if !ok {
			continue
		}
		s := rows[k]
		if up.ColdSeconds == 0 {
			r.Ratios = append(r.Ratios, RatioRow{Services: k.services, Mode: k.mode,
				Goals: []string{fmt.Sprintf("no ratio: upstream did not complete a cold start (%d of %d runs timed out, %d failed)", up.TimedOut, up.Runs, up.Failed)}})
			continue
		}
		ratio := RatioRow{
			Services: k.services, Mode: k.mode,
			Cold: div(s.ColdSeconds, up.ColdSeconds), ColdCPU: div(s.ColdCPUSeconds, up.ColdCPUSeconds),
			ChangeVisible: div(s.ChangeVisibleSeconds, up.ChangeVisibleSeconds), ChangeSync: div(s.ChangeSyncSeconds, up.ChangeSyncSeconds),
			BulkChangeSync: div(s.BulkChangeSyncSeconds, up.BulkChangeSyncSeconds),
			ReadyRSS:       div(s.ReadyRSSBytes, up.ReadyRSSBytes), PeakRSS: div(s.PeakRSSBytes, up.PeakRSSBytes),
			FirstPacketP50: div(s.FirstPacketP50Micros, up.FirstPacketP50Micros), FirstPacketP99: div(s.FirstPacketP99Micros, up.FirstPacketP99Micros),
		}
		ratio.Goals = goals(k.mode, s, ratio)
		r.Ratios = append(r.Ratios, ratio)
	}
}

func summaryOf(runs []RunResult) SummaryRow {
	row := SummaryRow{Runs: len(runs)}
	var cold, firstSync, firstOwn, coldCPU, coldChild, visible, sync, bulkSync, readyRSS, rss, helper, p50, p99, direct []float64
	for _, run := range runs {
		if run.Error != "" {
			row.Failed++
		}
		if c := run.Cold; c != nil {
			if c.TimedOut {
				row.TimedOut++
			}
			if c.SentinelSeconds > 0 {
				ready := c.PeakRSSBytes
				if ready == 0 {
					ready = c.RSSBytesAtReady
				}
				readyRSS = append(readyRSS, float64(ready))
				cold = append(cold, c.SentinelSeconds)
				coldCPU = append(coldCPU, c.CPUSeconds)
				coldChild = append(coldChild, c.ChildCPUSeconds)
			}
			if c.FirstSyncSeconds > 0 {
				firstSync = append(firstSync, c.FirstSyncSeconds)
				firstOwn = append(firstOwn, c.FirstSyncOwnSeconds)
			}
		}
		if v := changeMedian(run.Changes, func(c ChangeResult) float64 { return c.VisibleSeconds }); !math.IsNaN(v) {
			visible = append(visible, v)
			sync = append(sync, changeMedian(run.Changes, func(c ChangeResult) float64 { return c.SyncSeconds }))
		}
		// A run cut short has not reached its peak.
		var bs []float64
		for _, c := range run.BulkChanges {
			if c.SyncCount > 0 {
				bs = append(bs, c.SyncSeconds)
			}
		}
		if len(bs) > 0 {
			bulkSync = append(bulkSync, median(bs))
		}
		row.FullSyncs = max(row.FullSyncs, run.FullSyncs)
		if run.PeakRSSBytes > 0 && run.Error == "" {
			rss = append(rss, float64(run.PeakRSSBytes))
		}
		if run.HelperPeakRSSBytes > 0 && run.Error == "" {
			helper = append(helper, float64(run.HelperPeakRSSBytes))
		}
		if fp := run.FirstPacket; fp != nil && fp.ClusterIP.N > 0 {
			p50 = append(p50, fp.ClusterIP.P50)
			p99 = append(p99, fp.ClusterIP.P99)
			direct = append(direct, fp.Direct.P50)
		}
		if rs := run.Ruleset; rs != nil && rs.Error == "" && row.RulesetBytes == 0 {
			row.Chains, row.Rules, row.Elements, row.RulesetBytes = rs.Chains, rs.Rules, rs.Elements, rs.Bytes
		}
	}
	row.ColdSeconds, row.FirstSyncSeconds, row.FirstSyncOwnSeconds = orZero(median(cold)), orZero(median(firstSync)), orZero(median(firstOwn))
	row.ColdCPUSeconds, row.ChangeVisibleSeconds, row.ChangeSyncSeconds = orZero(median(coldCPU)), orZero(median(visible)), orZero(median(sync))
	row.ColdChildCPUSeconds, row.ReadyRSSBytes = orZero(median(coldChild)), orZero(median(readyRSS))
	row.BulkChangeSyncSeconds = orZero(median(bulkSync))
	row.PeakRSSBytes, row.HelperPeakRSSBytes = orZero(median(rss)), orZero(median(helper))
	row.FirstPacketP50Micros, row.FirstPacketP99Micros, row.DirectP50Micros = orZero(median(p50)), orZero(median(p99)), orZero(median(direct))
	return row
}

func orZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

func div(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// goals checks baseline.md's goals for sluice: nftables cold <= 1/5 of upstream, one
// endpoint sync <= 20ms, peak RSS <= 1/2; iptables cold, sync and peak RSS <= 1/2.
func goals(mode string, s SummaryRow, ratio RatioRow) []string {
	check := func(name string, ok bool, got string) string {
		verdict := "met"
		if !ok {
			verdict = "MISSED"
		}
		return fmt.Sprintf("%s: %s (%s)", name, verdict, got)
	}
	var out []string
	if ratio.Cold > 0 {
		limit := 0.5
		if mode == modeNFTables {
			limit = 0.2
		}
		out = append(out, check(fmt.Sprintf("cold <= %.1fx upstream", limit), ratio.Cold <= limit, fmt.Sprintf("%.2fx", ratio.Cold)))
	}
	for _, c := range []struct {
		what        string
		sync, ratio float64
	}{
		{"one-endpoint sync (1-endpoint Service)", s.ChangeSyncSeconds, ratio.ChangeSync},
		{"one-endpoint sync (multi-endpoint Service)", s.BulkChangeSyncSeconds, ratio.BulkChangeSync},
	} {
		switch {
		case c.sync <= 0:
		case mode == modeNFTables:
			out = append(out, check(c.what+" <= 20ms", c.sync <= 0.020, seconds(c.sync)))
		case c.ratio > 0:
			out = append(out, check(c.what+" <= 0.5x upstream", c.ratio <= 0.5, fmt.Sprintf("%.2fx", c.ratio)))
		}
	}
	if ratio.PeakRSS > 0 {
		out = append(out, check("peak RSS <= 0.5x upstream", ratio.PeakRSS <= 0.5, fmt.Sprintf("%.2fx; %.2fx when the cold start is done", ratio.PeakRSS, ratio.ReadyRSS)))
	}
	return out
}

// seconds renders a duration given in seconds: "840ms", "13.5s".
func seconds(v float64) string {
	switch {
	case math.IsNaN(v) || v <= 0:
		return "-"
	case v < 0.1:
		return fmt.Sprintf("%.1fms", v*1000)
	case v < 1:
		return fmt.Sprintf("%.0fms", v*1000)
	case v < 100:
		return fmt.Sprintf("%.2fs", v)
	}
	return fmt.Sprintf("%.0fs", v)
}

func mib(bytes float64) string {
	if bytes <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fMiB", bytes/(1<<20))
}

func micros(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fµs", v)
}

func ratioText(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}

// printTable writes the summary and the ratios for people.
func (r *Report) printTable(w io.Writer) {
	fmt.Fprintf(w, "\nsluice scale benchmark, %s; %d CPUs, kernel %s; load average %.2f %.2f %.2f at start, %.2f %.2f %.2f at end\n",
		r.Started.Format("2006-01-02 15:04"), r.Machine.CPUs, r.Machine.Kernel,
		r.LoadAvgStart[0], r.LoadAvgStart[1], r.LoadAvgStart[2], r.LoadAvgEnd[0], r.LoadAvgEnd[1], r.LoadAvgEnd[2])
	fmt.Fprintf(w, "sluice: %s\nupstream: %s\n", r.Sluice.Version, r.KubeProxy.Version)
	fmt.Fprintf(w, "%d endpoints per Service; medians of %d endpoint moves; %d first-packet samples\n",
		r.Options.Endpoints, r.Options.Changes, r.Options.FirstPacketSamples)
	if r.Options.SyncPeriod != "" || len(r.Options.SluiceEnv) > 0 || r.Options.ProxyVerbosity != 0 {
		fmt.Fprintf(w, "NOT the default setup: syncPeriod %q, sluice environment %q, proxy verbosity %d\n",
			r.Options.SyncPeriod, r.Options.SluiceEnv, r.Options.ProxyVerbosity)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tproxy/mode\tcold\tfirst sync\t(own time)\tcold CPU\t(helpers)\tchange seen\tchange sync\tmulti-ep sync\tRSS ready\tpeak RSS\thelper RSS\tchains\trules\telements\tfirst pkt p50\tp99\tdirect p50\tnotes\t")
	for _, s := range r.Summary {
		var notes []string
		if s.Runs > 1 {
			notes = append(notes, fmt.Sprintf("median of %d", s.Runs))
		}
		if s.FullSyncs > 1 {
			notes = append(notes, fmt.Sprintf("up to %d full syncs", s.FullSyncs))
		}
		if s.TimedOut > 0 {
			notes = append(notes, fmt.Sprintf("%d/%d timed out", s.TimedOut, s.Runs))
		} else if s.Failed > 0 {
			notes = append(notes, fmt.Sprintf("%d/%d failed", s.Failed, s.Runs))
		}
		fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			s.Services, s.Proxy, s.Mode, seconds(s.ColdSeconds), seconds(s.FirstSyncSeconds), seconds(s.FirstSyncOwnSeconds),
			seconds(s.ColdCPUSeconds), seconds(s.ColdChildCPUSeconds), seconds(s.ChangeVisibleSeconds), seconds(s.ChangeSyncSeconds), seconds(s.BulkChangeSyncSeconds),
			mib(s.ReadyRSSBytes), mib(s.PeakRSSBytes), mib(s.HelperPeakRSSBytes), count(s.Chains), count(s.Rules), count(s.Elements),
			micros(s.FirstPacketP50Micros), micros(s.FirstPacketP99Micros), micros(s.DirectP50Micros), strings.Join(notes, "; "))
	}
	tw.Flush()
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w, "\nsluice / upstream, same run:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "services\tmode\tcold\tcold CPU\tchange seen\tchange sync\tmulti-ep sync\tRSS ready\tpeak RSS\tfirst pkt p50\tp99\tgoals (baseline.md)")
		for _, q := range r.Ratios {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.Services, q.Mode, ratioText(q.Cold), ratioText(q.ColdCPU),
				ratioText(q.ChangeVisible), ratioText(q.ChangeSync), ratioText(q.BulkChangeSync), ratioText(q.ReadyRSS), ratioText(q.PeakRSS), ratioText(q.FirstPacketP50), ratioText(q.FirstPacketP99),
				strings.Join(q.Goals, "; "))
		}
		tw.Flush()
	}
	var errs []string
	for _, run := range r.Runs {
		if run.Error != "" {
			errs = append(errs, fmt.Sprintf("  %s/%s at %d (node %s): %s", run.Proxy, run.Mode, run.Services, run.Node, strings.ReplaceAll(run.Error, "\n", "\n    ")))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nruns that stopped early:\n%s\n", strings.Join(errs, "\n"))
	}
}

func count(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}
