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
	// ControlPlaneStartSeconds is how long etcd and kube-apiserver took to be ready.
	ControlPlaneStartSeconds float64 `json:"controlPlaneStartSeconds"`
	// Datasets are the dataset's growth steps and how long writing each took.
	Datasets []DatasetStep `json:"datasets"`
	// APILists are the API side of a cold start at each size, timed with a bare client.
	APILists []APIListResult `json:"apiLists,omitempty"`
	// Runs are the individual measurements, in the order they ran.
	Runs []RunResult `json:"runs"`
	// Summary has one row per size and proxy/mode (medians over -repeat runs).
	Summary []SummaryRow `json:"summary"`
	// Ratios compare sluice with upstream for each size and mode both ran in.
	Ratios []RatioRow `json:"ratios"`
	// Shipped is what the churn runs read from sluice's shipped configuration.
	Shipped *ShippedConfig `json:"shipped,omitempty"`
	// Churn are the churn runs, ChurnSummary one row per run and rate.
	Churn        []ChurnResult `json:"churn,omitempty"`
	ChurnSummary []ChurnRow    `json:"churnSummary,omitempty"`
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
	Sizes               []int     `json:"sizes"`
	IPTablesSizes       []int     `json:"iptablesSizes"`
	ChurnSize           int       `json:"churnSize"`
	Endpoints           int       `json:"endpoints"`
	Proxies             []string  `json:"proxies"`
	Modes               []string  `json:"modes"`
	Skip                []string  `json:"skip"`
	Repeat              int       `json:"repeat"`
	Resyncs             int       `json:"resyncs"`
	CreateWorkers       int       `json:"createWorkers"`
	APIServerFlags      []string  `json:"apiServerFlags"`
	ChurnRuns           []string  `json:"churnRuns,omitempty"`
	ChurnRates          []float64 `json:"churnRates,omitempty"`
	ChurnProbes         int       `json:"churnProbes"`
	ChurnFlips          int       `json:"churnFlips"`
	ChurnFlipGap        string    `json:"churnFlipGap"`
	ChurnProbeInterval  string    `json:"churnProbeInterval"`
	ChurnBurst          int       `json:"churnBurst"`
	Seed                int64     `json:"seed"`
	Changes             int       `json:"changes"`
	ChangeGap           string    `json:"changeGap"`
	ProbeInterval       string    `json:"probeInterval"`
	ChangeProbeInterval string    `json:"changeProbeInterval"`
	FirstPacketSamples  int       `json:"firstPacketSamples"`
	ColdTimeout         string    `json:"coldTimeout"`
	Profile             bool      `json:"profile"`
	SyncPeriod          string    `json:"syncPeriod,omitempty"`
	SluiceEnv           []string  `json:"sluiceEnv,omitempty"`
	ProxyVerbosity      int       `json:"proxyVerbosity"`
}

