package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// The fake daemon's cluster: node-a (172.18.0.2, pods 10.244.1.0/24), Services in
// namespace demo: web (ClusterIP, endpoints on both nodes, one terminating) and
// web-local (LoadBalancer 192.0.2.11, externalTrafficPolicy Local).

var testNode = model.NodeInfo{
	Name: "node-a", Zone: "zone-a",
	IPs:      []netip.Addr{netip.MustParseAddr("172.18.0.2")},
	PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
}

func testObjects() ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	port := []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}
	web := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: port}}
	lbPort := append([]v1.ServicePort{}, port...)
	lbPort[0].NodePort = 30081
	local := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web-local"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.11", ClusterIPs: []string{"10.96.0.11"}, Ports: lbPort,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31081},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "192.0.2.11"}}}}}
	slice := func(svc, ip1, node1, ip2, node2 string, secondTerminating bool) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{ip1}, NodeName: ptr.To(node1)},
				{Addresses: []string{ip2}, NodeName: ptr.To(node2),
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(!secondTerminating), Serving: ptr.To(true), Terminating: ptr.To(secondTerminating)}},
			},
		}
	}
	return []*v1.Service{web, local}, []*discoveryv1.EndpointSlice{
		slice("web", "10.244.1.10", "node-a", "10.244.2.10", "node-b", true),
		slice("web-local", "10.244.1.11", "node-a", "10.244.2.11", "node-b", false),
	}
}

var syncTime = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// testReport is what the fake daemon serves; change alters the IPv4 status.
func testReport(change func(*syncloop.FamilyStatus)) app.StatusReport {
	services, slices := testObjects()
	states := model.Compute(services, slices, testNode, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, model.Options{Families: []model.IPFamily{model.IPv4}})
	st := syncloop.FamilyStatus{Family: "IPv4", Mode: "nftables", LastSync: syncTime, LastSuccess: syncTime, LastFullSync: syncTime,
		LastSyncDuration: 0.004, Failed: map[string]string{}, Syncs: 7}
	if change != nil {
		change(&st)
	}
	return app.StatusReport{Schema: app.StatusReportSchema, Node: "node-a", Mode: "nftables", Backend: "nftables",
		Families: []app.FamilyReport{{Status: st, State: states[model.IPv4].View()}}}
}

