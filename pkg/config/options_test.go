package config

import (
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/test/errtest"
)

// complete parses args as sluice's command line and completes the options. The OS
// hostname is "Test-Host".
func complete(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	o.osHostname = func() (string, error) { return "Test-Host", nil }
	fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, o.Complete(fs)
}

func mustComplete(t *testing.T, args ...string) *Options {
	t.Helper()
	o, err := complete(t, args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o
}

func TestFlagDefaultsEqualFileDefaults(t *testing.T) {
	fromFlags := mustComplete(t)
	fromFile := mustComplete(t, "--config", writeConfig(t, ""))
	if !equalConfigs(fromFlags.Config, fromFile.Config) {
		a, _ := Encode(fromFlags.Config)
		b, _ := Encode(fromFile.Config)
		t.Errorf("no flags and an empty file differ:\nflags:\n%s\nfile:\n%s", a, b)
	}
	if !fromFlags.Effective.ModeDefaulted || fromFlags.Effective.Mode != dataplane.ModeIPTables {
		t.Errorf("mode %q defaulted=%v, want iptables defaulted", fromFlags.Effective.Mode, fromFlags.Effective.ModeDefaulted)
	}
}

func TestConfigFileReplacesConfigurationFlags(t *testing.T) {
	path := writeConfig(t, `
mode: nftables
hostnameOverride: File-Host
clusterCIDR: 10.244.0.0/16
nftables:
  syncPeriod: 20s
logging:
  verbosity: 2
  vmodule:
  - filePattern: file
    verbosity: 1
`)
	o := mustComplete(t, "--config", path,
		"--proxy-mode=iptables", "--iptables-sync-period=5s", "--cluster-cidr=10.0.0.0/8",
		"--masquerade-all", "--kube-api-qps=50", "--bind-address=10.1.1.1",
		"-v=5", "--vmodule=flag=3",
		"--hostname-override", "  Flag-Host ",
		"--master", "https://api.example:6443",
		"--feature-gates=KubeProxyIPVS=false")

	e := o.Effective
	if e.Mode != dataplane.ModeNFTables || e.SyncPeriod != 20*time.Second || e.MasqueradeAll ||
		o.Config.ClientConnection.QPS != 5 || o.Config.BindAddress != "0.0.0.0" ||
		e.ClusterCIDRs[0].String() != "10.244.0.0/16" || !o.FeatureGates.Enabled(KubeProxyIPVS) {
		t.Errorf("configuration flags leaked through --config: %+v", e)
	}
	// Logging flags win over the file; vmodule entries from flags come first.
	if o.Config.Logging.Verbosity != 5 {
		t.Errorf("verbosity = %d, want 5 from -v", o.Config.Logging.Verbosity)
	}
	var vmodule []string
	for _, item := range o.Config.Logging.VModule {
		vmodule = append(vmodule, item.FilePattern)
	}
	if !slices.Equal(vmodule, []string{"flag", "file"}) {
		t.Errorf("vmodule = %q, want flag's entry then file's", vmodule)
	}
	// --hostname-override wins, trimmed and lowercased; --master still applies.
	if e.NodeName != "flag-host" || o.Config.HostnameOverride != "flag-host" || o.Master != "https://api.example:6443" {
		t.Errorf("node %q override %q master %q", e.NodeName, o.Config.HostnameOverride, o.Master)
	}
	wantIgnored := []string{"--bind-address", "--cluster-cidr", "--feature-gates", "--iptables-sync-period", "--kube-api-qps", "--masquerade-all", "--proxy-mode"}
	if !slices.Equal(o.IgnoredFlags, wantIgnored) {
		t.Errorf("IgnoredFlags = %q, want %q", o.IgnoredFlags, wantIgnored)
	}
}

func TestLoggingFlagsOverFileKeepUnsetFileValues(t *testing.T) {
	// Registering logging flags on a configuration writes the flags' defaults into it;
	// a file's splitStream must survive that when only -v is given.
	path := writeConfig(t, `
featureGates:
  LoggingAlphaOptions: true
logging:
  options:
    text:
      splitStream: true
`)
	o := mustComplete(t, "--config", path, "-v=3")
	if !o.Config.Logging.Options.Text.SplitStream || o.Config.Logging.Verbosity != 3 {
		t.Errorf("logging = %+v", o.Config.Logging)
	}
}

func TestHostname(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		file    string
		want    string
		wantErr string
	}{
		{name: "OS hostname lowercased", want: "test-host"},
		{name: "file override trimmed and lowercased", file: "hostnameOverride: ' Node-B '\n", want: "node-b"},
		{name: "flag wins over the file", file: "hostnameOverride: node-b\n", args: []string{"--hostname-override=NODE-C"}, want: "node-c"},
		{name: "blank flag is an error", args: []string{"--hostname-override=   "}, wantErr: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append(args, "--config", writeConfig(t, tt.file))
			}
			o, err := complete(t, args...)
			if errtest.Want(t, err, tt.wantErr) {
				return
			}
			if o.Effective.NodeName != tt.want {
				t.Errorf("NodeName = %q, want %q", o.Effective.NodeName, tt.want)
			}
		})
	}
}

