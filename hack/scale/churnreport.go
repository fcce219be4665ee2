package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Goals of issue 14's churn item, for sluice with its shipped configuration.
const (
	churnP50Limit = 0.025
	churnP99Limit = 0.050
	// burstCollapse: a burst must need at most this fraction of its changes as syncs.
	burstCollapse = 0.1
	// programmingSlack is how far a measured quantile may lie outside the metric's bucket
	// for it and still agree: the metric stops when the rules are written, the measurement
	// at the next connection through them (one probe interval later at most) and counts
	// the update's trip through the apiserver the same way.
	programmingSlack = 5 * time.Millisecond
)

// ChurnRow is one churn run at one rate.
type ChurnRow struct {
	Run           string  `json:"run"`
	Proxy         string  `json:"proxy"`
	MinSyncPeriod string  `json:"minSyncPeriod"`
	Rate          float64 `json:"rate"`
	AchievedRate  float64 `json:"achievedRate"`
	Flips         int     `json:"flips"`
	FlipErrors    int     `json:"flipErrors"`
	// P50, P99, Max and Mean of the flips, from the update to the first new connection
	// the new pod answered, in seconds.
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
	// WriteP50 and WriteP99 are the API updates' round trips; AfterWriteP50 and
	// AfterWriteP99 the flips counted from the update's answer instead of its sending (the
	// proxy cannot act before the write is committed): how much of the figure is the
	// apiserver's.
	WriteP50      float64 `json:"writeP50"`
	WriteP99      float64 `json:"writeP99"`
	AfterWriteP50 float64 `json:"afterWriteP50"`
	AfterWriteP99 float64 `json:"afterWriteP99"`
	// Stale counts connections the old pod answered after the new one had (all flips).
	Stale int `json:"stale"`
	// Changes is the background changes plus the flips in the window, Syncs the proxy's
	// syncs in it.
	Changes      int     `json:"changes"`
	Syncs        int     `json:"syncs"`
	CPUPerSecond float64 `json:"cpuPerSecond"`
	// ChildCPUPerSecond is the helpers' part (upstream's nft).
	ChildCPUPerSecond float64              `json:"childCPUPerSecond"`
	Programming       ProgrammingAgreement `json:"programming"`
	// BurstChanges and BurstSyncs are the run's burst (on its first row only).
	BurstChanges int    `json:"burstChanges,omitempty"`
	BurstSyncs   int    `json:"burstSyncs,omitempty"`
	Goals        []Goal `json:"goals,omitempty"`
}

// ProgrammingAgreement compares kubeproxy_network_programming_duration_seconds over a
// phase with the flips measured in it.
type ProgrammingAgreement struct {
	// Observations is the histogram's count over the phase (the flips, and nothing else,
	// carry a trigger time); Mean its sum over count, in seconds.
	Observations int     `json:"observations"`
	Mean         float64 `json:"mean"`
	// P50Bucket and P99Bucket are the buckets holding the histogram's quantiles, as
	// [low, high] in seconds (high +Inf past the last bound).
	P50Bucket [2]float64 `json:"p50Bucket"`
	P99Bucket [2]float64 `json:"p99Bucket"`
	// Agrees is set when each measured quantile falls in the histogram's bucket for it
	// (within programmingSlack).
	Agrees bool   `json:"agrees"`
	Note   string `json:"note,omitempty"`
}

// churnSummary makes one row per run and rate.
func churnSummary(runs []ChurnResult) []ChurnRow {
	var out []ChurnRow
	for _, c := range runs {
		for i, p := range c.Phases {
			row := ChurnRow{Run: c.Run, Proxy: c.Proxy, MinSyncPeriod: c.MinSyncPeriod, Rate: p.Rate, AchievedRate: p.AchievedRate,
				Flips: len(p.Flips), FlipErrors: len(p.FlipErrors), Syncs: p.Syncs, Changes: p.BackgroundChanges + len(p.Flips) + len(p.FlipErrors)}
			if row.MinSyncPeriod == "" {
				row.MinSyncPeriod = "1s (default)"
			}
			var lat, write, after []float64
			var sum float64
			for _, f := range p.Flips {
				lat = append(lat, f.Seconds)
				write = append(write, f.APIWriteSeconds)
				after = append(after, max(0, f.Seconds-f.APIWriteSeconds))
				sum += f.Seconds
				row.Stale += f.Stale
			}
			slices.Sort(lat)
			slices.Sort(write)
			slices.Sort(after)
			if len(lat) > 0 {
				row.P50, row.P99, row.Max, row.Mean = quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1], sum/float64(len(lat))
				row.WriteP50, row.WriteP99 = quantile(write, 0.5), quantile(write, 0.99)
				row.AfterWriteP50, row.AfterWriteP99 = quantile(after, 0.5), quantile(after, 0.99)
			}
			if p.Seconds > 0 {
				row.CPUPerSecond, row.ChildCPUPerSecond = p.CPUSeconds/p.Seconds, p.ChildCPUSeconds/p.Seconds
			}
			row.Programming = agreement(p.NetworkProgramming, lat, programmingSlack.Seconds())
			if i == 0 && c.Burst != nil {
				row.BurstChanges, row.BurstSyncs = c.Burst.Changes-c.Burst.Errors, c.Burst.Syncs
			}
			if c.Proxy == proxySluice {
				row.Goals = churnGoals(row, c)
			}
			out = append(out, row)
		}
	}
	return out
}