// DatasetStep is one growth of the dataset.
type DatasetStep struct {
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
	// Objects is the number of Services and EndpointSlices written in this step.
	Objects      int     `json:"objects"`
	WriteSeconds float64 `json:"writeSeconds"`
	// APIServerCPUSeconds is kube-apiserver's CPU time over the step.
	APIServerCPUSeconds float64 `json:"apiserverCPUSeconds,omitempty"`
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
	WallSeconds  float64    `json:"wallSeconds"`
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
	Syncs     int `json:"syncs"`
	FullSyncs int `json:"fullSyncs"`
	// PeriodicFullSyncs is the number of full syncs after the cold start (sluice's
	// nftables resyncs; upstream makes one an hour).
	PeriodicFullSyncs int `json:"periodicFullSyncs"`
	// PeakRSSBytes is VmHWM at the end of the run (the whole run's peak), RSSBytesAtEnd
	// VmRSS then.
	PeakRSSBytes  int64 `json:"peakRSSBytes"`
	RSSBytesAtEnd int64 `json:"rssBytesAtEnd"`
	// HelperPeakRSSBytes is the largest VmHWM of a program the proxy ran (HelperName).
	HelperPeakRSSBytes int64  `json:"helperPeakRSSBytes"`
	HelperName         string `json:"helperName,omitempty"`
	// CPUSeconds is the proxy's CPU time at the end of the run, ChildCPUSeconds the part
	// of it spent in the programs it ran.
	CPUSeconds      float64      `json:"cpuSeconds"`
	ChildCPUSeconds float64      `json:"childCPUSeconds"`
	Ruleset         *RulesetSize `json:"ruleset,omitempty"`
	// Floor is an iptables mode's one-chain restore into the table the proxy left.
	Floor    *FloorResult `json:"floor,omitempty"`
	LogPath  string       `json:"logPath,omitempty"`
	Profiles []string     `json:"profiles,omitempty"`
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
	// FullSyncs is the count of full syncs just after the cold start.
	FullSyncs int `json:"fullSyncs"`
	// InformersSyncedSeconds is from the process start to the proxy's log line saying it
	// has every Service and EndpointSlice: the API side of the cold start as the proxy
	// saw it (list or watch-list, decoding, its informers' handlers).
	InformersSyncedSeconds float64 `json:"informersSyncedSeconds,omitempty"`
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
	Services            int     `json:"services"`
	Proxy               string  `json:"proxy"`
	Mode                string  `json:"mode"`
	Runs                int     `json:"runs"`
	Failed              int     `json:"failed"`
	TimedOut            int     `json:"timedOut"`
	ColdSeconds         float64 `json:"coldSeconds"`
	FirstSyncSeconds    float64 `json:"firstSyncSeconds"`
	FirstSyncOwnSeconds float64 `json:"firstSyncOwnSeconds"`
	// InformersSyncedSeconds is the API side of the cold start as the proxy logged it;
	// OwnColdSeconds the rest (ColdSeconds less it).
	InformersSyncedSeconds float64 `json:"informersSyncedSeconds"`
	OwnColdSeconds         float64 `json:"ownColdSeconds"`
	ColdCPUSeconds         float64 `json:"coldCPUSeconds"`
	ColdChildCPUSeconds    float64 `json:"coldChildCPUSeconds"`
	ChangeVisibleSeconds   float64 `json:"changeVisibleSeconds"`
	ChangeSyncSeconds      float64 `json:"changeSyncSeconds"`
	// BulkChangeSyncSeconds is the sync time for moving one endpoint of a Service with
	// -endpoints of them.
	BulkChangeSyncSeconds float64 `json:"bulkChangeSyncSeconds"`
	// ReadyRSSBytes is the RSS when the cold start was done (VmHWM then, or VmRSS for
	// results that lack it); PeakRSSBytes is the peak over the whole run.
	ReadyRSSBytes      float64 `json:"readyRSSBytes"`
	PeakRSSBytes       float64 `json:"peakRSSBytes"`
	HelperPeakRSSBytes float64 `json:"helperPeakRSSBytes"`
	// EndRSSBytes is VmRSS at the end of the run, after the resyncs.
	EndRSSBytes float64 `json:"endRSSBytes"`
	// FullSyncs is the largest number of full syncs a run of this row made;
	// PeriodicFullSyncs the fewest made after a cold start (what every peak covers).
	FullSyncs            int     `json:"fullSyncs"`
	PeriodicFullSyncs    int     `json:"periodicFullSyncs"`
	FirstPacketP50Micros float64 `json:"firstPacketP50Micros"`
	FirstPacketP99Micros float64 `json:"firstPacketP99Micros"`
	DirectP50Micros      float64 `json:"directP50Micros"`
	Chains               int     `json:"chains"`
	Rules                int     `json:"rules"`
	Elements             int     `json:"elements"`
	RulesetBytes         int     `json:"rulesetBytes"`
	// FloorSeconds is the iptables one-chain restore floor (median).
	FloorSeconds float64 `json:"floorSeconds"`
	// WallSeconds is how long a run took (median).
	WallSeconds float64 `json:"wallSeconds"`
}

