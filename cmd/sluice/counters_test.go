package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"
)

const testMetrics = `# HELP sluice_service_new_connections_total New connections.
# TYPE sluice_service_new_connections_total counter
sluice_service_new_connections_total{namespace="demo",path="cluster",port="http",protocol="TCP",service="web"} 12
sluice_service_new_connections_total{namespace="demo",path="cluster",port="http",protocol="TCP",service="web-local"} 99
sluice_service_new_connections_total{namespace="other",path="cluster",port="http",protocol="TCP",service="web"} 98
# HELP sluice_service_packets_total Packets.
# TYPE sluice_service_packets_total counter
sluice_service_packets_total{namespace="demo",path="cluster",port="http",protocol="TCP",service="web"} 48
# HELP sluice_service_bytes_total Bytes.
# TYPE sluice_service_bytes_total counter
sluice_service_bytes_total{namespace="demo",path="cluster",port="http",protocol="TCP",service="web"} 14592
`

// countingDaemon is fakeDaemon with demo/web counted and its counters on /metrics.
func countingDaemon(t *testing.T) string {
	report := testReport(nil)
	for i, p := range report.Families[0].State.Services {
		if p.Namespace == "demo" && p.Name == "web" {
			report.Families[0].State.Services[i].TrafficCounters = true
		}
	}
	backend, _ := url.Parse(fakeDaemon(t, report).URL)
	mux := http.NewServeMux()
	mux.Handle("/", httputil.NewSingleHostReverseProxy(backend))
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(testMetrics)) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestExplainServiceShowsTrafficCounters(t *testing.T) {
	tests := []struct {
		name    string
		server  func(t *testing.T) string
		service string
		want    []string
		notWant []string
	}{
		{name: "counted Service: its own counters only", server: countingDaemon, service: "demo/web",
			want:    []string{"Traffic counters (per path", "http  TCP       cluster  12               48       14592"},
			notWant: []string{"99", "98"}},
		{name: "Service not counted: how to turn them on", server: countingDaemon, service: "demo/web-local",
			want: []string{`Traffic counters: off (annotate the Service sluice.dev/traffic-counters: "true"`}},
		{name: "daemon without counters", server: func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL }, service: "demo/web",
			want: []string{"Traffic counters: off"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			cmd := newExplainCommand(&out)
			cmd.SetArgs([]string{"--server", tc.server(t), tc.service})
			cmd.SetContext(context.Background())
			if err := cmd.Execute(); err != nil {
				t.Fatalf("explain: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestExplainServiceJSONHasTrafficCounters: -o json carries the same counters, in each
// family's element, and says when a Service is not counted.
func TestExplainServiceJSONHasTrafficCounters(t *testing.T) {
	tests := []struct {
		service string
		want    trafficCounters
	}{
		{service: "demo/web", want: trafficCounters{Counted: true, Rows: []trafficCounterRow{
			{Port: "http", Protocol: "TCP", Path: "cluster", NewConnections: 12, Packets: ptr.To(48.0), Bytes: ptr.To(14592.0)}}}},
		{service: "demo/web-local", want: trafficCounters{Counted: false}},
	}
	for _, tc := range tests {
		t.Run(tc.service, func(t *testing.T) {
			var out bytes.Buffer
			cmd := newExplainCommand(&out)
			cmd.SetArgs([]string{"--server", countingDaemon(t), "-o", "json", tc.service})
			cmd.SetContext(context.Background())
			if err := cmd.Execute(); err != nil {
				t.Fatalf("explain: %v", err)
			}
			var got []struct {
				Namespace       string          `json:"namespace"`
				TrafficCounters trafficCounters `json:"trafficCounters"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out.String())
			}
			if len(got) == 0 {
				t.Fatalf("no Service in:\n%s", out.String())
			}
			for _, g := range got {
				if diff := cmp.Diff(tc.want, g.TrafficCounters); diff != "" || g.Namespace != "demo" {
					t.Errorf("namespace %q, trafficCounters (-want +got):\n%s", g.Namespace, diff)
				}
			}
		})
	}
}