// churnGoals checks issue 14's churn goals on a sluice row.
func churnGoals(row ChurnRow, c ChurnResult) []Goal {
	flips := fmt.Sprintf("over %d flips, %d failed", row.Flips, row.FlipErrors)
	p50 := atMost("p50 <= 25ms", row.P50, churnP50Limit, seconds(row.P50)+" "+flips)
	p99 := atMost("p99 <= 50ms", row.P99, churnP99Limit, seconds(row.P99)+" "+flips)
	if row.Flips == 0 || row.FlipErrors > 0 {
		p50.Met, p99.Met = false, false
	}
	out := []Goal{p50, p99}
	// Changes arriving slower than one per minSyncPeriod may each get a sync of their own;
	// faster, they must share them.
	if d, err := time.ParseDuration(strings.Fields(row.MinSyncPeriod)[0]); err == nil && row.Rate*d.Seconds() >= 1 && row.Changes > 0 {
		out = append(out, atMost("changes collapse (syncs <= 1/2 of the changes)", float64(row.Syncs), float64(row.Changes)/2,
			fmt.Sprintf("%d syncs for %d changes", row.Syncs, row.Changes)))
	}
	if c.Burst != nil && row.BurstChanges > 0 {
		out = append(out, atMost("a burst collapses (syncs <= 1/10 of its changes)", float64(row.BurstSyncs), burstCollapse*float64(row.BurstChanges),
			fmt.Sprintf("%d syncs for %d changes", row.BurstSyncs, row.BurstChanges)))
	}
	return append(out, Goal{Name: "kubeproxy_network_programming_duration_seconds agrees within its buckets", Met: row.Programming.Agrees, Got: row.Programming.text()})
}

// agreement compares a phase's network-programming histogram with the measured flip
// latencies (sorted, seconds).
func agreement(h histogramBuckets, measured []float64, slack float64) ProgrammingAgreement {
	a := ProgrammingAgreement{Observations: int(math.Round(h.Count))}
	if h.Count <= 0 || len(measured) == 0 {
		a.Note = "no observations"
		return a
	}
	a.Mean = h.Sum / h.Count
	a.P50Bucket, a.P99Bucket = quantileBucket(h, 0.5), quantileBucket(h, 0.99)
	in := func(v float64, b [2]float64) bool { return v >= b[0]-slack && v <= b[1]+slack }
	a.Agrees = in(quantile(measured, 0.5), a.P50Bucket) && in(quantile(measured, 0.99), a.P99Bucket)
	if a.Observations != len(measured) {
		a.Note = fmt.Sprintf("%d observations for %d measured flips", a.Observations, len(measured))
	}
	return a
}

// quantileBucket is the bucket of h holding its q quantile (nearest rank).
func quantileBucket(h histogramBuckets, q float64) [2]float64 {
	rank := math.Ceil(q * h.Count)
	low := 0.0
	for _, b := range h.Buckets {
		if b.Count >= rank {
			return [2]float64{low, b.Le}
		}
		low = b.Le
	}
	return [2]float64{low, math.Inf(1)}
}

func (a ProgrammingAgreement) text() string {
	if a.Observations == 0 {
		return "no observations"
	}
	s := fmt.Sprintf("%d observations, mean %s, p50 in %s, p99 in %s", a.Observations, seconds(a.Mean), bucketText(a.P50Bucket), bucketText(a.P99Bucket))
	if a.Note != "" {
		s += "; " + a.Note
	}
	return s
}

func bucketText(b [2]float64) string {
	if math.IsInf(b[1], 1) {
		return fmt.Sprintf("(%gs, +Inf)", b[0])
	}
	if b[0] == 0 {
		return fmt.Sprintf("[0, %gs]", b[1])
	}
	return fmt.Sprintf("(%gs, %gs]", b[0], b[1])
}

