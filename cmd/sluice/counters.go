package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// trafficCounterRow is one Service port and path's traffic counters, as the daemon
// exports them on /metrics (sluice_service_*_total).
type trafficCounterRow struct {
	Port, Protocol, Path string
	NewConnections       float64
	Packets, Bytes       float64
	HasPacketsBytes      bool
}

// The metrics `sluice explain NAMESPACE/NAME` shows.
const (
	metricNewConnections = "sluice_service_new_connections_total"
	metricPackets        = "sluice_service_packets_total"
	metricBytes          = "sluice_service_bytes_total"
)

// parseTrafficCounters picks one Service's traffic counters out of a /metrics page.
func parseTrafficCounters(body []byte, namespace, name string) ([]trafficCounterRow, error) {
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse the metrics: %w", err)
	}
	rows := map[[3]string]*trafficCounterRow{}
	for _, metric := range []string{metricNewConnections, metricPackets, metricBytes} {
		mf := families[metric]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != namespace || labels["service"] != name {
				continue
			}
			key := [3]string{labels["port"], labels["protocol"], labels["path"]}
			r := rows[key]
			if r == nil {
				r = &trafficCounterRow{Port: key[0], Protocol: key[1], Path: key[2]}
				rows[key] = r
			}
			v := m.GetCounter().GetValue()
			switch metric {
			case metricNewConnections:
				r.NewConnections = v
			case metricPackets:
				r.Packets, r.HasPacketsBytes = v, true
			case metricBytes:
				r.Bytes, r.HasPacketsBytes = v, true
			}
		}
	}
	out := make([]trafficCounterRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b trafficCounterRow) int {
		return strings.Compare(a.Port+"/"+a.Protocol+"/"+a.Path, b.Port+"/"+b.Protocol+"/"+b.Path)
	})
	return out, nil
}

// serviceCounted reports whether any port of the Service is counted in states.
func serviceCounted(states map[string]*model.StateView, namespace, name string) bool {
	for _, st := range states {
		for _, p := range st.Services {
			if p.Namespace == namespace && p.Name == name && p.TrafficCounters {
				return true
			}
		}
	}
	return false
}

// fetchTrafficCounters reads the daemon's /metrics for one Service's counters.
func fetchTrafficCounters(ctx context.Context, sf *serverFlags, namespace, name string) ([]trafficCounterRow, error) {
	body, err := sf.fetch(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	return parseTrafficCounters(body, namespace, name)
}

// writeTrafficCounters prints the counters section of `sluice explain NAMESPACE/NAME`.
func writeTrafficCounters(w io.Writer, counted bool, rows []trafficCounterRow, readErr error) error {
	fmt.Fprintln(w)
	switch {
	case !counted:
		_, err := fmt.Fprintln(w, `Traffic counters: off (annotate the Service `+model.AnnotationTrafficCounters+`: "true", or run sluice with --traffic-counters=all)`)
		return err
	case readErr != nil:
		_, err := fmt.Fprintf(w, "Traffic counters: on, not read: %v\n", readErr)
		return err
	case len(rows) == 0:
		_, err := fmt.Fprintln(w, "Traffic counters: on, nothing counted yet (the mode's rules may not be written yet)")
		return err
	}
	fmt.Fprintln(w, "Traffic counters (new connections per path since the rules were first written):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PORT\tPROTOCOL\tPATH\tNEW CONNECTIONS\tPACKETS\tBYTES")
	for _, r := range rows {
		pkts, bytes := "-", "-"
		if r.HasPacketsBytes {
			pkts, bytes = fmt.Sprintf("%.0f", r.Packets), fmt.Sprintf("%.0f", r.Bytes)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.0f\t%s\t%s\n", r.Port, r.Protocol, r.Path, r.NewConnections, pkts, bytes)
	}
	return tw.Flush()
}