// fakeDaemon serves report at the state endpoint and a configuration at /configz.
func fakeDaemon(t *testing.T, report app.StatusReport) *httptest.Server {
	t.Helper()
	cfg := config.NewDefaultConfiguration()
	cfg.Mode = "nftables"
	cfg.ClusterCIDR = "10.244.0.0/16"
	config.ApplyPlatformDefaults(cfg)
	mux := http.NewServeMux()
	mux.HandleFunc(app.StatePath, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(report) })
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": cfg})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// closedAddress returns an address nothing listens on.
func closedAddress(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func TestStatus(t *testing.T) {
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)

	tests := []struct {
		name     string
		server   func(t *testing.T) string
		args     []string
		wantCode int
		wantOut  []string
		wantErr  string
		notOut   []string
	}{
		{
			name:     "every Service programmed",
			server:   func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			wantCode: 0,
			wantOut: []string{
				"sluice on node node-a: mode nftables, read from http",
				"IPv4: last sync 2026-03-04T", "ago), full, took 4ms; 7 syncs",
				"  2 Service ports: 2 programmed, 0 failed, 0 pending\n",
				"(only failed and pending ports are listed; --all lists all 2,",
			},
			notOut: []string{"SERVICE", "demo/web"},
		},
		{
			name:   "--all lists every port",
			server: func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:   []string{"--all"},
			wantOut: []string{
				"SERVICE         PORT         TYPE          STATUS      CLUSTER  LOCAL",
				// web: 10.244.1.10 ready, 10.244.2.10 terminating: the Cluster list holds the ready one only.
				"demo/web        http:80/TCP  ClusterIP     programmed  1/0      -",
				"demo/web-local  http:80/TCP  LoadBalancer  programmed  2/0      1/0",
			},
			notOut: []string{"only failed and pending"},
		},
		{
			name: "a failed Service",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) {
					s.Failed["demo/web-local"] = "nftables: adding element: invalid argument"
				})).URL
			},
			wantCode: exitServicesFailed,
			wantOut: []string{"2 Service ports: 1 programmed, 1 failed, 0 pending", "demo/web-local  http:80/TCP  LoadBalancer  FAILED",
				"demo/web-local failed: nftables: adding element: invalid argument"},
			notOut: []string{"demo/web  "},
		},
		{
			name: "a failed sync",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) {
					s.LastError = "netlink: operation not permitted"
					s.LastSync = syncTime.Add(time.Minute)
				})).URL
			},
			wantCode: exitServicesFailed,
			wantOut:  []string{"ago), failed, took 4ms", "last success 2026-03-04T", "last sync FAILED: netlink: operation not permitted", "the rules of the last successful sync stay"},
		},
		{
			name: "a partial sync",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) {
					s.LastSync, s.LastSuccess = syncTime.Add(time.Minute), syncTime.Add(time.Minute)
				})).URL
			},
			wantOut: []string{"ago), partial, took 4ms; 7 syncs\n  last full sync 2026-03-04T"},
		},
		{
			name: "no sync yet",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) { *s = syncloop.FamilyStatus{} })).URL
			},
			wantOut: []string{"IPv4: no sync yet", "2 Service ports: 0 programmed, 0 failed, 2 pending", "demo/web        http:80/TCP  ClusterIP     pending"},
		},
		{
			name:    "arguments list every port of some Services",
			server:  func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:    []string{"demo/web"},
			wantOut: []string{"1 Service port: 1 programmed", "demo/web  http:80/TCP  ClusterIP  programmed"},
			notOut:  []string{"demo/web-local", "only failed"},
		},
		{
			name:    "--state lists the ports in a state",
			server:  func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:    []string{"--state", "programmed"},
			wantOut: []string{"demo/web        http:80/TCP", "demo/web-local  http:80/TCP"},
		},
		{
			name:     "a bad state",
			server:   func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:     []string{"--state", "broken"},
			wantCode: exitFailure,
			wantErr:  `--state "broken": want one of programmed, failed, pending, no-endpoints, no-local-endpoints`,
		},
		{
			name:    "json prints the report as served",
			server:  func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:    []string{"-o", "json"},
			wantOut: []string{`"schema":"sluice.status/v1"`, `"clusterEndpoints":[{"ip":"10.244.1.10"`},
		},
		{
			name:     "an unreachable daemon",
			server:   closedAddress,
			wantCode: exitUnreachable,
			wantErr:  "cannot reach sluice at http://127.0.0.1:",
		},
		{
			name:     "something that is not sluice",
			server:   func(*testing.T) string { return notFound.URL },
			wantCode: exitUnreachable,
			wantErr:  "404 Not Found (is this sluice? kube-proxy has no state endpoint)",
		},
		{
			name:     "a bad output format",
			server:   func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:     []string{"-o", "yaml"},
			wantCode: exitFailure,
			wantErr:  `--output "yaml": want text, wide or json`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := tt.server(t)
			code, out, errOut := sluice(t, append([]string{"status", "--server", strings.TrimPrefix(server, "http://")}, tt.args...)...)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tt.wantCode, errOut)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tt.notOut {
				if strings.Contains(out, w) {
					t.Errorf("stdout has %q:\n%s", w, out)
				}
			}
			if !strings.Contains(errOut, tt.wantErr) || (tt.wantErr == "" && errOut != "") {
				t.Errorf("stderr %q, want it to contain %q", errOut, tt.wantErr)
			}
		})
	}
}

// Golden reports of `sluice status`: a node with a conntrack table 80 % full, and per
// family Services in every state and condition, one with the longest names Kubernetes
// allows. Times are UTC; the report was read 90 s after the last sync.

// portView is a Service port of the golden and scale reports: ClusterIP, TCP port 80,
// endpoints ready under the Cluster policy; change adjusts it.
func portView(ns, name string, change func(*model.ServicePortView)) model.ServicePortView {
	sp := model.ServicePortView{Namespace: ns, Name: name, PortName: "http", Protocol: "TCP", Type: "ClusterIP",
		ClusterIP: "10.96.0.1", Port: 80, HasAnyEndpoints: true,
		ClusterEndpoints: []model.EndpointView{{IP: "10.244.1.10", Port: 8080, Ready: true, Serving: true}}}
	if change != nil {
		change(&sp)
	}
	return sp
}

func noEndpoints(sp *model.ServicePortView) {
	sp.HasAnyEndpoints, sp.ClusterEndpoints = false, []model.EndpointView{}
}

func localWithoutLocalEndpoints(sp *model.ServicePortView) {
	sp.Type, sp.NodePort, sp.ExternalTrafficPolicy = "LoadBalancer", 30080, "Local"
	sp.LocalEndpoints = []model.EndpointView{}
}

// longName is a namespace or name of the longest length allowed (63).
func longName(prefix string) string { return prefix + strings.Repeat("x", 63-len(prefix)) }