// oneLine is the phase's result for the progress log.
func (p ChurnPhase) oneLine() string {
	var lat []float64
	for _, f := range p.Flips {
		lat = append(lat, f.Seconds)
	}
	slices.Sort(lat)
	return fmt.Sprintf("%d flips p50 %s p99 %s (%d failed); %d syncs for %d background changes (%.1f/s) in %.0fs; CPU %.2fs/s",
		len(p.Flips), seconds(orZero(quantile(lat, 0.5))), seconds(orZero(quantile(lat, 0.99))), len(p.FlipErrors),
		p.Syncs, p.BackgroundChanges, p.AchievedRate, p.Seconds, div(p.CPUSeconds, p.Seconds))
}

// oneLine is the churn run's result for the progress log.
func (c ChurnResult) oneLine() string {
	s := fmt.Sprintf("churn %s (minSyncPeriod %q): cold %s, took %.0fs", c.Run, c.MinSyncPeriod, seconds(c.ColdSeconds), c.WallSeconds)
	if c.Burst != nil {
		s += fmt.Sprintf("; burst of %d changes in %s: %d syncs", c.Burst.Changes, seconds(c.Burst.SendSeconds), c.Burst.Syncs)
	}
	if c.Error != "" {
		s += " ERROR: " + firstLine(c.Error)
	}
	return s
}

// printChurn writes the churn table and its goals.
func (r *Report) printChurn(w io.Writer) {
	if len(r.ChurnSummary) == 0 {
		return
	}
	fmt.Fprintf(w, "\nChurn at %d Services, nftables: %d probe Services x %d flips per rate, a connection from the node every %s; API update -> first new connection answered by the new pod",
		r.Options.ChurnSize, r.Options.ChurnProbes, r.Options.ChurnFlips, r.Options.ChurnProbeInterval)
	if r.Shipped != nil {
		fmt.Fprintf(w, "; shipped (%s): minSyncPeriod %s", r.Shipped.Path, r.Shipped.MinSyncPeriod)
	}
	fmt.Fprintln(w, ":")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tminSyncPeriod\trate\t(achieved)\tflips\tp50\tp99\tmax\tAPI write p50\tp99\tafter the write p50\tp99\tstale\tmetric mean\tmeasured mean\tmetric p50 bucket\tp99 bucket\tagrees\tsyncs\tchanges\tCPU s/s\t(helpers)\tburst syncs\t")
	for _, c := range r.ChurnSummary {
		burst := "-"
		if c.BurstChanges > 0 {
			burst = fmt.Sprintf("%d for %d", c.BurstSyncs, c.BurstChanges)
		}
		fmt.Fprintf(tw, "%s\t%s\t%g/s\t%.1f/s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%t\t%d\t%d\t%.3f\t%.3f\t%s\t\n",
			c.Run, c.MinSyncPeriod, c.Rate, c.AchievedRate, c.Flips, seconds(c.P50), seconds(c.P99), seconds(c.Max),
			seconds(c.WriteP50), seconds(c.WriteP99), seconds(c.AfterWriteP50), seconds(c.AfterWriteP99), c.Stale,
			seconds(c.Programming.Mean), seconds(c.Mean), bucketText(c.Programming.P50Bucket), bucketText(c.Programming.P99Bucket), c.Programming.Agrees,
			c.Syncs, c.Changes, c.CPUPerSecond, c.ChildCPUPerSecond, burst)
	}
	_ = tw.Flush() // a report on a terminal: nowhere better to say it failed
	for _, c := range r.ChurnSummary {
		for _, g := range c.Goals {
			fmt.Fprintf(w, "  %s at %g/s: %s\n", c.Run, c.Rate, g)
		}
	}
	fmt.Fprintln(w, "CPU under churn, sluice / upstream at each rate (same minSyncPeriod label on each side):")
	for _, s := range r.ChurnSummary {
		if s.Proxy != proxySluice {
			continue
		}
		var parts []string
		for _, u := range r.ChurnSummary {
			if u.Proxy == proxyUpstream && u.Rate == s.Rate && u.CPUPerSecond > 0 {
				parts = append(parts, fmt.Sprintf("%.2fx upstream %s", s.CPUPerSecond/u.CPUPerSecond, strings.TrimPrefix(u.Run, proxyUpstream+"@")))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "  %s at %g/s: %.3f s/s = %s\n", s.Run, s.Rate, s.CPUPerSecond, strings.Join(parts, ", "))
		}
	}
}
