package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/config"
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
	ln.Close()
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
				"SERVICE         PORT         TYPE          STATUS      CLUSTER(ready/term)  LOCAL(ready/term)",
				// web: 10.244.1.10 ready, 10.244.2.10 terminating: the Cluster list holds the ready one only.
				"demo/web        http:80/TCP  ClusterIP     programmed  1/0                  -",
				"demo/web-local  http:80/TCP  LoadBalancer  programmed  2/0                  1/0",
			},
		},
		{
			name: "a failed Service",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) {
					s.Failed["demo/web-local"] = "nftables: adding element: invalid argument"
				})).URL
			},
			wantCode: exitServicesFailed,
			wantOut:  []string{"demo/web-local  http:80/TCP  LoadBalancer  FAILED", "demo/web-local failed: nftables: adding element: invalid argument", "demo/web        http:80/TCP  ClusterIP     programmed"},
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
			wantOut:  []string{"ago), failed, took 4ms", "last success 2026-03-04T", "last sync FAILED: netlink: operation not permitted", "unknown (last sync failed)"},
		},
		{
			name: "a partial sync",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) {
					s.LastSync, s.LastSuccess = syncTime.Add(time.Minute), syncTime.Add(time.Minute)
				})).URL
			},
			wantOut: []string{"ago), partial, took 4ms; 7 syncs, last full sync 2026-03-04T"},
		},
		{
			name: "no sync yet",
			server: func(t *testing.T) string {
				return fakeDaemon(t, testReport(func(s *syncloop.FamilyStatus) { *s = syncloop.FamilyStatus{} })).URL
			},
			wantOut: []string{"IPv4: no sync yet", "pending (no sync yet)"},
		},
		{
			name:    "arguments keep some Services",
			server:  func(t *testing.T) string { return fakeDaemon(t, testReport(nil)).URL },
			args:    []string{"demo/web"},
			wantOut: []string{"demo/web "},
			notOut:  []string{"demo/web-local"},
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
			wantErr:  `--output "yaml": want text or json`,
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