func goldenReport() *app.StatusReport {
	limit := uint64(262144)
	services := []model.ServicePortView{
		portView("default", "kubernetes", func(sp *model.ServicePortView) { sp.PortName = "https"; sp.Port = 443 }),
		portView("demo", "cache", func(sp *model.ServicePortView) { sp.Protocol, sp.PortName, sp.Port = "UDP", "", 11211 }),
		portView("demo", "empty", noEndpoints),
		portView("demo", "ingress", localWithoutLocalEndpoints),
		portView("demo", "web", nil),
		portView("demo", "web", func(sp *model.ServicePortView) { sp.PortName, sp.Port = "metrics", 9090 }),
		portView("demo", "worker", nil),
		portView(longName("team-"), longName("service-with-a-long-name-"), nil),
		portView("kube-system", "kube-dns", func(sp *model.ServicePortView) { sp.Protocol, sp.PortName, sp.Port = "UDP", "dns", 53 }),
	}
	failed := map[string]string{
		"demo/web": "nftables: applying the ruleset: netlink receive: invalid argument (the kernel refused the element " +
			"10.96.0.1 . tcp . 80 of map service-ips: the map's key type does not match)",
		longName("team-") + "/" + longName("service-with-a-long-name-"): "nftables: chain too long",
	}
	v4 := app.FamilyReport{
		Status: syncloop.FamilyStatus{Family: "IPv4", Mode: "nftables", LastSync: syncTime, LastSuccess: syncTime,
			LastFullSync: syncTime.Add(-time.Hour), LastSyncDuration: 0.0123, Failed: failed, Syncs: 1234},
		State:     model.StateView{Family: "IPv4", Services: services},
		Unapplied: []string{"demo/web", "demo/worker"},
	}
	v6 := app.FamilyReport{
		Status: syncloop.FamilyStatus{Family: "IPv6", Mode: "nftables"},
		State:  model.StateView{Family: "IPv6", Services: []model.ServicePortView{portView("default", "kubernetes", nil)}},
	}
	return &app.StatusReport{Schema: app.StatusReportSchema, Node: "node-a", Mode: "nftables", Backend: "nftables",
		Families: []app.FamilyReport{v4, v6},
		Conntrack: &conntrack.Status{Stats: conntrack.Stats{Entries: 209716, Limit: &limit, CPUs: 4,
			Counters: map[string]uint64{"drop": 12, "early_drop": 3, "insert_failed": 1, "chain_toolong": 0, "found": 5, "invalid": 77}}}}
}

func TestStatusGolden(t *testing.T) {
	now := syncTime.Add(90 * time.Second)
	for _, tt := range []struct {
		name string
		opts statusOptions
	}{
		{name: "default"},
		{name: "all", opts: statusOptions{all: true}},
		{name: "all-wide", opts: statusOptions{all: true, wide: true}},
		{name: "state", opts: statusOptions{states: []string{condNoEndpoints, condNoLocalEndpoints}}},
		{name: "service", opts: statusOptions{filters: []string{"demo/web", "kube-system"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeStatus(&b, goldenReport(), "http://127.0.0.1:10249", tt.opts, now); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "status-"+tt.name+".golden")
			if *updateGolden {
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), b.String()); diff != "" {
				t.Errorf("%s (-want +got; -update rewrites it):\n%s", path, diff)
			}
			checkWidth(t, b.String(), tt.opts.wide)
		})
	}
}

// maxStatusWidth is the widest line `sluice status` may print (names not shortened aside).
const maxStatusWidth = 120

func checkWidth(t *testing.T, out string, wide bool) {
	t.Helper()
	if wide {
		return
	}
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > maxStatusWidth {
			t.Errorf("line %d is %d characters wide (max %d): %q", i+1, n, maxStatusWidth, line)
		}
	}
}

// scaleReport is a node with n Service ports of 128-character names, of which failed
// failed, pending are pending and noEndpoints have no endpoints.
func scaleReport(n, failed, pending, noEndpointsN int) *app.StatusReport {
	ports := make([]model.ServicePortView, 0, n)
	st := syncloop.FamilyStatus{Family: "IPv4", Mode: "nftables", LastSync: syncTime, LastSuccess: syncTime, LastFullSync: syncTime,
		LastSyncDuration: 1.5, Failed: map[string]string{}, Syncs: 42}
	var unapplied []string
	for i := 0; i < n; i++ {
		ns, name := longName(fmt.Sprintf("ns-%05d-", i/10)), longName(fmt.Sprintf("svc-%05d-", i))
		var change func(*model.ServicePortView)
		switch key := ns + "/" + name; {
		case i < failed:
			st.Failed[key] = "nftables: adding element: invalid argument"
		case i < failed+pending:
			unapplied = append(unapplied, key)
		case i < failed+pending+noEndpointsN:
			change = noEndpoints
		}
		ports = append(ports, portView(ns, name, change))
	}
	return &app.StatusReport{Schema: app.StatusReportSchema, Node: "node-a", Mode: "nftables", Backend: "nftables",
		Families: []app.FamilyReport{{Status: st, State: model.StateView{Family: "IPv4", Services: ports}, Unapplied: unapplied}}}
}