func TestSyncPeriodFlagsFollowTheMode(t *testing.T) {
	tests := []struct {
		name                      string
		args                      []string
		wantSync, wantMin         time.Duration
		wantSection               string
		wantSectionSync, wantMinS time.Duration
	}{
		{name: "iptables flags set iptables timing",
			args:     []string{"--proxy-mode=iptables", "--iptables-sync-period=10s", "--iptables-min-sync-period=2s"},
			wantSync: 10 * time.Second, wantMin: 2 * time.Second},
		{name: "iptables flags set nftables timing",
			args:     []string{"--proxy-mode=nftables", "--iptables-sync-period=10s", "--iptables-min-sync-period=2s"},
			wantSync: 10 * time.Second, wantMin: 2 * time.Second},
		{name: "iptables flags ignored in ipvs mode",
			args:     []string{"--proxy-mode=ipvs", "--iptables-sync-period=10s", "--iptables-min-sync-period=2s"},
			wantSync: 30 * time.Second, wantMin: 1 * time.Second},
		{name: "ipvs flags apply in ipvs mode",
			args:     []string{"--proxy-mode=ipvs", "--ipvs-sync-period=7s", "--ipvs-min-sync-period=0s"},
			wantSync: 7 * time.Second, wantMin: 0},
		{name: "ipvs flags ignored outside ipvs mode",
			args:     []string{"--proxy-mode=nftables", "--ipvs-sync-period=7s", "--ipvs-min-sync-period=3s"},
			wantSync: 30 * time.Second, wantMin: 1 * time.Second},
		{name: "flag path in ipvs mode keeps 1s minimum (upstream quirk)",
			args:     []string{"--proxy-mode=ipvs"},
			wantSync: 30 * time.Second, wantMin: 1 * time.Second},
		{name: "empty mode uses the iptables flags",
			args:     []string{"--iptables-sync-period=12s"},
			wantSync: 12 * time.Second, wantMin: 1 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := mustComplete(t, tt.args...)
			e := o.Effective
			if e.SyncPeriod != tt.wantSync || e.MinSyncPeriod != tt.wantMin {
				t.Errorf("sync %v min %v, want %v %v", e.SyncPeriod, e.MinSyncPeriod, tt.wantSync, tt.wantMin)
			}
			// The values live in the active section of the written configuration too.
			sync, minSync := activeSyncPeriods(o.Config)
			if sync != tt.wantSync || minSync != tt.wantMin {
				t.Errorf("active section holds %v/%v", sync, minSync)
			}
		})
	}
}

func TestSyncPeriodFlagsInFileModeAreIgnored(t *testing.T) {
	o := mustComplete(t, "--config", writeConfig(t, "mode: ipvs\n"), "--ipvs-sync-period=7s", "--ipvs-min-sync-period=3s")
	// The file path defaults ipvs.minSyncPeriod to 0, unlike the flag path.
	if o.Effective.SyncPeriod != 30*time.Second || o.Effective.MinSyncPeriod != 0 {
		t.Errorf("sync %v min %v, want 30s and 0", o.Effective.SyncPeriod, o.Effective.MinSyncPeriod)
	}
}

