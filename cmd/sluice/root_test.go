package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/version"
)

func TestMain(m *testing.M) {
	// Every test runs the command in this process, and each run applies the (same)
	// logging configuration again.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	os.Exit(m.Run())
}

// sluice runs the command line in-process and returns its exit code and output.
func sluice(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = execute(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHelpListsTheFlags(t *testing.T) {
	code, out, _ := sluice(t, "--help")
	if code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, flag := range []string{
		"--config", "--write-config-to", "--cleanup", "--init-only", "--feature-gates", "--kubeconfig", "--master",
		"--hostname-override", "--bind-address", "--healthz-bind-address", "--metrics-bind-address",
		"--proxy-mode", "--iptables-sync-period", "--iptables-min-sync-period", "--iptables-masquerade-bit",
		"--masquerade-all", "--ipvs-scheduler", "--ipvs-sync-period", "--detect-local-mode", "--cluster-cidr",
		"--nodeport-addresses", "--oom-score-adj", "--conntrack-max-per-core", "--conntrack-tcp-be-liberal",
		"--logging-format", "--log-flush-frequency", "--vmodule", "-v, --v", "--version",
		"KubeProxyIPVS=true|false",
	} {
		if !strings.Contains(out, flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
	// Deprecated flags work but are not advertised.
	if strings.Contains(out, "--healthz-port int32") {
		t.Errorf("--help lists the deprecated --healthz-port")
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, _ := sluice(t, args...)
		if code != 0 || strings.TrimSpace(out) != "sluice "+version.Version {
			t.Errorf("%q: exit %d, output %q", args, code, out)
		}
	}
}

func TestBadConfigurationExitsOneNamingTheField(t *testing.T) {
	header := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "value of the wrong type in the file",
			args: []string{"--config", writeFile(t, header+"iptables:\n  syncPeriod: often\n")},
			want: `iptables.syncPeriod: invalid value "often"`},
		{name: "invalid value in the file",
			args: []string{"--config", writeFile(t, header+"mode: nftables\nnftables:\n  masqueradeBit: 40\n")},
			want: "nftables.masqueradeBit: Invalid value: 40"},
		{name: "wrong kind",
			args: []string{"--config", writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")},
			want: `kind: unsupported value "KubeletConfiguration"`},
		{name: "missing file",
			args: []string{"--config", filepath.Join(t.TempDir(), "absent.yaml")},
			want: "no such file"},
		{name: "invalid flags",
			args: []string{"--proxy-mode=userspace"},
			want: `mode: Unsupported value: "userspace"`},
		{name: "invalid configuration is not written",
			args: []string{"--write-config-to", filepath.Join(t.TempDir(), "out.yaml"), "--oom-score-adj=2000"},
			want: "oomScoreAdj"},
		{name: "unknown flag",
			args: []string{"--iptables-sync-perod=1s"},
			want: "unknown flag"},
		{name: "locked feature gate",
			args: []string{"--feature-gates=MultiCIDRServiceAllocator=false"},
			want: "locked to true"},
		{name: "stray argument",
			args: []string{"nftables"},
			want: "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := sluice(t, tt.args...)
			if code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not mention %q", stderr, tt.want)
			}
		})
	}
}

// A gate upstream knows from the rest of Kubernetes (or one nobody knows) does not stop
// sluice: it starts where upstream starts, and says which gates it ignored.
func TestUnknownFeatureGateIsAWarning(t *testing.T) {
	var logs, stdout, stderr bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs))))
	out := filepath.Join(t.TempDir(), "sluice.yaml")
	code := execute(ctx, []string{"--write-config-to", out, "--feature-gates=InPlacePodVerticalScaling=true,NFTablesNetlink=false"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	if !strings.Contains(logs.String(), "ignoring InPlacePodVerticalScaling") {
		t.Errorf("log %q does not warn about the ignored gate", logs.String())
	}
}

// An unknown or duplicated field in --config does not stop sluice any more (issue 10: the
// drop-in starts where upstream kube-proxy starts); each one is logged as an error naming
// its path. `sluice config check` keeps the strict assertions (config_test.go).
func TestUnknownAndDuplicateFieldsAreLoggedNotFatal(t *testing.T) {
	header := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	var logs, stdout, stderr bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs))))
	in := writeFile(t, header+"mode: iptables\nmode: nftables\nnftables:\n  syncPerod: 10s\n")
	out := filepath.Join(t.TempDir(), "sluice.yaml")
	code := execute(ctx, []string{"--config", in, "--write-config-to", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	for _, want := range []string{`"Unknown configuration field ignored`, `field="nftables.syncPerod"`, `field="mode"`, "the last value is used"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	cfg, err := config.LoadFile(out)
	if err != nil || cfg.Mode != "nftables" {
		t.Errorf("written configuration: %v %+v", err, cfg)
	}
}

func TestWriteConfigToExitsZeroAndLoadsBack(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sluice.yaml")
	code, _, stderr := sluice(t, "--write-config-to", out, "--proxy-mode=nftables", "--iptables-sync-period=10s", "--cluster-cidr=10.244.0.0/16")
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	cfg, err := config.LoadFile(out)
	if err != nil {
		t.Fatalf("written file does not load: %v", err)
	}
	if cfg.Mode != "nftables" || cfg.NFTables.SyncPeriod.Duration.String() != "10s" || cfg.ClusterCIDR != "10.244.0.0/16" ||
		len(cfg.NodePortAddresses) != 1 || cfg.NodePortAddresses[0] != "primary" {
		t.Errorf("written configuration: %+v", cfg)
	}

	// Writing what a file says also works, and gives the file's effective configuration.
	again := filepath.Join(t.TempDir(), "again.yaml")
	if code, _, stderr := sluice(t, "--config", out, "--write-config-to", again); code != 0 {
		t.Fatalf("re-writing: exit %d: %s", code, stderr)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Errorf("writing the written configuration changed it:\n%s\n---\n%s", a, b)
	}
}

func TestUnderscoreFlagNamesAreAccepted(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sluice.yaml")
	if code, _, stderr := sluice(t, "--write-config-to", out, "--iptables_sync_period=12s"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	cfg, err := config.LoadFile(out)
	if err != nil || cfg.IPTables.SyncPeriod.Duration.String() != "12s" {
		t.Errorf("--iptables_sync_period not applied: %v %+v", err, cfg)
	}
}
