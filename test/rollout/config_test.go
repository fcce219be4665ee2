//go:build e2e

package rollout

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lenientConfig turns a clean configuration for mode into one upstream kube-proxy v1.37
// starts with only after its lenient fallback: an unknown top-level field, an unknown field
// in the nftables section, and mode given twice (first the other mode, then mode: the last
// one wins). It returns the configuration and the paths that must be reported.
func lenientConfig(t *testing.T, clean, mode string) (string, []string) {
	t.Helper()
	other := map[string]string{"iptables": "nftables", "nftables": "iptables"}[mode]
	cfg := strings.Replace(clean, "\nmode: "+mode+"\n", "\nmode: "+other+"\n", 1)
	cfg = strings.Replace(cfg, "\nnftables:\n", "\nnftables:\n  syncPerod: 5s\n", 1)
	cfg += "bogusField: true\nmode: " + mode + "\n"
	if cfg == clean+"bogusField: true\nmode: "+mode+"\n" {
		t.Fatalf("the configuration's layout changed; lenientConfig did not edit it:\n%s", clean)
	}
	return cfg, []string{"mode", "nftables.syncPerod", "bogusField"}
}

// (a) A configuration with unknown fields and a duplicated key starts sluice, as it starts
// upstream kube-proxy, and every such field is reported by its path: an error log line, a
// Warning Event on the Node and sluice_config_warnings. The last of the duplicated values
// is the one in effect, and Services are served.
func TestUnknownAndDuplicateFieldsStartServeAndWarn(t *testing.T) {
	env := NewEnv(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			node := env.RegisterNode(t, nodeName("lenient", mode), NodeOptions{PodCIDRs: true})
			cfg, paths := lenientConfig(t, env.Config(t, node, mode, nil), mode)
			s := env.StartSluice(t, SluiceOptions{Node: node, Config: cfg})
			s.WaitLivez(t, convergeTimeout)
			s.WaitSynced(t)

			svc := env.EchoService(t, node)
			env.ExpectServed(t, s, svc)

			if code, body, err := s.Get(metricsPort, "/proxyMode"); err != nil || code != 200 || body != mode {
				t.Errorf("/proxyMode: %d %q %v, want %s (the last of the duplicated values)", code, body, err, mode)
			}
			s.WaitLog(t, `"Unknown configuration field ignored`, `field="bogusField"`, `field="nftables.syncPerod"`,
				`"Configuration field set more than once, the last value is used`, `field="mode"`)
			s.WaitMetric(t, "sluice_config_warnings", 2, "kind", "unknown_field")
			s.WaitMetric(t, "sluice_config_warnings", 1, "kind", "duplicate_field")
			ev := env.WaitNodeEvent(t, node, "ConfigurationWarning")
			for _, p := range paths {
				if !strings.Contains(ev.Note, `"`+p+`"`) {
					t.Errorf("the Event does not name %s: %s", p, ev.Note)
				}
			}
			t.Logf("Event %s: %s", ev.Reason, ev.Note)
		})
	}
}

// (b) `sluice config check` refuses that same file, naming each field, and passes a clean
// one, printing its key settings.
func TestConfigCheckIsTheStrictGate(t *testing.T) {
	dir := t.TempDir()
	clean := `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/48
nftables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
`
	bad, paths := lenientConfig(t, clean, "nftables")
	for name, tc := range map[string]struct {
		content  string
		wantCode int
		want     []string
	}{
		"lenient": {content: bad, wantCode: 1, want: append([]string{"3 problem(s)"}, paths...)},
		"clean": {content: clean, wantCode: 0, want: []string{"OK (strict decoding and validation pass)", "mode                  nftables",
			"detectLocalMode       ClusterCIDR (10.244.0.0/16, fd00:10:244::/48)", "minSyncPeriod         100ms"}},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".yaml")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Getenv("SLUICE_BIN"), "config", "check", path)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.WaitDelay = 10 * time.Second
			err := cmd.Run()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d:\n%s", code, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