func TestMasqueradeFlagsFollowTheMode(t *testing.T) {
	nft := mustComplete(t, "--proxy-mode=nftables", "--masquerade-all", "--iptables-masquerade-bit=5")
	if !nft.Config.NFTables.MasqueradeAll || nft.Config.IPTables.MasqueradeAll || !nft.Effective.MasqueradeAll {
		t.Errorf("--masquerade-all in nftables mode: %+v %+v", nft.Config.NFTables, nft.Config.IPTables)
	}
	// There is no nftables flag for the bit: nftables keeps 14 (upstream quirk).
	if nft.Effective.MasqueradeBit != 14 || *nft.Config.IPTables.MasqueradeBit != 5 {
		t.Errorf("nftables masquerade bit = %d (iptables %d)", nft.Effective.MasqueradeBit, *nft.Config.IPTables.MasqueradeBit)
	}
	ipvs := mustComplete(t, "--proxy-mode=ipvs", "--masquerade-all", "--iptables-masquerade-bit=5")
	if !ipvs.Config.IPTables.MasqueradeAll || !ipvs.Effective.MasqueradeAll || ipvs.Effective.MasqueradeBit != 5 {
		t.Errorf("ipvs uses the iptables section: %+v", ipvs.Effective)
	}
}

func TestDeprecatedPortFlags(t *testing.T) {
	tests := []struct {
		name                     string
		args                     []string
		wantHealthz, wantMetrics string
	}{
		{name: "defaults", wantHealthz: "0.0.0.0:10256", wantMetrics: "127.0.0.1:10249"},
		{name: "port 0 disables the health server",
			args:        []string{"--healthz-port=0"},
			wantHealthz: "", wantMetrics: "127.0.0.1:10249"},
		{name: "port completes an address given without one",
			args:        []string{"--healthz-bind-address=10.0.0.1", "--healthz-port=1234", "--metrics-bind-address=::1", "--metrics-port=4321"},
			wantHealthz: "10.0.0.1:1234", wantMetrics: "[::1]:4321"},
		{name: "an address with a port keeps it",
			args:        []string{"--healthz-bind-address=10.0.0.1:80", "--healthz-port=1234"},
			wantHealthz: "10.0.0.1:80", wantMetrics: "127.0.0.1:10249"},
		{name: "empty address flag does not disable the server",
			args:        []string{"--healthz-bind-address="},
			wantHealthz: "0.0.0.0:10256", wantMetrics: "127.0.0.1:10249"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := mustComplete(t, tt.args...)
			if o.Effective.HealthzBindAddress != tt.wantHealthz || o.Effective.MetricsBindAddress != tt.wantMetrics {
				t.Errorf("healthz %q metrics %q, want %q %q", o.Effective.HealthzBindAddress, o.Effective.MetricsBindAddress, tt.wantHealthz, tt.wantMetrics)
			}
		})
	}
	// The metrics server cannot be disabled: upstream's validation requires its address,
	// so --metrics-port=0 is refused, naming the field.
	if _, err := complete(t, "--metrics-port=0"); err == nil || !strings.Contains(err.Error(), "metricsBindAddress") {
		t.Errorf("--metrics-port=0: error %v, want one naming metricsBindAddress", err)
	}
	// With --write-config-to the deprecated flags are not applied.
	o := mustComplete(t, "--write-config-to", filepath.Join(t.TempDir(), "out.yaml"), "--healthz-port=0")
	if o.Config.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("--healthz-port applied with --write-config-to: %q", o.Config.HealthzBindAddress)
	}
}

func TestConfigurationFromFlags(t *testing.T) {
	o := mustComplete(t,
		"--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16,fd00:244::/56",
		"--nodeport-addresses=primary,localhost", "--detect-local-mode=ClusterCIDR",
		"--kubeconfig=/etc/kubeconfig", "--kube-api-qps=20", "--kube-api-burst=40",
		"--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal", "--oom-score-adj=-500",
		"--ipvs-scheduler=lc", "--bind-address=192.168.1.10", "--profiling",
		"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true")
	e := o.Effective
	if len(e.ClusterCIDRs) != 2 || !slices.Equal(e.NodePortAddresses, []string{"primary", "localhost"}) ||
		e.ClientConnection.Kubeconfig != "/etc/kubeconfig" || e.ClientConnection.QPS != 20 || e.ClientConnection.Burst != 40 ||
		e.Conntrack.MaxPerCore != 0 || !e.Conntrack.TCPBeLiberal || e.OOMScoreAdj != -500 || e.IPVS.Scheduler != "lc" ||
		e.BindAddress.String() != "192.168.1.10" || !e.EnableProfiling ||
		!o.FeatureGates.Enabled(KubeProxyNFTablesLocalhostNodePorts) {
		t.Errorf("flags not applied: %+v", e)
	}
	if len(o.IgnoredFlags) != 0 {
		t.Errorf("IgnoredFlags without --config: %q", o.IgnoredFlags)
	}
}

