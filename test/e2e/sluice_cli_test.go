//go:build e2e

package e2e

// The sluice command line as an operator meets it: bad configuration fails fast with the
// field named, --write-config-to writes a file sluice loads again, --help lists
// kube-proxy's flags. No control plane: none of this may need one.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runSluice runs the sluice binary with args to completion (at most 30s) and returns its
// exit code, stdout and stderr.
func runSluice(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBinary(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running sluice %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("sluice %v did not exit within 30s; stderr:\n%s", args, errOut.String())
	}
	if strings.Contains(errOut.String(), raceReport) {
		t.Errorf("the race detector found a data race in sluice %v:\n%s", args, raceReports(errOut.String()))
	}
	return code, out.String(), errOut.String()
}

func TestSluiceRejectsBadConfiguration(t *testing.T) {
	const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	// No kubeconfig exists: sluice must fail on the configuration before it tries to
	// reach any API server.
	for _, tc := range []struct {
		name, config, wantInStderr string
	}{
		{"unknown mode", "mode: fastest\n", "mode"},
		{"value out of range", "mode: iptables\niptables:\n  masqueradeBit: 40\n", "iptables.masqueradeBit"},
		{"minSyncPeriod above syncPeriod", "mode: iptables\niptables:\n  syncPeriod: 1s\n  minSyncPeriod: 5s\n", "iptables.minSyncPeriod"},
		{"invalid address", "mode: iptables\nmetricsBindAddress: not-an-address\n", "metricsBindAddress"},
		{"invalid CIDR", "mode: iptables\nnodePortAddresses: [\"10.0.0.0/33\"]\n", "nodePortAddresses[0]"},
		{"wrong type", "mode: iptables\niptables:\n  masqueradeBit: fourteen\n", "masqueradeBit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			config := header + tc.config + "clientConnection:\n  kubeconfig: /nonexistent/kubeconfig\n"
			if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := runSluice(t, "--config", path)
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tc.wantInStderr) {
				t.Errorf("stderr does not name %s:\n%s", tc.wantInStderr, stderr)
			}
		})
	}

	t.Run("invalid flag value", func(t *testing.T) {
		code, _, stderr := runSluice(t, "--proxy-mode", "fastest", "--kubeconfig", "/nonexistent")
		if code != 1 || !strings.Contains(stderr, "mode") {
			t.Errorf("exit code %d, stderr:\n%s", code, stderr)
		}
	})
	t.Run("missing config file", func(t *testing.T) {
		code, _, stderr := runSluice(t, "--config", filepath.Join(t.TempDir(), "missing.yaml"))
		if code != 1 || !strings.Contains(stderr, "missing.yaml") {
			t.Errorf("exit code %d, stderr:\n%s", code, stderr)
		}
	})
}

// Unknown and duplicated fields no longer stop the daemon (issue 10: it starts where
// upstream kube-proxy starts, with a warning naming the field); `sluice config check` is
// where they are refused.
func TestSluiceStartsWithUnknownFieldsAndConfigCheckRefusesThem(t *testing.T) {
	const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name, config, field string
	}{
		{"unknown field", "mode: iptables\nbogusField: 1\n", `"bogusField"`},
		{"unknown nested field", "mode: iptables\niptables:\n  syncPeriod: 30s\n  unknownInner: x\n", `"iptables.unknownInner"`},
		{"misspelt field", "mode: iptables\nnodePortAddress: [\"10.0.0.0/8\"]\n", `"nodePortAddress"`},
		{"duplicated field", "mode: iptables\nmode: nftables\n", `"mode"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			config := header + tc.config + "clientConnection:\n  kubeconfig: /nonexistent/kubeconfig\n"
			if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			// The daemon gets past the configuration (and stops at the missing kubeconfig),
			// having logged the field. The recording backend keeps it from touching the
			// machine's sysctls should it ever get further.
			code, _, stderr := runSluice(t, "--config", path, "--backend", "recording")
			if code != 1 || !strings.Contains(stderr, "/nonexistent/kubeconfig") {
				t.Errorf("exit code %d, want 1 for the missing kubeconfig; stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, "field="+tc.field) {
				t.Errorf("stderr does not name %s:\n%s", tc.field, stderr)
			}
			code, _, stderr = runSluice(t, "config", "check", path)
			if code != 1 || !strings.Contains(stderr, tc.field) {
				t.Errorf("config check: exit code %d, stderr:\n%s", code, stderr)
			}
		})
	}
}

func TestSluiceWritesALoadableConfig(t *testing.T) {
	dir := t.TempDir()
	first := filepath.Join(dir, "first.yaml")
	code, _, stderr := runSluice(t, "--write-config-to", first, "--proxy-mode", "nftables", "--cluster-cidr", "10.244.0.0/16", "--nodeport-addresses", "primary")
	if code != 0 {
		t.Fatalf("--write-config-to: exit code %d; stderr:\n%s", code, stderr)
	}
	written, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: KubeProxyConfiguration", "apiVersion: kubeproxy.config.k8s.io/v1alpha1", "mode: nftables", "clusterCIDR: 10.244.0.0/16", "- primary"} {
		if !strings.Contains(string(written), want) {
			t.Errorf("written configuration lacks %q:\n%s", want, written)
		}
	}

	// sluice loads what it wrote (strictly, with validation), and writes it back unchanged.
	second := filepath.Join(dir, "second.yaml")
	code, _, stderr = runSluice(t, "--config", first, "--write-config-to", second)
	if code != 0 {
		t.Fatalf("loading the written configuration: exit code %d; stderr:\n%s", code, stderr)
	}
	again, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, again) {
		t.Errorf("the configuration changed on a round trip:\n%s\n---\n%s", written, again)
	}
}

func TestSluiceHelpListsUpstreamFlags(t *testing.T) {
	code, stdout, stderr := runSluice(t, "--help")
	if code != 0 {
		t.Fatalf("--help: exit code %d; stderr:\n%s", code, stderr)
	}
	// kube-proxy v1.37's Linux flags (deprecated ones are hidden from help, as upstream).
	for _, flag := range []string{
		"config", "write-config-to", "cleanup", "init-only", "feature-gates",
		"kubeconfig", "master", "kube-api-content-type", "kube-api-burst", "kube-api-qps",
		"hostname-override", "bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail",
		"profiling", "show-hidden-metrics-for-version", "proxy-mode", "config-sync-period",
		"iptables-masquerade-bit", "masquerade-all", "iptables-localhost-nodeports", "iptables-sync-period", "iptables-min-sync-period",
		"ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp",
		"ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout",
		"detect-local-mode", "pod-bridge-interface", "pod-interface-name-prefix", "cluster-cidr",
		"nodeport-addresses", "oom-score-adj",
		"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait",
		"conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream",
		"logging-format", "log-flush-frequency", "v", "vmodule", "version",
	} {
		if !strings.Contains(stdout, "--"+flag+" ") {
			t.Errorf("--help does not list --%s", flag)
		}
	}
	// The deprecated port flags are still accepted.
	code, _, stderr = runSluice(t, "--healthz-port", "10256", "--metrics-port", "10249", "--write-config-to", filepath.Join(t.TempDir(), "c.yaml"))
	if code != 0 {
		t.Errorf("deprecated port flags: exit code %d; stderr:\n%s", code, stderr)
	}
}
