package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata")

// renderCluster is a small dual-stack cluster: ClusterIP, NodePort with session affinity,
// LoadBalancer with source ranges, LoadBalancer with externalTrafficPolicy Local, a UDP
// Service without endpoints.
var renderCluster = filepath.Join("testdata", "render-cluster.yaml")

// renderArgs are the flags of the golden renders: node-a with the cluster's pod CIDRs.
func renderArgs(mode string, extra ...string) []string {
	return append([]string{"render", "--from", renderCluster, "--node", "node-a", "--mode", mode,
		"--cluster-cidr", "10.244.0.0/16,fd00:244::/56"}, extra...)
}

// TestRenderGolden pins what each mode programs on node-a; `go test -update` rewrites the
// files after a reviewed change of a backend.
func TestRenderGolden(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables", "ipvs"} {
		t.Run(mode, func(t *testing.T) {
			code, out, errOut := sluice(t, renderArgs(mode)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			path := filepath.Join("testdata", "render-"+mode+".golden")
			if *updateGolden {
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), out); diff != "" {
				t.Errorf("%s (-want +got; -update rewrites it):\n%s", path, diff)
			}
		})
	}
}

// TestRenderShowsEveryFeature checks the golden renders hold what the cluster asks for, so
// that a regenerated golden file cannot silently lose a feature.
func TestRenderShowsEveryFeature(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{mode: "iptables", want: []string{
			"# sluice render: iptables mode, IPv4, node node-a (172.18.0.2): 5 Services, 5 Service ports",
			"# sluice render: iptables mode, IPv6, node node-a (fd00:18::2): 1 Service, 1 Service port",
			`#   iptables -t nat -I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			`#   ip6tables -t nat -I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			`-A KUBE-SERVICES -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-`,
			`-A KUBE-SERVICES -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d fd00:96::10 --dport 80 -j KUBE-SVC-`,
			`-m recent --name KUBE-SEP-`, "--rcheck --seconds 10800 --reap",
			`-A KUBE-NODEPORTS -m comment --comment demo/sticky:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-`,
			`-m comment --comment "demo/lb:https loadbalancer IP" -s 203.0.113.0/24 -j KUBE-EXT-`,
			`-A KUBE-PROXY-FIREWALL -m comment --comment "demo/lb:https traffic not accepted by KUBE-FW-`,
			`-j KUBE-SVL-`, `"demo/lb-local:http health check node port" -m tcp -p tcp --dport 32000 -j ACCEPT`,
			`-A KUBE-SERVICES -m comment --comment "demo/dns:dns has no endpoints" -m udp -p udp -d 10.96.0.53 --dport 53 -j REJECT`,
		}},
		{mode: "nftables", want: []string{
			"add table ip kube-proxy", "add table ip6 kube-proxy",
			"add element ip kube-proxy nodeport-ips { 172.18.0.2 }",
			"add element ip6 kube-proxy service-ips { fd00:96::10 . tcp . 80 : goto service-",
			"timeout 10800s",
			"add rule ip kube-proxy firewall-2ULBZPCO-demo/lb/tcp/https ip saddr != { 203.0.113.0/24 } drop",
			"goto local-FUBUFQIT-demo/lb-local/tcp/http",
			`add element ip kube-proxy reject-services { 10.96.0.53 . udp . 53 comment "demo/dns:dns" }`,
		}},
		{mode: "ipvs", want: []string{
			"ip link add kube-ipvs0 type dummy",
			"ipvsadm -A -t 10.96.0.11:80 -s rr -p 10800",
			"ipvsadm -A -t [fd00:96::10]:80 -s rr", "ipvsadm -a -t [fd00:96::10]:80 -r [fd00:244:1::10]:8080 -m -w 1",
			"ipvsadm -A -t 172.18.0.2:30081 -s rr\nipvsadm -a -t 172.18.0.2:30081 -r 10.244.1.13:8080 -m -w 1\n",
			"ipset add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.0.2.10,tcp:443,203.0.113.0/24",
			"ipset add KUBE-HEALTH-CHECK-NODE-PORT 32000",
			"ip addr add fd00:96::10/128 dev kube-ipvs0",
			"iptables-restore --noflush <<'EOF'", "ip6tables-restore --noflush <<'EOF'",
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			_, out, _ := sluice(t, renderArgs(tc.mode)...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("missing %q", w)
				}
			}
		})
	}
}