// RatioRow is sluice divided by upstream for one size and mode (0 where either is
// missing), with the goals of baseline.md and issue 14 checked where they apply.
type RatioRow struct {
	Services       int     `json:"services"`
	Mode           string  `json:"mode"`
	Cold           float64 `json:"cold"`
	OwnCold        float64 `json:"ownCold"`
	ColdCPU        float64 `json:"coldCPU"`
	ChangeVisible  float64 `json:"changeVisible"`
	ChangeSync     float64 `json:"changeSync"`
	BulkChangeSync float64 `json:"bulkChangeSync"`
	ReadyRSS       float64 `json:"readyRSS"`
	PeakRSS        float64 `json:"peakRSS"`
	FirstPacketP50 float64 `json:"firstPacketP50"`
	FirstPacketP99 float64 `json:"firstPacketP99"`
	Goals          []Goal  `json:"goals"`
}

func newReport(o *options) *Report {
	r := &Report{
		Started:      time.Now(),
		LoadAvgStart: loadAvg(),
		Machine:      machine(),
		Sluice:       Binary{Path: o.sluiceBin, Version: versionOf(o.sluiceBin, "version")},
		KubeProxy:    Binary{Path: o.kubeProxyBin, Version: versionOf(o.kubeProxyBin, "--version")},
		Options: Options{
			Sizes: o.sizes, IPTablesSizes: o.iptablesSizes, ChurnSize: o.churnSize, Endpoints: o.endpoints,
			Proxies: o.proxies, Modes: o.modes, Skip: o.skip, Repeat: o.repeat, Resyncs: o.resyncs,
			CreateWorkers: o.createWorkers, APIServerFlags: apiServerFlags,
			Changes: o.changes, ChangeGap: o.changeGap.String(),
			ProbeInterval: o.probeInterval.String(), ChangeProbeInterval: o.changeProbeInterval.String(),
			FirstPacketSamples: o.firstPacketSamples, ColdTimeout: o.coldTimeout.String(), Profile: o.profile,
			SyncPeriod: o.syncPeriod, SluiceEnv: o.sluiceEnv, ProxyVerbosity: o.proxyV,
			ChurnRates: o.churn.rates, ChurnProbes: o.churn.probes, ChurnFlips: o.churn.flips,
			ChurnFlipGap: o.churn.flipGap.String(), ChurnProbeInterval: o.churn.probeInterval.String(),
			ChurnBurst: o.churn.burst, Seed: o.churn.seed,
		},
	}
	for _, c := range o.churn.runs {
		r.Options.ChurnRuns = append(r.Options.ChurnRuns, c.String())
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

// summarise fills Summary and Ratios from Runs, and ChurnSummary from Churn.
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
	// The smallest size sluice ran at in each mode: issue 14 compares the one-change sync
	// with its value there.
	smallest := map[string]SummaryRow{}
	for _, row := range r.Summary {
		if s, ok := smallest[row.Mode]; row.Proxy == proxySluice && row.ChangeSyncSeconds > 0 && (!ok || row.Services < s.Services) {
			smallest[row.Mode] = row
		}
	}
	for _, k := range order {
		if k.proxy != proxySluice {
			continue
		}
		s := rows[k]
		up, ok := rows[key{k.services, proxyUpstream, k.mode}]
		if !ok {
			continue
		}
		ratio := RatioRow{
			Services: k.services, Mode: k.mode,
			Cold: div(s.ColdSeconds, up.ColdSeconds), OwnCold: div(s.OwnColdSeconds, up.OwnColdSeconds), ColdCPU: div(s.ColdCPUSeconds, up.ColdCPUSeconds),
			ChangeVisible: div(s.ChangeVisibleSeconds, up.ChangeVisibleSeconds), ChangeSync: div(s.ChangeSyncSeconds, up.ChangeSyncSeconds),
			BulkChangeSync: div(s.BulkChangeSyncSeconds, up.BulkChangeSyncSeconds),
			ReadyRSS:       div(s.ReadyRSSBytes, up.ReadyRSSBytes), PeakRSS: div(s.PeakRSSBytes, up.PeakRSSBytes),
			FirstPacketP50: div(s.FirstPacketP50Micros, up.FirstPacketP50Micros), FirstPacketP99: div(s.FirstPacketP99Micros, up.FirstPacketP99Micros),
		}
		ratio.Goals = goals(k.mode, s, up, ratio, smallest[k.mode])
		r.Ratios = append(r.Ratios, ratio)
	}
	// A sluice row without an upstream one still has goals of its own (iptables floor).
	for _, k := range order {
		if _, ok := rows[key{k.services, proxyUpstream, k.mode}]; k.proxy == proxySluice && !ok {
			if g := goals(k.mode, rows[k], SummaryRow{}, RatioRow{}, smallest[k.mode]); len(g) > 0 {
				r.Ratios = append(r.Ratios, RatioRow{Services: k.services, Mode: k.mode, Goals: g})
			}
		}
	}
	r.ChurnSummary = churnSummary(r.Churn)
}

func summaryOf(runs []RunResult) SummaryRow {
	row := SummaryRow{Runs: len(runs), PeriodicFullSyncs: -1}
	var cold, firstSync, firstOwn, informers, own, coldCPU, coldChild, visible, sync, bulkSync, readyRSS, rss, endRSS, helper, p50, p99, direct, floor, wall []float64
	for _, run := range runs {
		if run.Error != "" {
			row.Failed++
		}
		wall = append(wall, run.WallSeconds)
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
				if c.InformersSyncedSeconds > 0 {
					informers = append(informers, c.InformersSyncedSeconds)
					own = append(own, c.SentinelSeconds-c.InformersSyncedSeconds)
				}
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
		// A run cut short has not reached its peak.
		if run.PeakRSSBytes > 0 && run.Error == "" {
			rss = append(rss, float64(run.PeakRSSBytes))
			endRSS = append(endRSS, float64(run.RSSBytesAtEnd))
			if row.PeriodicFullSyncs < 0 || run.PeriodicFullSyncs < row.PeriodicFullSyncs {
				row.PeriodicFullSyncs = run.PeriodicFullSyncs
			}
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
		if f := run.Floor; f != nil && f.MedianSeconds > 0 {
			floor = append(floor, f.MedianSeconds)
		}
	}
	row.PeriodicFullSyncs = max(row.PeriodicFullSyncs, 0)
	row.ColdSeconds, row.FirstSyncSeconds, row.FirstSyncOwnSeconds = orZero(median(cold)), orZero(median(firstSync)), orZero(median(firstOwn))
	row.InformersSyncedSeconds, row.OwnColdSeconds = orZero(median(informers)), orZero(median(own))
	row.ColdCPUSeconds, row.ChangeVisibleSeconds, row.ChangeSyncSeconds = orZero(median(coldCPU)), orZero(median(visible)), orZero(median(sync))
	row.ColdChildCPUSeconds, row.ReadyRSSBytes = orZero(median(coldChild)), orZero(median(readyRSS))
	row.BulkChangeSyncSeconds = orZero(median(bulkSync))
	row.PeakRSSBytes, row.HelperPeakRSSBytes, row.EndRSSBytes = orZero(median(rss)), orZero(median(helper)), orZero(median(endRSS))
	row.FirstPacketP50Micros, row.FirstPacketP99Micros, row.DirectP50Micros = orZero(median(p50)), orZero(median(p99)), orZero(median(direct))
	row.FloorSeconds, row.WallSeconds = orZero(median(floor)), orZero(median(wall))
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

// Goals of issue 14 at the sizes it names.
const (
	// issue14ColdSize is where sluice's cold start must be <= 1/10 of upstream's (or
	// upstream not finish within issue14UpstreamLimit while sluice finishes within
	// issue14SluiceLimit).
	issue14ColdSize      = 50000
	issue14UpstreamLimit = 10 * time.Minute
	issue14SluiceLimit   = 30 * time.Second
	issue14SyncLimit     = 0.002 // the one-change sync at 10 000 and 50 000, seconds
	issue14SyncGrowth    = 1.5   // ... and within this factor of its value at the smallest size
	issue14FloorFactor   = 1.2   // iptables-legacy one-change sync against the restore floor
	issue14RSSRatio      = 0.5
	// baselineSize is where baseline.md's goals apply.
	baselineSize          = 10000
	baselineNFTColdRatio  = 0.2
	baselineIPTablesRatio = 0.5
)

// issue14Size tells the sizes issue 14's memory and one-change goals name (nftables).
func issue14Size(services int) bool { return services == 10000 || services == 50000 }

// Goal is one goal checked against a run's figures.
type Goal struct {
	Name string `json:"name"`
	Met  bool   `json:"met"`
	// Got is what was measured, in words.
	Got string `json:"got"`
	// OfLimit is the measured value over the goal's limit (at most 1 when met), 0 for a
	// goal without a limit.
	OfLimit float64 `json:"ofLimit,omitempty"`
}

func (g Goal) String() string {
	verdict := "met"
	if !g.Met {
		verdict = "MISSED"
	}
	s := fmt.Sprintf("%s: %s (%s", g.Name, verdict, g.Got)
	if g.OfLimit > 0 {
		s += fmt.Sprintf("; %.2f of the limit", g.OfLimit)
	}
	return s + ")"
}

// atMost is the goal "value <= limit".
func atMost(name string, value, limit float64, got string) Goal {
	return Goal{Name: name, Met: value <= limit, Got: got, OfLimit: value / limit}
}

// goals checks the goals of baseline.md and issue 14 for sluice (s) against upstream (up,
// zero when upstream has no row), with smallest sluice's row at the smallest size of the
// mode.
func goals(mode string, s, up SummaryRow, ratio RatioRow, smallest SummaryRow) []Goal {
	var out []Goal
	switch {
	case s.Services == issue14ColdSize && mode == modeNFTables && up.TimedOut > 0 && up.ColdSeconds == 0:
		g := atMost(fmt.Sprintf("cold: upstream does not finish within %s, sluice within %s", issue14UpstreamLimit, issue14SluiceLimit),
			s.ColdSeconds, issue14SluiceLimit.Seconds(), "sluice "+seconds(s.ColdSeconds))
		g.Met = g.Met && s.ColdSeconds > 0
		out = append(out, g)
	case s.Services == issue14ColdSize && mode == modeNFTables && ratio.Cold > 0:
		out = append(out, atMost("cold <= 0.1x upstream", ratio.Cold, 0.1, fmt.Sprintf("%.3fx; sluice's own part %.3fx", ratio.Cold, ratio.OwnCold)))
	case ratio.Cold > 0 && s.Services == baselineSize:
		limit := baselineIPTablesRatio
		if mode == modeNFTables {
			limit = baselineNFTColdRatio
		}
		out = append(out, atMost(fmt.Sprintf("cold <= %.1fx upstream", limit), ratio.Cold, limit, fmt.Sprintf("%.2fx", ratio.Cold)))
	}
	if mode == modeNFTables && issue14Size(s.Services) {
		for _, c := range []struct {
			what       string
			sync, base float64
		}{
			{"one-endpoint sync (1-endpoint Service)", s.ChangeSyncSeconds, smallest.ChangeSyncSeconds},
			{"one-endpoint sync (multi-endpoint Service)", s.BulkChangeSyncSeconds, smallest.BulkChangeSyncSeconds},
		} {
			if c.sync <= 0 {
				continue
			}
			out = append(out, atMost(c.what+" <= 2ms", c.sync, issue14SyncLimit, seconds(c.sync)))
			if c.base > 0 && smallest.Services < s.Services {
				out = append(out, atMost(fmt.Sprintf("%s <= 1.5x its value at %d", c.what, smallest.Services), c.sync/c.base, issue14SyncGrowth,
					fmt.Sprintf("%.2fx: %s against %s", c.sync/c.base, seconds(c.sync), seconds(c.base))))
			}
		}
	}
	if mode != modeNFTables && ratio.ChangeSync > 0 && s.Services == baselineSize {
		out = append(out, atMost("one-endpoint sync <= 0.5x upstream", ratio.ChangeSync, baselineIPTablesRatio, fmt.Sprintf("%.2fx", ratio.ChangeSync)))
	}
	if mode == modeIPTablesLegacy && s.FloorSeconds > 0 && s.ChangeSyncSeconds > 0 {
		f := s.ChangeSyncSeconds / s.FloorSeconds
		out = append(out, atMost("one-endpoint sync <= 1.2x the one-chain restore floor", f, issue14FloorFactor,
			fmt.Sprintf("%.2fx: %s against %s", f, seconds(s.ChangeSyncSeconds), seconds(s.FloorSeconds))))
	}
	if mode == modeIPTablesNFT && up.Runs == 0 {
		out = append(out, Goal{Name: "cold start finishes", Met: s.ColdSeconds > 0, Got: seconds(s.ColdSeconds)})
	}
	if ratio.PeakRSS > 0 && (issue14Size(s.Services) && mode == modeNFTables || s.Services == baselineSize) {
		name := "peak RSS <= 0.5x upstream"
		if s.PeriodicFullSyncs > 0 {
			name += fmt.Sprintf(" (sluice's peak over %d periodic full resyncs)", s.PeriodicFullSyncs)
		}
		out = append(out, atMost(name, ratio.PeakRSS, issue14RSSRatio, fmt.Sprintf("%.2fx; %.2fx when the cold start is done", ratio.PeakRSS, ratio.ReadyRSS)))
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
	end := "unfinished"
	if !r.Finished.IsZero() {
		end = fmt.Sprintf("%s; load average %.2f %.2f %.2f at end", r.Finished.Format("15:04"), r.LoadAvgEnd[0], r.LoadAvgEnd[1], r.LoadAvgEnd[2])
	}
	fmt.Fprintf(w, "\nsluice scale benchmark, %s to %s; %d CPUs, kernel %s; load average %.2f %.2f %.2f at start\n",
		r.Started.Format("2006-01-02 15:04"), end, r.Machine.CPUs, r.Machine.Kernel,
		r.LoadAvgStart[0], r.LoadAvgStart[1], r.LoadAvgStart[2])
	fmt.Fprintf(w, "sluice: %s\nupstream: %s\n", r.Sluice.Version, r.KubeProxy.Version)
	fmt.Fprintf(w, "%d endpoints per Service; medians of %d endpoint moves; %d first-packet samples; syncPeriod %s, runs kept going for %d periodic resyncs\n",
		r.Options.Endpoints, r.Options.Changes, r.Options.FirstPacketSamples, r.Options.SyncPeriod, r.Options.Resyncs)
	if len(r.Options.SluiceEnv) > 0 || r.Options.ProxyVerbosity != 0 {
		fmt.Fprintf(w, "NOT the default setup: sluice environment %q, proxy verbosity %d\n", r.Options.SluiceEnv, r.Options.ProxyVerbosity)
	}

	if len(r.Datasets) > 0 {
		fmt.Fprintf(w, "\nDataset (%d concurrent creates; control plane ready in %s):\n", r.Options.CreateWorkers, seconds(r.ControlPlaneStartSeconds))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "services\tobjects written\ttook\tobjects/s\tkube-apiserver CPU\t")
		for _, d := range r.Datasets {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%.0f\t%s\t\n", d.Services, d.Objects, seconds(d.WriteSeconds), div(float64(d.Objects), d.WriteSeconds), seconds(d.APIServerCPUSeconds))
		}
		_ = tw.Flush() // a report on a terminal: nowhere better to say it failed
	}
	if len(r.APILists) > 0 {
		fmt.Fprintln(w, "\nAPI side of a cold start, bare client as system:kube-proxy, protobuf (Services + EndpointSlices, medians):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "services\tobjects\tLIST (watch cache)\tbytes\tdecoding\twatch-list (decoded)\t")
		for _, a := range r.APILists {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%.1fMB\t%s\t%s\t\n", a.Services, a.Objects, seconds(a.ListSeconds), float64(a.ListBytes)/1e6, seconds(a.DecodeSeconds), seconds(a.WatchListSeconds))
		}
		_ = tw.Flush() // a report on a terminal: nowhere better to say it failed
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tproxy/mode\tcold\tAPI part\town part\tfirst sync\t(own time)\tcold CPU\t(helpers)\tchange seen\tchange sync\tmulti-ep sync\tRSS ready\tpeak RSS\tresyncs\tRSS at end\thelper RSS\tchains\trules\telements\tfirst pkt p50\tp99\tdirect p50\tfloor\trun took\tnotes\t")
	for _, s := range r.Summary {
		var notes []string
		if s.Runs > 1 {
			notes = append(notes, fmt.Sprintf("median of %d", s.Runs))
		}
		if s.TimedOut > 0 {
			notes = append(notes, fmt.Sprintf("%d/%d timed out", s.TimedOut, s.Runs))
		} else if s.Failed > 0 {
			notes = append(notes, fmt.Sprintf("%d/%d failed", s.Failed, s.Runs))
		}
		fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			s.Services, s.Proxy, s.Mode, seconds(s.ColdSeconds), seconds(s.InformersSyncedSeconds), seconds(s.OwnColdSeconds),
			seconds(s.FirstSyncSeconds), seconds(s.FirstSyncOwnSeconds),
			seconds(s.ColdCPUSeconds), seconds(s.ColdChildCPUSeconds), seconds(s.ChangeVisibleSeconds), seconds(s.ChangeSyncSeconds), seconds(s.BulkChangeSyncSeconds),
			mib(s.ReadyRSSBytes), mib(s.PeakRSSBytes), s.PeriodicFullSyncs, mib(s.EndRSSBytes), mib(s.HelperPeakRSSBytes), count(s.Chains), count(s.Rules), count(s.Elements),
			micros(s.FirstPacketP50Micros), micros(s.FirstPacketP99Micros), micros(s.DirectP50Micros), seconds(s.FloorSeconds), seconds(s.WallSeconds), strings.Join(notes, "; "))
	}
	_ = tw.Flush() // a report on a terminal: nowhere better to say it failed
	if len(r.Ratios) > 0 {
		fmt.Fprintln(w, "\nsluice / upstream, same run:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "services\tmode\tcold\town part\tcold CPU\tchange seen\tchange sync\tmulti-ep sync\tRSS ready\tpeak RSS\tfirst pkt p50\tp99")
		for _, q := range r.Ratios {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.Services, q.Mode, ratioText(q.Cold), ratioText(q.OwnCold), ratioText(q.ColdCPU),
				ratioText(q.ChangeVisible), ratioText(q.ChangeSync), ratioText(q.BulkChangeSync), ratioText(q.ReadyRSS), ratioText(q.PeakRSS), ratioText(q.FirstPacketP50), ratioText(q.FirstPacketP99))
		}
		_ = tw.Flush() // a report on a terminal: nowhere better to say it failed
		fmt.Fprintln(w, "\ngoals (baseline.md, issue 14):")
		for _, q := range r.Ratios {
			for _, g := range q.Goals {
				fmt.Fprintf(w, "  %d %s: %s\n", q.Services, q.Mode, g)
			}
		}
	}
	r.printChurn(w)
	var errs []string
	for _, run := range r.Runs {
		if run.Error != "" {
			errs = append(errs, fmt.Sprintf("  %s/%s at %d (node %s): %s", run.Proxy, run.Mode, run.Services, run.Node, strings.ReplaceAll(run.Error, "\n", "\n    ")))
		}
	}
	for _, c := range r.Churn {
		if c.Error != "" {
			errs = append(errs, fmt.Sprintf("  churn %s at %d (node %s): %s", c.Run, c.Services, c.Node, strings.ReplaceAll(c.Error, "\n", "\n    ")))
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
