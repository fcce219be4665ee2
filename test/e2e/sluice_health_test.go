//go:build e2e

package e2e

// sluice's servers end to end: the metrics server (/metrics, /healthz, /proxyMode,
// /configz), the proxy health server (/healthz, /livez), per-Service health checks on
// healthCheckNodePort, and the Starting Event. One control plane and one sluice; the
// subtests run in order because the node taint changes what /healthz answers.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/health"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

func TestSluiceServersAndMetrics(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	c := cp.AdminClient()
	createNode(t, c, nodeName, nodeIPv4)
	started := time.Now()
	p := startSluice(t, cp, nodeName, "")
	p.waitFor(t, "the first sync", 30*time.Second, func(r *app.StatusReport) bool {
		f := familyReport(r, model.IPv4)
		return f != nil && !f.Status.LastSuccess.IsZero()
	})
	metricsURL := "http://" + p.metricsAddr
	healthURL := "http://" + p.healthzAddr

	t.Run("Starting Event on the Node", func(t *testing.T) {
		ev := waitForAPIEvent(t, c, metav1.NamespaceAll, "Starting", 30*time.Second, func(ev *eventsv1.Event) bool {
			return ev.Reason == events.ReasonStarting && ev.Regarding.Kind == "Node" && ev.Regarding.Name == nodeName
		})
		if ev.Type != corev1.EventTypeNormal || ev.ReportingController != events.ReportingController || ev.Note == "" {
			t.Errorf("Starting Event: type %s, controller %s, note %q", ev.Type, ev.ReportingController, ev.Note)
		}
	})

	t.Run("metrics server endpoints", func(t *testing.T) {
		a := waitForHTTP(t, "ok", metricsURL+"/healthz", 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
		if string(a.body) != "ok" {
			t.Errorf("/healthz: %q, want ok", a.body)
		}
		a = waitForHTTP(t, "the mode", metricsURL+"/proxyMode", 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
		if string(a.body) != "iptables" {
			t.Errorf("/proxyMode: %q, want iptables", a.body)
		}
		a = waitForHTTP(t, "the configuration", metricsURL+"/configz", 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
		var configz map[string]map[string]any
		if err := json.Unmarshal(a.body, &configz); err != nil {
			t.Fatalf("/configz: %v: %s", err, a.body)
		}
		cfg, ok := configz["kubeproxy.config.k8s.io"]
		if !ok {
			t.Fatalf("/configz has no kubeproxy.config.k8s.io: %s", a.body)
		}
		for key, want := range map[string]any{
			"mode": "iptables", "hostnameOverride": nodeName, "metricsBindAddress": p.metricsAddr, "healthzBindAddress": p.healthzAddr,
		} {
			if cfg[key] != want {
				t.Errorf("/configz %s = %v, want %v", key, cfg[key], want)
			}
		}
		// Defaults are filled in, as upstream serves them.
		if cfg["configSyncPeriod"] != "15m0s" {
			t.Errorf("/configz configSyncPeriod = %v, want the default 15m0s", cfg["configSyncPeriod"])
		}
	})

	t.Run("proxy health server", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/livez"} {
			a := waitForHTTP(t, "200", healthURL+path, 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
			var h health.ProxyHealth
			if err := json.Unmarshal(a.body, &h); err != nil {
				t.Fatalf("%s: %v: %s", path, err, a.body)
			}
			var raw map[string]any
			_ = json.Unmarshal(a.body, &raw)
			for _, field := range []string{"lastUpdated", "currentTime", "healthy", "status"} {
				if _, ok := raw[field]; !ok {
					t.Errorf("%s: no %q in %s", path, field, a.body)
				}
			}
			_, hasEligible := raw["nodeEligible"]
			if hasEligible != (path == "/healthz") {
				t.Errorf("%s: nodeEligible present = %v: %s", path, hasEligible, a.body)
			}
			if !h.Healthy || h.CurrentTime.IsZero() || h.LastUpdated.IsZero() || !h.Status[corev1.IPv4Protocol].Healthy {
				t.Errorf("%s: %s", path, a.body)
			}
			if path == "/healthz" && (h.NodeEligible == nil || !*h.NodeEligible) {
				t.Errorf("%s: node not eligible: %s", path, a.body)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: Content-Type %q", path, ct)
			}
		}
	})

	t.Run("kubeproxy metrics", func(t *testing.T) {
		ns := newNamespace(t, c, "metrics")
		ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
		// internalTrafficPolicy Local with endpoints elsewhere only: counted by
		// no_local_endpoints_total.
		local := clusterIPService(ns, "local-only")
		local.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		createService(t, c, local)
		createSlice(t, c, endpointSlice(ns, "local-only", "local-only-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.11.1", "node-2")))
		// An EndpointSlice change with the trigger time the EndpointSlice controller sets,
		// after sluice started: it feeds network_programming_duration_seconds.
		createService(t, c, clusterIPService(ns, "latency"))
		s := endpointSlice(ns, "latency", "latency-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.11.2", nodeName))
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
		createSlice(t, c, s)
		p.waitForPort(t, "programmed", v4(ns, "latency", "http"), func(v *model.ServicePortView) bool { return v != nil && len(v.ClusterEndpoints) == 1 })
		for _, path := range []string{"/healthz", "/livez"} {
			if _, err := httpGet(t.Context(), healthURL+path); err != nil {
				t.Fatal(err)
			}
		}

		fam := []string{"ip_family", "IPv4"}
		m := p.waitForMetrics(t, "the metrics of these changes", 30*time.Second, func(m metricFamilies) bool {
			noLocal, _ := m.value("kubeproxy_sync_proxy_rules_no_local_endpoints_total", "traffic_policy", "internal", "ip_family", "IPv4")
			latency, _ := m.value("kubeproxy_network_programming_duration_seconds", fam...)
			healthz, _ := m.value("kubeproxy_proxy_healthz_total", "code", "200")
			livez, _ := m.value("kubeproxy_proxy_livez_total", "code", "200")
			return noLocal == 1 && latency >= 1 && healthz >= 1 && livez >= 1
		})
		checks := []struct {
			name   string
			labels []string
			ok     func(float64) bool
			want   string
		}{
			{"kubeproxy_sync_proxy_rules_duration_seconds", fam, func(v float64) bool { return v >= 1 }, "observations"},
			{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", fam, func(v float64) bool { return v >= float64(started.Unix()) }, "a time after sluice started"},
			{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", fam, func(v float64) bool { return v >= float64(started.Unix()) }, "a time after sluice started"},
			{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, func(v float64) bool { return v >= 2 }, "at least the two slices"},
			{"kubeproxy_sync_proxy_rules_service_changes_total", nil, func(v float64) bool { return v >= 2 }, "at least the two Services"},
			{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", nil, func(v float64) bool { return v >= 0 }, "present"},
			{"kubeproxy_sync_proxy_rules_service_changes_pending", nil, func(v float64) bool { return v >= 0 }, "present"},
			{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "external", "ip_family", "IPv4"}, func(v float64) bool { return v == 0 }, "0"},
			{"sluice_sync_failures_total", fam, func(v float64) bool { return v == 0 }, "present, 0"},
			{"sluice_services_failed", fam, func(v float64) bool { return v == 0 }, "0"},
			{"sluice_service_ports", fam, func(v float64) bool { return v >= 3 }, "the kubernetes Service and the two above"},
			// The conntrack table of sluice's network namespace, read from the kernel.
			{"sluice_conntrack_entries", nil, func(v float64) bool { return v >= 0 }, "present"},
			{"sluice_conntrack_limit", nil, func(v float64) bool { return v > 0 }, "nf_conntrack_max"},
			{"sluice_conntrack_drop_total", nil, func(v float64) bool { return v >= 0 }, "present"},
			{"sluice_conntrack_read_failures_total", nil, func(v float64) bool { return v == 0 }, "0"},
		}
		for _, ch := range checks {
			v, found := m.value(ch.name, ch.labels...)
			if !found || !ch.ok(v) {
				t.Errorf("%s%v = %v (found %v), want %s", ch.name, ch.labels, v, found, ch.want)
			}
		}

		// sluice status shows the conntrack table and the counts of Service ports.
		code, out, stderr := runSluice(t, "status", "--server", p.metricsAddr)
		if code != 0 || !strings.Contains(out, "conntrack: ") || strings.Contains(out, "cannot be read") || !strings.Contains(out, " programmed, 0 failed, 0 pending") {
			t.Errorf("sluice status: exit code %d, stderr %s, stdout:\n%s", code, stderr, out)
		}

		// The Local-policy Service gets a local endpoint: nothing is dropped any more.
		updateSlice(t, c, ns, "local-only-1", func(s *discoveryv1.EndpointSlice) {
			s.Endpoints = append(s.Endpoints, readyEndpoint("10.244.11.3", nodeName))
		})
		p.waitForMetrics(t, "no_local_endpoints_total back to 0", 30*time.Second, func(m metricFamilies) bool {
			v, found := m.value("kubeproxy_sync_proxy_rules_no_local_endpoints_total", "traffic_policy", "internal", "ip_family", "IPv4")
			return found && v == 0
		})
	})

	t.Run("per-Service health check", func(t *testing.T) {
		ns := newNamespace(t, c, "hc")
		hcPort := createLocalLoadBalancer(t, c, ns, "lb-local", func(int32) {})
		createSlice(t, c, endpointSlice(ns, "lb-local", "lb-local-1", discoveryv1.AddressTypeIPv4,
			[]discoveryv1.EndpointPort{tcpPort("http", 8080)},
			readyEndpoint("10.244.12.1", nodeName), readyEndpoint("10.244.12.2", "node-2"),
			endpoint("10.244.12.3", nodeName, false, true, true)))
		url := fmt.Sprintf("http://127.0.0.1:%d/", hcPort)

		type body struct {
			Service struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
			LocalEndpoints      int  `json:"localEndpoints"`
			ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
		}
		check := func(a *httpAnswer, wantCode, wantLocal int) {
			t.Helper()
			if a.code != wantCode {
				t.Errorf("code %d, want %d", a.code, wantCode)
			}
			if got := a.header.Get(health.EndpointWeightHeader); got != strconv.Itoa(wantLocal) {
				t.Errorf("%s: %q, want %d", health.EndpointWeightHeader, got, wantLocal)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var b body
			if err := json.Unmarshal(a.body, &b); err != nil {
				t.Fatalf("body: %v: %s", err, a.body)
			}
			if b.Service.Namespace != ns || b.Service.Name != "lb-local" || b.LocalEndpoints != wantLocal || !b.ServiceProxyHealthy {
				t.Errorf("body %s, want service %s/lb-local, %d local endpoints, proxy healthy", a.body, ns, wantLocal)
			}
		}

		// One local ready endpoint (the terminating local one does not count).
		a := waitForHTTP(t, "200", url, 30*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
		check(a, http.StatusOK, 1)

		// The local endpoint goes away: this node must not get the load balancer's traffic.
		updateSlice(t, c, ns, "lb-local-1", func(s *discoveryv1.EndpointSlice) {
			s.Endpoints = []discoveryv1.Endpoint{readyEndpoint("10.244.12.2", "node-2")}
		})
		a = waitForHTTP(t, "503", url, 30*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusServiceUnavailable })
		check(a, http.StatusServiceUnavailable, 0)

		// The Service goes away: so does its listener.
		deleteService(t, c, ns, "lb-local")
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := httpGet(t.Context(), url); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still answers 30s after the Service was deleted", url)
			}
			time.Sleep(pollInterval)
		}
	})

	t.Run("a health check port in use is reported", func(t *testing.T) {
		ns := newNamespace(t, c, "hc-taken")
		var taken net.Listener
		hcPort := createLocalLoadBalancer(t, c, ns, "lb-local", func(port int32) {
			if taken != nil { // a port the apiserver had allocated: try another
				_ = taken.Close()
			}
			var err error
			if taken, err = net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
				t.Fatal(err)
			}
		})
		defer taken.Close()
		createSlice(t, c, endpointSlice(ns, "lb-local", "lb-local-1", discoveryv1.AddressTypeIPv4,
			[]discoveryv1.EndpointPort{tcpPort("http", 8080)}, readyEndpoint("10.244.13.1", nodeName)))
		ev := waitForAPIEvent(t, c, ns, "FailedToStartServiceHealthcheck", 30*time.Second, func(ev *eventsv1.Event) bool {
			return ev.Reason == events.ReasonFailedToStartServiceHealthcheck && ev.Regarding.Kind == "Service" && ev.Regarding.Name == "lb-local"
		})
		if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Note, strconv.Itoa(int(hcPort))) {
			t.Errorf("Event: %s %q", ev.Type, ev.Note)
		}
		// The rest is programmed, and the port is opened once it is free.
		p.waitForPort(t, "programmed", v4(ns, "lb-local", "http"), func(v *model.ServicePortView) bool {
			return v != nil && v.HealthCheckNodePort == hcPort && len(v.LocalEndpoints) == 1
		})
		_ = taken.Close()
		// Another sync retries the listener: the endpoint changes.
		updateSlice(t, c, ns, "lb-local-1", func(s *discoveryv1.EndpointSlice) {
			s.Endpoints = append(s.Endpoints, readyEndpoint("10.244.13.2", nodeName))
		})
		a := waitForHTTP(t, "200 once the port is free", fmt.Sprintf("http://127.0.0.1:%d/", hcPort), 30*time.Second, func(a *httpAnswer) bool {
			return a.code == http.StatusOK
		})
		if got := a.header.Get(health.EndpointWeightHeader); got != "2" {
			t.Errorf("%s: %q, want 2", health.EndpointWeightHeader, got)
		}
	})

	t.Run("sluice exits when its Node is deleted or its IPs change", func(t *testing.T) {
		// Like upstream: the node's IPs are baked into the rules, and a deleted Node means
		// this proxy should not run; the DaemonSet restarts it.
		for _, tc := range []struct {
			node, wantLog string
			change        func(ctx context.Context, name string) error
		}{
			{"node-deleted", "was deleted", func(ctx context.Context, name string) error {
				return c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
			}},
			{"node-moved", "node IPs changed", func(ctx context.Context, name string) error {
				return retry.RetryOnConflict(retry.DefaultRetry, func() error {
					n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return err
					}
					n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.10.99"}}
					_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
					return err
				})
			}},
		} {
			createNode(t, c, tc.node, "192.168.10.2")
			other := startSluice(t, cp, tc.node, "")
			other.waitFor(t, tc.node+": the first sync", 30*time.Second, func(r *app.StatusReport) bool {
				f := familyReport(r, model.IPv4)
				return f != nil && !f.Status.LastSuccess.IsZero()
			})
			if err := tc.change(t.Context(), tc.node); err != nil {
				t.Fatal(err)
			}
			if code := other.waitExit(t, 30*time.Second); code != 1 {
				t.Errorf("%s: exit code %d, want 1", tc.node, code)
			}
			if !strings.Contains(other.log(), tc.wantLog) {
				t.Errorf("%s: the log does not say %q:\n%s", tc.node, tc.wantLog, lastLines(other.log(), 20))
			}
		}
		// The sluice of this test's node is unaffected.
		p.checkRunning(t)
	})

	t.Run("healthz fails on a node about to be deleted", func(t *testing.T) {
		setTaint := func(ctx context.Context, on bool) {
			t.Helper()
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				node, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					return err
				}
				node.Spec.Taints = nil
				if on {
					node.Spec.Taints = []corev1.Taint{{Key: health.ToBeDeletedTaint, Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule}}
				}
				_, err = c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				t.Fatalf("tainting the node: %v", err)
			}
		}
		setTaint(t.Context(), true)
		// t.Context() is cancelled before cleanups run.
		t.Cleanup(func() { setTaint(context.Background(), false) })
		a := waitForHTTP(t, "503", healthURL+"/healthz", 30*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusServiceUnavailable })
		if !strings.Contains(string(a.body), `"nodeEligible":false`) {
			t.Errorf("/healthz on a tainted node: %s", a.body)
		}
		// The proxy itself is fine: a liveness probe must not restart it.
		if a, err := httpGet(t.Context(), healthURL+"/livez"); err != nil || a.code != http.StatusOK {
			t.Errorf("/livez on a tainted node: %v %+v", err, a)
		}
		p.waitForMetrics(t, "the 503 counted", 10*time.Second, func(m metricFamilies) bool {
			v, _ := m.value("kubeproxy_proxy_healthz_total", "code", "503")
			return v >= 1
		})
		setTaint(t.Context(), false)
		waitForHTTP(t, "200 once the taint is gone", healthURL+"/healthz", 30*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
	})
}

// createLocalLoadBalancer creates a LoadBalancer Service with externalTrafficPolicy Local
// and a healthCheckNodePort free on 127.0.0.1, and returns that port. before runs with the
// port just before the Service is created. A port the apiserver has allocated already
// (another Service's NodePort) is replaced by another.
func createLocalLoadBalancer(t *testing.T, c kubernetes.Interface, ns, name string, before func(port int32)) int32 {
	t.Helper()
	for range 5 {
		port := freeNodePort(t)
		svc := clusterIPService(ns, name)
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = port
		before(port)
		created, err := c.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{})
		if err != nil && strings.Contains(err.Error(), "already allocated") {
			continue
		}
		if err != nil {
			t.Fatalf("creating service %s/%s: %v", ns, name, err)
		}
		if created.Spec.HealthCheckNodePort != port {
			t.Fatalf("healthCheckNodePort %d, want %d", created.Spec.HealthCheckNodePort, port)
		}
		return port
	}
	t.Fatal("no free healthCheckNodePort in 5 tries")
	return 0
}