func TestStatusAt10000Services(t *testing.T) {
	const ports = 10020
	now := syncTime.Add(time.Minute)
	render := func(t *testing.T, r *app.StatusReport, opts statusOptions) string {
		t.Helper()
		var b strings.Builder
		if err := writeStatus(&b, r, "http://127.0.0.1:10249", opts, now); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	lines := func(s string) int { return strings.Count(s, "\n") }
	report := scaleReport(ports, 3, 5, 40)

	t.Run("default: a screenful", func(t *testing.T) {
		out := render(t, report, statusOptions{})
		if n := lines(out); n > 30 {
			t.Errorf("%d lines, want at most 30:\n%s", n, out)
		}
		checkWidth(t, out, false)
		for _, want := range []string{"10020 Service ports: 10012 programmed, 3 failed, 5 pending", "40 without endpoints (clients refused)", "FAILED", "pending"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("default with every port pending: capped", func(t *testing.T) {
		r := *report
		r.Families = []app.FamilyReport{{Status: syncloop.FamilyStatus{Family: "IPv4"}, State: report.Families[0].State}}
		out := render(t, &r, statusOptions{})
		if n := lines(out); n > 30 {
			t.Errorf("%d lines, want at most 30:\n%s", n, out)
		}
		checkWidth(t, out, false)
		if want := fmt.Sprintf("... and %d more failed or pending ports", ports-maxListedByDefault); !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	})
	t.Run("--all: every port, none wider", func(t *testing.T) {
		out := render(t, report, statusOptions{all: true})
		if n := lines(out); n < ports || n > ports+20 {
			t.Errorf("%d lines, want every port's (%d) and a few more", n, ports)
		}
		checkWidth(t, out, false)
	})
	t.Run("-o wide: whole names", func(t *testing.T) {
		out := render(t, report, statusOptions{wide: true})
		if full := longName("ns-00000-") + "/" + longName("svc-00000-"); !strings.Contains(out, full) {
			t.Errorf("-o wide does not show %s", full)
		}
	})
}

func TestShortenMiddle(t *testing.T) {
	for _, tt := range []struct {
		in   string
		max  int
		want string
	}{
		{"demo/web", 40, "demo/web"},
		{"abcdefghij", 10, "abcdefghij"},
		{"abcdefghijk", 10, "abcd…ghijk"},
		{"abcdefghijk", 9, "abcd…hijk"},
		{"ns/ünïcödé-name", 8, "ns/…name"},
	} {
		if got := shortenMiddle(tt.in, tt.max); got != tt.want || utf8.RuneCountInString(got) > tt.max {
			t.Errorf("shortenMiddle(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
	}
}

func TestWriteConntrack(t *testing.T) {
	limit, zero := uint64(1000), uint64(0)
	for _, tt := range []struct {
		name string
		ct   conntrack.Status
		want string
	}{
		{"healthy", conntrack.Status{Stats: conntrack.Stats{Entries: 5, Limit: &limit, Counters: map[string]uint64{"drop": 0, "early_drop": 0, "insert_failed": 0}}},
			"conntrack: 5 entries of 1000 (0.5%)\n  kernel counters since the namespace was created: drop 0, early_drop 0, insert_failed 0\n"},
		{"nearly full", conntrack.Status{Stats: conntrack.Stats{Entries: 800, Limit: &limit}},
			"conntrack: 800 entries of 1000 (80.0%), NEARLY FULL: new connections are dropped at the limit\n"},
		{"no limit", conntrack.Status{Stats: conntrack.Stats{Entries: 5, Limit: &zero}}, "conntrack: 5 entries (no limit)\n"},
		{"limit unknown", conntrack.Status{Stats: conntrack.Stats{Entries: 5}}, "conntrack: 5 entries (limit unknown)\n"},
		{"unreadable", conntrack.Status{Error: "reading the conntrack table's size: permission denied"},
			"conntrack: cannot be read: reading the conntrack table's size: permission denied\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeConntrack(&b, &tt.ct)
			if b.String() != tt.want {
				t.Errorf("got\n%q\nwant\n%q", b.String(), tt.want)
			}
		})
	}
}
