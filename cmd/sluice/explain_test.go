package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluiceproxy/sluice/pkg/explain"
)

// objectsFile writes the test cluster's objects as `kubectl get svc,endpointslices,nodes -o
// yaml` prints them: a v1 List.
func objectsFile(t *testing.T) string {
	t.Helper()
	services, slices := testObjects()
	var items []any
	for _, s := range services {
		s.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
		items = append(items, s)
	}
	for _, s := range slices {
		s.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		items = append(items, s)
	}
	for _, name := range []string{"node-a", "node-b"} {
		n := &v1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
		ip := map[string]string{"node-a": "172.18.0.2", "node-b": "172.18.0.3"}[name]
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
		items = append(items, n)
	}
	data, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestExplainCommand(t *testing.T) {
	live := func(t *testing.T) []string { return []string{"--server", fakeDaemon(t, testReport(nil)).URL} }
	offline := func(t *testing.T) []string { return []string{"-f", objectsFile(t), "--node", "node-a"} }
	tests := []struct {
		name     string
		source   func(t *testing.T) []string
		args     []string
		wantCode int
		wantOut  []string
		wantErr  string
	}{
		{
			name:   "live: an external client to an externalTrafficPolicy Local LoadBalancer IP",
			source: live, args: []string{"203.0.113.7", "192.0.2.11:80/tcp"},
			wantOut: []string{
				"Packet 203.0.113.7 -> 192.0.2.11:80/TCP on node node-a (IPv4, nftables mode)",
				"Service:     demo/web-local:http/TCP (LoadBalancer), matched by LoadBalancer IP 192.0.2.11 port 80",
				"Local endpoints: 1 of 2", "+ 10.244.1.11:8080", "- 10.244.2.11:8080",
				"Verdict:     DNAT to the only candidate endpoint",
			},
		},
		{
			name:   "live: a pod of the cluster CIDR (from /configz) is short-circuited",
			source: live, args: []string{"10.244.2.50", "172.18.0.2:30081"},
			wantOut: []string{"Source:      pod: in the cluster CIDR 10.244.0.0/16", "matched by NodePort 30081 on local address 172.18.0.2 (in nodePortAddresses 172.18.0.2/32)",
				"Cluster endpoints: 2 of 2"},
		},
		{
			name:   "live: json",
			source: live, args: []string{"-o", "json", "10.244.1.10", "10.96.0.10:80"},
			wantOut: []string{`"action": "dnat"`, `"candidates": [` + "\n" + `    "10.244.1.10:8080"` + "\n  ]"},
		},
		{
			name:   "live: a Service",
			source: live, args: []string{"demo/web"},
			wantOut: []string{"Service demo/web on node node-a (IPv4, nftables mode)",
				"- 10.244.2.10:8080  node-b  terminating,serving  terminating (still serving); used only when no endpoint is ready, and 1 is"},
		},
		{
			name:   "live: a Service that does not exist",
			source: live, args: []string{"demo/nope"},
			wantCode: exitFailure, wantErr: "Service demo/nope has no port in sluice's state on node-a",
		},
		{
			name:   "live: no Service matches",
			source: live, args: []string{"10.244.1.10", "10.96.0.99:80"},
			wantOut: []string{"Service:  none", "drop: 10.96.0.99 is in the Service range 10.96.0.0/16"},
		},
		{
			name:   "live: the daemon cannot be reached",
			source: func(t *testing.T) []string { return []string{"--server", closedAddress(t)} }, args: []string{"demo/web"},
			wantCode: exitUnreachable, wantErr: "cannot reach sluice",
		},
		{
			name:   "offline flags need -f",
			source: live, args: []string{"--proxy-mode", "nftables", "demo/web"},
			wantCode: exitFailure, wantErr: "need -f (offline)",
		},
		{
			name:   "offline: iptables defaults, no cluster CIDR",
			source: offline, args: []string{"10.244.2.50", "172.18.0.2:30081"},
			wantOut: []string{"on node node-a (IPv4, iptables mode)", "Source:      external: no local-traffic detector is configured",
				"matched by NodePort 30081 on local address 172.18.0.2 (nodePortAddresses: every local address)", "Local endpoints: 1 of 2"},
		},
		{
			name:   "offline: mode and cluster CIDR from flags",
			source: offline, args: []string{"--proxy-mode", "nftables", "--cluster-cidr", "10.244.0.0/16", "10.244.2.50", "172.18.0.2:30081"},
			wantOut: []string{"(IPv4, nftables mode)", "Source:      pod: in the cluster CIDR 10.244.0.0/16", "Cluster endpoints: 2 of 2"},
		},
		{
			name: "offline: from a configuration file",
			source: func(t *testing.T) []string {
				cfg := writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nnodePortAddresses: [10.0.0.0/8]\n")
				return append(offline(t), "--config", cfg)
			},
			args:    []string{"203.0.113.7", "172.18.0.2:30081"},
			wantOut: []string{"Service:  none", "nodePortAddresses (10.0.0.0/8) does not include it"},
		},
		{
			name:     "offline: the node must be in the files",
			source:   func(t *testing.T) []string { return []string{"-f", objectsFile(t), "--node", "node-z"} },
			args:     []string{"demo/web"},
			wantCode: exitFailure, wantErr: `no Node "node-z" in the files (Nodes: node-a, node-b)`,
		},
		{
			name:     "offline: several nodes need --node",
			source:   func(t *testing.T) []string { return []string{"-f", objectsFile(t)} },
			args:     []string{"demo/web"},
			wantCode: exitFailure, wantErr: "--node is required: the files hold 2 Nodes",
		},
		{name: "a bad source", source: live, args: []string{"pod-a", "10.96.0.10:80"}, wantCode: exitFailure, wantErr: `source "pod-a" is not an IP address`},
		{name: "no port", source: live, args: []string{"10.244.1.10", "10.96.0.10"}, wantCode: exitFailure, wantErr: "want IP:PORT"},
		{name: "a bad protocol", source: live, args: []string{"10.244.1.10", "10.96.0.10:80/icmp"}, wantCode: exitFailure, wantErr: `protocol "icmp"`},
		{name: "mixed families", source: live, args: []string{"fd00::1", "10.96.0.10:80"}, wantCode: exitFailure, wantErr: "different IP families"},
		{name: "a family sluice does not handle", source: live, args: []string{"fd00::1", "[fd00::10]:80/udp"}, wantCode: exitFailure, wantErr: "handles no IPv6 traffic"},
		{name: "not a Service name", source: live, args: []string{"web"}, wantCode: exitFailure, wantErr: "want NAMESPACE/NAME"},
		{name: "a bad source kind", source: live, args: []string{"--source-kind", "alien", "demo/web"}, wantCode: exitFailure, wantErr: "--source-kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"explain"}, tt.source(t)...), tt.args...)
			code, out, errOut := sluice(t, args...)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tt.wantCode, errOut)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			if !strings.Contains(errOut, tt.wantErr) || (tt.wantErr == "" && errOut != "") {
				t.Errorf("stderr %q, want it to contain %q", errOut, tt.wantErr)
			}
		})
	}
}

func TestExplainJSONIsTheExplanation(t *testing.T) {
	srv := fakeDaemon(t, testReport(nil))
	code, out, errOut := sluice(t, "explain", "--server", srv.URL, "-o", "json", "203.0.113.7", "192.0.2.11:80")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var e explain.Explanation
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatal(err)
	}
	if e.Verdict.Action != explain.ActionDNAT || e.Match == nil || e.Match.Name != "web-local" || e.Policy.Applied != explain.PolicyLocal ||
		len(e.Candidates) != 1 || e.Masquerade == nil || e.Masquerade.Masquerade {
		t.Errorf("explanation %+v", e)
	}
	code, out, _ = sluice(t, "explain", "--server", srv.URL, "-o", "json", "demo/web-local")
	var ses []explain.ServiceExplanation
	if err := json.Unmarshal([]byte(out), &ses); err != nil || code != 0 || len(ses) != 1 || len(ses[0].Ports[0].Traffic) != 4 {
		t.Errorf("service explanation (exit %d, %v): %s", code, err, out)
	}
}
