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

	"github.com/sluiceproxy/sluice/pkg/explain"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// trafficCounterRow is one Service port and path's traffic counters, as the daemon
// exports them on /metrics (sluice_service_*_total), both families added.
type trafficCounterRow struct {
	Port           string  `json:"port"`
	Protocol       string  `json:"protocol"`
	Path           string  `json:"path"`
	NewConnections float64 `json:"newConnections"`
	// Packets and Bytes are absent where the mode does not count them.
	Packets *float64 `json:"packets,omitempty"`
	Bytes   *float64 `json:"bytes,omitempty"`
}

// trafficCounters is the counters part of `sluice explain NAMESPACE/NAME`, text and JSON.
type trafficCounters struct {
	// Counted: some port of the Service is counted (annotation or --traffic-counters).
	Counted bool                `json:"counted"`
	Rows    []trafficCounterRow `json:"ports,omitempty"`
	// Error is why the daemon's counters could not be read.
	Error string `json:"error,omitempty"`
}

// serviceWithCounters is one family's explanation of a Service in `-o json`, with the
// Service's traffic counters (the same in each family's element: the daemon adds the
// families).
type serviceWithCounters struct {
	explain.ServiceExplanation
	TrafficCounters trafficCounters `json:"trafficCounters"`
}

// liveTrafficCounters reads the daemon's counters of one Service, when it counts them.
func liveTrafficCounters(ctx context.Context, sf *serverFlags, states map[string]*model.StateView, namespace, name string) trafficCounters {
	tc := trafficCounters{Counted: serviceCounted(states, namespace, name)}
	if !tc.Counted {
		return tc
	}
	rows, err := fetchTrafficCounters(ctx, sf, namespace, name)
	if err != nil {
		tc.Error = err.Error()
	}
	tc.Rows = rows
	return tc
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
				r.Packets = &v
			case metricBytes:
				r.Bytes = &v
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
func writeTrafficCounters(w io.Writer, tc trafficCounters) error {
	fmt.Fprintln(w)
	switch {
	case !tc.Counted:
		_, err := fmt.Fprintln(w, `Traffic counters: off (annotate the Service `+model.AnnotationTrafficCounters+`: "true", or run sluice with --traffic-counters=all)`)
		return err
	case tc.Error != "":
		_, err := fmt.Fprintf(w, "Traffic counters: on, not read: %s\n", tc.Error)
		return err
	case len(tc.Rows) == 0:
		_, err := fmt.Fprintln(w, "Traffic counters: on, nothing counted yet (the mode's rules may not be written yet)")
		return err
	}
	fmt.Fprintln(w, "Traffic counters (per path since the rules were first written; packets and bytes sent by clients):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PORT\tPROTOCOL\tPATH\tNEW CONNECTIONS\tPACKETS\tBYTES")
	for _, r := range tc.Rows {
		pkts, bytes := "-", "-"
		if r.Packets != nil {
			pkts = fmt.Sprintf("%.0f", *r.Packets)
		}
		if r.Bytes != nil {
			bytes = fmt.Sprintf("%.0f", *r.Bytes)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.0f\t%s\t%s\n", r.Port, r.Protocol, r.Path, r.NewConnections, pkts, bytes)
	}
	return tw.Flush()
}
