package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// printMarkdown writes the tables docs/benchmarks.md holds (-report results.json -markdown),
// so that the page is the run's output, not a transcription of it.
func (r *Report) printMarkdown(w io.Writer) {
	// A run still going (or stopped before its end) has written its results so far but
	// neither its end time nor its last load average.
	span, loadEnd := "unfinished: the tables hold the runs done when the results were last written", "not recorded (unfinished)"
	if !r.Finished.IsZero() {
		span = fmt.Sprintf("%s (%s wall)", r.Finished.UTC().Format("15:04"), r.Finished.Sub(r.Started).Round(time.Minute))
		loadEnd = fmt.Sprintf("%.1f / %.1f / %.1f", r.LoadAvgEnd[0], r.LoadAvgEnd[1], r.LoadAvgEnd[2])
	}
	fmt.Fprintf(w, "Run of %s UTC, %s; sluice `%s`, upstream `%s`; %d CPUs, %.0f GiB, kernel %s, %s.\n",
		r.Started.UTC().Format("2006-01-02 15:04"), span,
		r.Sluice.Version, r.KubeProxy.Version, r.Machine.CPUs, float64(r.Machine.MemoryBytes)/(1<<30), r.Machine.Kernel, r.Machine.GoVersion)
	fmt.Fprintf(w, "Load average (1/5/15 min) %.1f / %.1f / %.1f at the start, %s at the end. %d endpoints per Service, syncPeriod %s for both proxies, runs kept going for %d periodic resyncs; seed %d.\n",
		r.LoadAvgStart[0], r.LoadAvgStart[1], r.LoadAvgStart[2], loadEnd,
		r.Options.Endpoints, r.Options.SyncPeriod, r.Options.Resyncs, r.Options.Seed)

	var goals [][]string
	for _, q := range r.Ratios {
		for _, g := range q.Goals {
			goals = append(goals, goalRow(fmt.Sprintf("%s, %s", count(q.Services), q.Mode), g))
		}
	}
	for _, c := range r.ChurnSummary {
		for _, g := range c.Goals {
			goals = append(goals, goalRow(fmt.Sprintf("churn %s, %g/s", c.Run, c.Rate), g))
		}
	}
	if len(goals) > 0 {
		fmt.Fprintln(w, "\n#### Goals")
		mdTable(w, []string{"where", "goal", "measured", "of the limit", "verdict"}, goals)
	}

	if len(r.Datasets) > 0 || len(r.APILists) > 0 {
		fmt.Fprintf(w, "\n#### Dataset and the API side of a cold start\n\nWritten through the API with %d concurrent requests (control plane ready in %s); listed by a bare client as `system:kube-proxy`, protobuf, Services then EndpointSlices (medians of %d).\n\n",
			r.Options.CreateWorkers, seconds(r.ControlPlaneStartSeconds), firstRepeat(r.APILists))
		var rows [][]string
		for _, d := range r.Datasets {
			row := []string{count(d.Services), fmt.Sprintf("%d in %s (%.0f/s), kube-apiserver CPU %s", d.Objects, seconds(d.WriteSeconds), div(float64(d.Objects), d.WriteSeconds), seconds(d.APIServerCPUSeconds)), "", "", ""}
			for _, a := range r.APILists {
				if a.Services == d.Services {
					row[2] = fmt.Sprintf("%s (%.1f MB)", seconds(a.ListSeconds), float64(a.ListBytes)/1e6)
					row[3], row[4] = seconds(a.DecodeSeconds), seconds(a.WatchListSeconds)
				}
			}
			rows = append(rows, row)
		}
		mdTable(w, []string{"Services", "objects written", "LIST from the watch cache", "decoding it", "watch-list, decoded"}, rows)
	}

	for _, mode := range []string{modeNFTables, modeIPTablesLegacy, modeIPTablesNFT} {
		var rows [][]string
		for _, s := range r.Summary {
			if s.Mode != mode {
				continue
			}
			note := ""
			if s.TimedOut > 0 {
				note = fmt.Sprintf(" (%d/%d timed out)", s.TimedOut, s.Runs)
			} else if s.Failed > 0 {
				note = fmt.Sprintf(" (%d/%d failed)", s.Failed, s.Runs)
			}
			rows = append(rows, []string{count(s.Services), s.Proxy + note, seconds(s.ColdSeconds), seconds(s.InformersSyncedSeconds), seconds(s.OwnColdSeconds),
				cpuText(s.ColdCPUSeconds, s.ColdChildCPUSeconds), seconds(s.ChangeVisibleSeconds), seconds(s.ChangeSyncSeconds), seconds(s.BulkChangeSyncSeconds),
				seconds(s.FloorSeconds), mib(s.ReadyRSSBytes), fmt.Sprintf("%s (%d)", mib(s.PeakRSSBytes), s.PeriodicFullSyncs), mib(s.EndRSSBytes), mib(s.HelperPeakRSSBytes),
				fmt.Sprintf("%s / %s", micros(s.FirstPacketP50Micros), micros(s.FirstPacketP99Micros)), seconds(s.WallSeconds)})
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n#### %s mode\n\n", mode)
		mdTable(w, []string{"Services", "proxy", "cold", "informers synced", "own part", "cold CPU (helpers)", "change seen", "change sync", "multi-ep sync",
			"restore floor", "RSS after the cold start", "peak RSS (periodic resyncs)", "RSS at the end", "helper RSS", "first packet p50 / p99", "run took"}, rows)
		var ratios [][]string
		for _, q := range r.Ratios {
			if q.Mode == mode && q.Cold > 0 {
				ratios = append(ratios, []string{count(q.Services), ratioText(q.Cold), ratioText(q.OwnCold), ratioText(q.ColdCPU), ratioText(q.ChangeVisible),
					ratioText(q.ChangeSync), ratioText(q.BulkChangeSync), ratioText(q.ReadyRSS), ratioText(q.PeakRSS)})
			}
		}
		if len(ratios) > 0 {
			fmt.Fprintln(w, "\nsluice / upstream:")
			fmt.Fprintln(w)
			mdTable(w, []string{"Services", "cold", "own part", "cold CPU", "change seen", "change sync", "multi-ep sync", "RSS after the cold start", "peak RSS"}, ratios)
		}
	}

	if len(r.ChurnSummary) > 0 {
		fmt.Fprintf(w, "\n#### Churn at %s Services (nftables)\n\n%d probe Services × %d flips per rate, one at a time; a connection from the node every %s; seed %d.",
			count(r.Options.ChurnSize), r.Options.ChurnProbes, r.Options.ChurnFlips, r.Options.ChurnProbeInterval, r.Options.Seed)
		if r.Shipped != nil {
			fmt.Fprintf(w, " \"shipped\" is `deploy/base/config.conf`: minSyncPeriod %s.", r.Shipped.MinSyncPeriod)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w)
		var rows [][]string
		for _, c := range r.ChurnSummary {
			burst := ""
			if c.BurstChanges > 0 {
				burst = fmt.Sprintf("%d syncs for %d", c.BurstSyncs, c.BurstChanges)
			}
			rows = append(rows, []string{c.Run, c.MinSyncPeriod, fmt.Sprintf("%g/s (%.1f)", c.Rate, c.AchievedRate), fmt.Sprintf("%d", c.Flips),
				seconds(c.P50), seconds(c.P99), seconds(c.Max), fmt.Sprintf("%s / %s", seconds(c.WriteP50), seconds(c.WriteP99)),
				fmt.Sprintf("%s / %s", seconds(c.AfterWriteP50), seconds(c.AfterWriteP99)), fmt.Sprintf("%s / %s", seconds(c.Programming.Mean), seconds(c.Mean)),
				fmt.Sprintf("%s, %s", bucketText(c.Programming.P50Bucket), bucketText(c.Programming.P99Bucket)), yesNo(c.Programming.Agrees),
				fmt.Sprintf("%d / %d", c.Syncs, c.Changes), fmt.Sprintf("%.3f (%.3f)", c.CPUPerSecond, c.ChildCPUPerSecond), burst})
		}
		mdTable(w, []string{"run", "minSyncPeriod", "rate (achieved)", "flips", "p50", "p99", "max", "API write p50 / p99", "after the write p50 / p99", "metric mean / measured mean",
			"metric p50, p99 buckets", "agrees", "syncs / changes", "CPU s/s (helpers)", "burst"}, rows)
	}

	fmt.Fprintln(w, "\n#### How long each part took")
	fmt.Fprintln(w)
	var parts [][]string
	parts = append(parts, []string{"control plane start", seconds(r.ControlPlaneStartSeconds)})
	for _, d := range r.Datasets {
		parts = append(parts, []string{fmt.Sprintf("writing the dataset up to %s Services", count(d.Services)), seconds(d.WriteSeconds)})
	}
	for _, run := range r.Runs {
		parts = append(parts, []string{fmt.Sprintf("%s/%s at %s", run.Proxy, run.Mode, count(run.Services)), seconds(run.WallSeconds)})
	}
	for _, c := range r.Churn {
		parts = append(parts, []string{fmt.Sprintf("churn %s at %s", c.Run, count(c.Services)), seconds(c.WallSeconds)})
	}
	mdTable(w, []string{"part", "took"}, parts)
}

func goalRow(where string, g Goal) []string {
	verdict := "met"
	if !g.Met {
		verdict = "**missed**"
	}
	name, got := g.Name, g.Got
	of := "-"
	if g.OfLimit > 0 {
		of = fmt.Sprintf("%.2f", g.OfLimit)
	}
	return []string{where, name, got, of, verdict}
}

func firstRepeat(a []APIListResult) int {
	if len(a) == 0 {
		return 0
	}
	return a[0].Repeat
}

func cpuText(total, children float64) string {
	if children > 0 {
		return fmt.Sprintf("%s (%s)", seconds(total), seconds(children))
	}
	return seconds(total)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// mdTable writes a Markdown table.
func mdTable(w io.Writer, header []string, rows [][]string) {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, r := range rows {
		for i := range r {
			r[i] = strings.ReplaceAll(r[i], "|", "\\|")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}
