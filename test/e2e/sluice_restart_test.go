//go:build e2e

package e2e

import (
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

// TestSluiceSurvivesAPIServerRestart stops kube-apiserver under a running sluice: sluice
// must keep serving the state it has (and keep the node healthy) while the apiserver is
// down, reconnect when it is back, and converge on what changed after the restart.
func TestSluiceSurvivesAPIServerRestart(t *testing.T) {
	ctx := t.Context()
	cp := controlplane.StartForTest(t, controlplane.Options{})
	c := cp.AdminClient()
	createNode(t, c, nodeName, nodeIPv4)
	p := startSluice(t, cp, nodeName, "")
	ns := newNamespace(t, c, "restart")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
	for name, ip := range map[string]string{"keep": "10.244.10.1", "change": "10.244.10.2", "gone": "10.244.10.3"} {
		createService(t, c, clusterIPService(ns, name))
		createSlice(t, c, endpointSlice(ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint(ip, nodeName)))
	}
	want := map[string]string{"keep": "10.244.10.1:8080", "change": "10.244.10.2:8080", "gone": "10.244.10.3:8080"}
	hasWanted := func(r *app.StatusReport) bool {
		for name, ep := range want {
			v := v4(ns, name, "http").find(r)
			if v == nil || v.Port != 80 || !equalStrings(endpointAddrs(v.ClusterEndpoints), []string{ep}) {
				return false
			}
		}
		return true
	}
	p.waitFor(t, "the three Services", 30*time.Second, hasWanted)

	began := time.Now()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stopping kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver stopped in %s", time.Since(began).Round(time.Millisecond))
	// While it is down, sluice answers with the same Services and stays healthy. client-go
	// retries refused connections quietly (backing off from 800 ms), so there is no sign
	// to wait for: look for 3 s, time for several failed reconnections.
	downSince := time.Now()
	for looks := 0; time.Since(downSince) < 3*time.Second; looks++ {
		p.checkRunning(t)
		r, err := p.state(ctx)
		if err != nil {
			t.Fatalf("state while kube-apiserver is down: %v", err)
		}
		if !hasWanted(r) {
			t.Fatalf("state changed while kube-apiserver is down (look %d)", looks)
		}
		for _, path := range []string{"/healthz", "/livez"} {
			if a, err := httpGet(ctx, "http://"+p.healthzAddr+path); err != nil || a.code != http.StatusOK {
				t.Fatalf("%s while kube-apiserver is down: %v %+v", path, err, a)
			}
		}
		time.Sleep(pollInterval)
	}

	began = time.Now()
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatalf("starting kube-apiserver again: %v", err)
	}
	t.Logf("kube-apiserver ready again in %s", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	updateService(t, c, ns, "change", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })
	updateSlice(t, c, ns, "change-1", func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = []discoveryv1.Endpoint{readyEndpoint("10.244.10.20", nodeName)}
	})
	deleteService(t, c, ns, "gone")
	createService(t, c, clusterIPService(ns, "new"))
	newSlice := endpointSlice(ns, "new", "new-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.10.4", nodeName))
	newSlice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	createSlice(t, c, newSlice)

	converged := func(r *app.StatusReport) bool {
		keep, change, gone, added := v4(ns, "keep", "http").find(r), v4(ns, "change", "http").find(r), v4(ns, "gone", "http").find(r), v4(ns, "new", "http").find(r)
		f := familyReport(r, model.IPv4)
		return keep != nil && equalStrings(endpointAddrs(keep.ClusterEndpoints), []string{"10.244.10.1:8080"}) &&
			change != nil && change.Port == 81 && equalStrings(endpointAddrs(change.ClusterEndpoints), []string{"10.244.10.20:8080"}) &&
			gone == nil &&
			added != nil && equalStrings(endpointAddrs(added.ClusterEndpoints), []string{"10.244.10.4:8080"}) &&
			f.Status.LastError == "" && !f.Status.LastSuccess.IsZero() && len(f.Status.Failed) == 0
	}
	p.waitFor(t, "convergence after the restart", 60*time.Second, converged)
	t.Logf("sluice converged %s after the changes began", time.Since(began).Round(time.Millisecond))
	waitForHTTP(t, "healthy after the restart", "http://"+p.healthzAddr+"/healthz", 30*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })

	// sluice itself restarts (a DaemonSet rollout): the new process lists what exists and
	// programs the same state in its first sync. Trigger times of changes made before it
	// started are not its latency to report.
	p2 := startSluice(t, cp, nodeName, "")
	p2.waitFor(t, "the same state from a fresh start", 30*time.Second, converged)
	m, err := p2.metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.value("kubeproxy_network_programming_duration_seconds", "ip_family", "IPv4"); v != 0 {
		t.Errorf("a fresh sluice observed %v network programming latencies of changes made before it started", v)
	}
}