func TestRenderJSONHoldsEachFamilysRuleset(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables", "ipvs"} {
		t.Run(mode, func(t *testing.T) {
			code, out, errOut := sluice(t, renderArgs(mode, "-o", "json")...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var got map[string]string
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if len(got) != 2 {
				t.Fatalf("families %v, want IPv4 and IPv6", keys(got))
			}
			for _, family := range []string{"IPv4", "IPv6"} {
				_, text, _ := sluice(t, renderArgs(mode, "--family", family)...)
				// The text output is the header (two comment lines) and the ruleset.
				lines := strings.SplitN(text, "\n", 3)
				if len(lines) < 3 || got[family] != lines[2] {
					t.Errorf("%s: JSON ruleset differs from the text one", family)
				}
			}
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestRenderFamilyAndConfigurationFile(t *testing.T) {
	_, v4, _ := sluice(t, renderArgs("nftables", "--family", "ipv4")...)
	if !strings.Contains(v4, "add table ip kube-proxy") || strings.Contains(v4, "ip6") {
		t.Errorf("--family ipv4 rendered more than IPv4:\n%s", v4)
	}

	// The same configuration from a file renders the same.
	cfg := writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16,fd00:244::/56\n")
	code, fromFile, errOut := sluice(t, "render", "--from", renderCluster, "--node", "node-a", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	_, fromFlags, _ := sluice(t, renderArgs("nftables")...)
	if fromFile != fromFlags {
		t.Errorf("--config renders differently from the same flags:\n%s", cmp.Diff(fromFlags, fromFile))
	}

	// The file's settings reach the backend: masqueradeAll, conntrack.tcpBeLiberal.
	cfg = writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16\n"+
		"iptables: {masqueradeAll: true}\nconntrack: {tcpBeLiberal: true}\n")
	_, out, _ := sluice(t, "render", "--from", renderCluster, "--node", "node-a", "--config", cfg, "--family", "IPv4")
	if !strings.Contains(out, "iptables mode (no mode configured: the default)") {
		t.Errorf("the defaulted mode is not said:\n%s", out)
	}
	if !strings.Contains(out, `-A KUBE-SVC-XRY76EGRC3BSCIIJ -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-MARK-MASQ`) {
		t.Errorf("masqueradeAll from the file is not applied")
	}
	if strings.Contains(out, "--ctstate INVALID -j DROP") {
		t.Errorf("with tcpBeLiberal the INVALID drop rule must go")
	}

	// --local-address adds a NodePort address where nodePortAddresses selects it.
	_, out, _ = sluice(t, renderArgs("nftables", "--family", "IPv4", "--nodeport-addresses", "172.18.0.0/16", "--local-address", "172.18.5.5")...)
	if !strings.Contains(out, "add element ip kube-proxy nodeport-ips { 172.18.0.2 }\nadd element ip kube-proxy nodeport-ips { 172.18.5.5 }\n") {
		t.Errorf("--local-address is not a NodePort address:\n%s", out)
	}
}

func TestRenderReadsStdin(t *testing.T) {
	f, err := os.Open(renderCluster)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()
	code, out, errOut := sluice(t, "render", "--from", "-", "--node", "node-a", "--mode", "ipvs", "--family", "IPv6")
	if code != 0 || !strings.Contains(out, "ipvsadm -A -t [fd00:96::10]:80 -s rr") {
		t.Errorf("exit %d: %s\n%s", code, errOut, out)
	}
}

func TestRenderErrors(t *testing.T) {
	broken := writeFile(t, "kind: Service\napiVersion: v1\nmetadata: {name: ok, namespace: demo}\n---\nkind: Service\napiVersion: v1\nmetadata: {name: bad, namespace: demo}\nspec: {ports: 80}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "no file", args: []string{"render", "--node", "node-a"}, want: `required flag(s) "from" not set`},
		{name: "unknown node", args: []string{"render", "--from", renderCluster, "--node", "node-z"},
			want: `no Node "node-z" in the files (Nodes: node-a, node-b)`},
		{name: "several nodes need --node", args: []string{"render", "--from", renderCluster}, want: "--node is required: the files hold 2 Nodes"},
		{name: "no such mode", args: []string{"render", "--from", renderCluster, "--node", "node-a", "--mode", "kernelspace"},
			want: `--mode "kernelspace": want iptables, nftables or ipvs`},
		{name: "no such mode in the file", args: []string{"render", "--from", renderCluster, "--node", "node-a", "--config",
			writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: kernelspace\n")},
			want: `configuration: mode: Unsupported value: "kernelspace"`},
		{name: "undecodable document", args: []string{"render", "--from", broken, "--node", "node-a"},
			want: broken + ": document 2: decoding Service demo/bad"},
		{name: "missing file", args: []string{"render", "--from", "testdata/nope.yaml", "--node", "node-a"}, want: "nope.yaml: no such file"},
		{name: "bad family", args: []string{"render", "--from", renderCluster, "--node", "node-a", "--family", "IPv5"}, want: `--family "IPv5": want IPv4, IPv6 or all`},
		{name: "bad output", args: []string{"render", "--from", renderCluster, "--node", "node-a", "-o", "yaml"}, want: `--output "yaml": want text or json`},
		{name: "bad local address", args: []string{"render", "--from", renderCluster, "--node", "node-a", "--local-address", "node-a"}, want: `--local-address "node-a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := sluice(t, tc.args...)
			if code != exitFailure || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, exitFailure, tc.want)
			}
			if out != "" {
				t.Errorf("printed a ruleset on error:\n%s", out)
			}
		})
	}
}