func TestInvalidConfigurationNamesTheFields(t *testing.T) {
	_, err := complete(t, "--proxy-mode=userspace", "--iptables-masquerade-bit=40", "--oom-score-adj=5000")
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error %v is not a *ValidationError", err)
	}
	for _, want := range []string{"mode: Unsupported value: \"userspace\"", "iptables.masqueradeBit", "oomScoreAdj"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}

	_, err = complete(t, "--config", writeConfig(t, "iptables:\n  masqueradeBit: 99\n"))
	if !errors.As(err, &verr) || verr.Source == "" || !strings.Contains(err.Error(), "iptables.masqueradeBit") {
		t.Errorf("file error %v should name the file and the field", err)
	}

	_, err = complete(t, "--config", writeConfig(t, "iptables:\n  syncPeriod: often\n"))
	var derr *DecodeError
	if !errors.As(err, &derr) || !strings.Contains(err.Error(), "iptables.syncPeriod") {
		t.Errorf("decode error %v should name the field", err)
	}
}

// An unknown or duplicated field no longer stops sluice (issue 10: start where upstream
// starts): Complete succeeds and carries each field, by path, to the daemon, which reports
// it. `sluice config check` is where such a file is refused.
func TestUnknownAndDuplicateFieldsBecomeWarnings(t *testing.T) {
	o, err := complete(t, "--config", writeConfig(t, "mode: iptables\nmode: nftables\nnftables:\n  syncPerod: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []FieldWarning{{DuplicateField, "mode"}, {UnknownField, "nftables.syncPerod"}}
	if !slices.Equal(o.ConfigWarnings, want) {
		t.Errorf("ConfigWarnings %v, want %v", o.ConfigWarnings, want)
	}
	if o.Effective.Mode != "nftables" || o.Effective.SyncPeriod != DefaultSyncPeriod {
		t.Errorf("mode %s, sync period %v: the lenient decode's values are not in effect", o.Effective.Mode, o.Effective.SyncPeriod)
	}
}

func TestFlagValuesAreChecked(t *testing.T) {
	for _, args := range [][]string{
		{"--bind-address=node-1"},
		{"--healthz-bind-address=1.2.3.4:http"},
		{"--metrics-bind-address=localhost:10249"},
		{"--feature-gates=KubeProxyIPVS=maybe"},
	} {
		if _, err := complete(t, args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

func TestWriteConfigRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--proxy-mode=nftables", "--iptables-sync-period=10s", "--masquerade-all", "--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=localhost"},
		{"--proxy-mode=ipvs", "--ipvs-sync-period=20s", "--ipvs-exclude-cidrs=10.0.0.0/8", "-v=4", "--feature-gates=NFTablesNetlink=false"},
		{"--bind-address=fd00::10", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0", "--hostname-override=Node-A"},
	} {
		out := filepath.Join(t.TempDir(), "written.yaml")
		first := mustComplete(t, append(args, "--write-config-to", out)...)
		if err := WriteFile(out, first.Config); err != nil {
			t.Fatal(err)
		}
		second := mustComplete(t, "--config", out)
		if !equalConfigs(first.Config, second.Config) {
			a, _ := Encode(first.Config)
			b, _ := Encode(second.Config)
			t.Errorf("%q: written configuration loads back differently:\nwritten:\n%s\nloaded:\n%s", args, a, b)
		}
		if !effectiveEqual(first.Effective, second.Effective) {
			t.Errorf("%q: effective configuration differs:\n%+v\n%+v", args, first.Effective, second.Effective)
		}
		if second.Effective.ModeDefaulted {
			t.Errorf("%q: the written file must name the mode", args)
		}
	}
}

// effectiveEqual compares two views; a defaulted mode is written out explicitly, so only
// ModeDefaulted may differ.
func effectiveEqual(a, b *Effective) bool {
	x, y := *a, *b
	x.ModeDefaulted, y.ModeDefaulted = false, false
	return reflect.DeepEqual(x, y)
}

func TestLoggingFlagsRegistered(t *testing.T) {
	fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	for _, name := range []string{"v", "vmodule", "logging-format", logsapi.LogFlushFreqFlagName, "log-text-split-stream", "log-text-info-buffer-size"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s missing", name)
		}
	}
}
