package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

const configHeader = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// sluiceWithStdin runs the command line in-process with stdin.
func sluiceWithStdin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCommand(&out, &errOut)
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	code = exitCode(root.ExecuteContext(context.Background()), &errOut)
	return code, out.String(), errOut.String()
}

// `sluice config check` is the strict gate: the assertions that used to say "an unknown
// field stops sluice" live here now, since the daemon starts with such a file (issue 10).
func TestConfigCheckRefusesNamingEveryField(t *testing.T) {
	bad := configHeader + `mode: iptables
mode: nftables
nftables:
  syncPerod: 10s
  masqueradeBit: 40
conntrack:
  maxPerCpu: 4
oomScoreAdj: 5000
`
	wrongType := configHeader + "bogus: true\nclientConnection:\n  burst: many\n"
	configMap := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\ndata:\n  config.conf: |\n" +
		indent(bad, "    ")
	tests := []struct {
		name  string
		args  []string
		stdin string
		want  []string
	}{
		{name: "file", args: []string{"config", "check", writeFile(t, bad)},
			want: []string{"5 problem(s)", `duplicate field "mode"`, `unknown field "nftables.syncPerod"`, `unknown field "conntrack.maxPerCpu"`,
				"nftables.masqueradeBit: Invalid value: 40", "oomScoreAdj: Invalid value: 5000"}},
		{name: "stdin", args: []string{"config", "check", "-"}, stdin: bad,
			want: []string{"<stdin>: 5 problem(s)", `duplicate field "mode"`, "oomScoreAdj"}},
		{name: "values of the wrong type", args: []string{"config", "check", writeFile(t, wrongType)},
			want: []string{`unknown field "bogus"`, `clientConnection.burst: invalid value "many"`}},
		{name: "the config.conf of a ConfigMap", args: []string{"config", "check", "-"}, stdin: configMap,
			want: []string{"config.conf of ConfigMap kube-system/kube-proxy", `duplicate field "mode"`, `unknown field "conntrack.maxPerCpu"`}},
		{name: "a ConfigMap without config.conf", args: []string{"config", "check", "-"},
			stdin: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: ns}\ndata:\n  other: x\n",
			want:  []string{"ConfigMap ns/x has no config.conf key (keys: other)"}},
		{name: "missing file", args: []string{"config", "check", filepath.Join(t.TempDir(), "absent.yaml")},
			want: []string{"no such file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := sluiceWithStdin(t, tt.stdin, tt.args...)
			if code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			for _, want := range tt.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stdout, "OK") {
				t.Errorf("stdout says OK:\n%s", stdout)
			}
		})
	}
}

func TestConfigCheckPrintsTheSettingsOfACleanFile(t *testing.T) {
	clean := configHeader + `mode: nftables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
nftables:
  syncPeriod: 20s
  minSyncPeriod: 2s
healthzBindAddress: 0.0.0.0:10256
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
`
	for name, args := range map[string][]string{
		"file":  {"config", "check", writeFile(t, clean)},
		"stdin": {"config", "check", "-"},
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := sluiceWithStdin(t, clean, args...)
			if code != 0 {
				t.Fatalf("exit code %d: %s", code, stderr)
			}
			for _, want := range []string{
				"OK (strict decoding and validation pass)",
				"mode                  nftables",
				"syncPeriod            20s",
				"minSyncPeriod         2s",
				"detectLocalMode       ClusterCIDR (10.244.0.0/16, fd00:10:244::/56)",
				"nodePortAddresses     primary",
				"healthzBindAddress    0.0.0.0:10256",
				"metricsBindAddress    127.0.0.1:10249",
				"conntrack             nf_conntrack_max left alone, tcpEstablishedTimeout 2h0m0s, tcpCloseWaitTimeout 1h0m0s",
				"oomScoreAdj           -999",
			} {
				if !strings.Contains(stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, stdout)
				}
			}
		})
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}
