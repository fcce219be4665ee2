package config

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

// Each default below is upstream's value at v1.37 (pkg/proxy/apis/config/v1alpha1
// defaults.go and cmd/kube-proxy/app/server_linux.go), written out literally rather than
// through our constants, so that a wrong constant cannot hide itself.
func TestSetDefaultsMatchesUpstream(t *testing.T) {
	cfg := &v1alpha1.KubeProxyConfiguration{}
	SetDefaults(cfg)
	modeDefaulted := ApplyPlatformDefaults(cfg)

	checks := []struct {
		field string
		got   any
		want  any
	}{
		{"featureGates", len(cfg.FeatureGates) == 0 && cfg.FeatureGates != nil, true},
		{"clientConnection.kubeconfig", cfg.ClientConnection.Kubeconfig, ""},
		{"clientConnection.acceptContentTypes", cfg.ClientConnection.AcceptContentTypes, ""},
		{"clientConnection.contentType", cfg.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
		{"clientConnection.qps", cfg.ClientConnection.QPS, float32(5)},
		{"clientConnection.burst", cfg.ClientConnection.Burst, int32(10)},
		{"logging.format", cfg.Logging.Format, "text"},
		{"logging.flushFrequency", cfg.Logging.FlushFrequency.Duration.Duration, 5 * time.Second},
		{"logging.verbosity", uint32(cfg.Logging.Verbosity), uint32(0)},
		{"logging.options.text.infoBufferSize", cfg.Logging.Options.Text.InfoBufferSize.Value(), int64(0)},
		{"logging.options.json.infoBufferSize", cfg.Logging.Options.JSON.InfoBufferSize.Value(), int64(0)},
		{"hostnameOverride", cfg.HostnameOverride, ""},
		{"bindAddress", cfg.BindAddress, "0.0.0.0"},
		{"healthzBindAddress", cfg.HealthzBindAddress, "0.0.0.0:10256"},
		{"metricsBindAddress", cfg.MetricsBindAddress, "127.0.0.1:10249"},
		{"bindAddressHardFail", cfg.BindAddressHardFail, false},
		{"enableProfiling", cfg.EnableProfiling, false},
		{"showHiddenMetricsForVersion", cfg.ShowHiddenMetricsForVersion, ""},
		{"mode", string(cfg.Mode), "iptables"},
		{"mode was defaulted", modeDefaulted, true},
		{"iptables.masqueradeBit", *cfg.IPTables.MasqueradeBit, int32(14)},
		{"iptables.masqueradeAll", cfg.IPTables.MasqueradeAll, false},
		{"iptables.localhostNodePorts", *cfg.IPTables.LocalhostNodePorts, true},
		{"iptables.syncPeriod", cfg.IPTables.SyncPeriod.Duration, 30 * time.Second},
		{"iptables.minSyncPeriod", cfg.IPTables.MinSyncPeriod.Duration, 1 * time.Second},
		{"ipvs.syncPeriod", cfg.IPVS.SyncPeriod.Duration, 30 * time.Second},
		{"ipvs.minSyncPeriod", cfg.IPVS.MinSyncPeriod.Duration, time.Duration(0)},
		{"ipvs.scheduler", cfg.IPVS.Scheduler, ""},
		{"ipvs.excludeCIDRs", cfg.IPVS.ExcludeCIDRs == nil, true},
		{"ipvs.strictARP", cfg.IPVS.StrictARP, false},
		{"ipvs.tcpTimeout", cfg.IPVS.TCPTimeout.Duration, time.Duration(0)},
		{"ipvs.tcpFinTimeout", cfg.IPVS.TCPFinTimeout.Duration, time.Duration(0)},
		{"ipvs.udpTimeout", cfg.IPVS.UDPTimeout.Duration, time.Duration(0)},
		{"nftables.masqueradeBit", *cfg.NFTables.MasqueradeBit, int32(14)},
		{"nftables.masqueradeAll", cfg.NFTables.MasqueradeAll, false},
		{"nftables.syncPeriod", cfg.NFTables.SyncPeriod.Duration, 30 * time.Second},
		{"nftables.minSyncPeriod", cfg.NFTables.MinSyncPeriod.Duration, 1 * time.Second},
		{"winkernel.rootHnsEndpointName", cfg.Winkernel.RootHnsEndpointName, ""},
		{"detectLocalMode", string(cfg.DetectLocalMode), "ClusterCIDR"},
		{"detectLocal.bridgeInterface", cfg.DetectLocal.BridgeInterface, ""},
		{"detectLocal.interfaceNamePrefix", cfg.DetectLocal.InterfaceNamePrefix, ""},
		{"clusterCIDR", cfg.ClusterCIDR, ""},
		{"nodePortAddresses (iptables mode)", cfg.NodePortAddresses == nil, true},
		{"oomScoreAdj", *cfg.OOMScoreAdj, int32(-999)},
		{"conntrack.maxPerCore", *cfg.Conntrack.MaxPerCore, int32(32768)},
		{"conntrack.min", *cfg.Conntrack.Min, int32(131072)},
		{"conntrack.tcpEstablishedTimeout", cfg.Conntrack.TCPEstablishedTimeout.Duration, 24 * time.Hour},
		{"conntrack.tcpCloseWaitTimeout", cfg.Conntrack.TCPCloseWaitTimeout.Duration, 1 * time.Hour},
		{"conntrack.tcpBeLiberal", cfg.Conntrack.TCPBeLiberal, false},
		{"conntrack.udpTimeout", cfg.Conntrack.UDPTimeout.Duration, time.Duration(0)},
		{"conntrack.udpStreamTimeout", cfg.Conntrack.UDPStreamTimeout.Duration, time.Duration(0)},
		{"configSyncPeriod", cfg.ConfigSyncPeriod.Duration, 15 * time.Minute},
		{"portRange", cfg.PortRange, ""},
		{"windowsRunAsService", cfg.WindowsRunAsService, false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v (%T), upstream default is %v (%T)", c.field, c.got, c.got, c.want, c.want)
		}
	}
}

func TestSetDefaultsServerAddresses(t *testing.T) {
	tests := []struct {
		name                    string
		bindAddress             string
		healthz, metrics        string
		wantHealthz, wantMetric string
	}{
		{name: "IPv4 bindAddress gives IPv4 defaults", bindAddress: "10.1.2.3",
			wantHealthz: "0.0.0.0:10256", wantMetric: "127.0.0.1:10249"},
		{name: "IPv6 bindAddress gives IPv6 defaults", bindAddress: "fd00::1",
			wantHealthz: "[::]:10256", wantMetric: "[::1]:10249"},
		{name: "unspecified IPv6 bindAddress gives IPv6 defaults", bindAddress: "::",
			wantHealthz: "[::]:10256", wantMetric: "[::1]:10249"},
		{name: "port appended to a bare IPv4 address", healthz: "10.0.0.1", metrics: "10.0.0.2",
			wantHealthz: "10.0.0.1:10256", wantMetric: "10.0.0.2:10249"},
		{name: "port appended to a bare IPv6 address", healthz: "fd00::1", metrics: "::",
			wantHealthz: "[fd00::1]:10256", wantMetric: "[::]:10249"},
		{name: "explicit ports kept", healthz: "10.0.0.1:1234", metrics: "[::1]:99",
			wantHealthz: "10.0.0.1:1234", wantMetric: "[::1]:99"},
		{name: "garbage left for validation", healthz: "not-an-ip", metrics: "also:not:ip",
			wantHealthz: "not-an-ip", wantMetric: "also:not:ip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &v1alpha1.KubeProxyConfiguration{BindAddress: tt.bindAddress, HealthzBindAddress: tt.healthz, MetricsBindAddress: tt.metrics}
			SetDefaults(cfg)
			if cfg.HealthzBindAddress != tt.wantHealthz || cfg.MetricsBindAddress != tt.wantMetric {
				t.Errorf("healthz, metrics = %q, %q; want %q, %q", cfg.HealthzBindAddress, cfg.MetricsBindAddress, tt.wantHealthz, tt.wantMetric)
			}
		})
	}
}

func TestSetDefaultsTreatsZeroAsUnsetButKeepsExplicitValues(t *testing.T) {
	cfg := &v1alpha1.KubeProxyConfiguration{
		IPTables:    v1alpha1.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](0), LocalhostNodePorts: ptr.To(false)},
		OOMScoreAdj: ptr.To[int32](0),
		Conntrack:   v1alpha1.KubeProxyConntrackConfiguration{MaxPerCore: ptr.To[int32](0), TCPEstablishedTimeout: &metav1.Duration{}},
	}
	SetDefaults(cfg)
	// Zero values of plain fields mean "unset" ...
	if cfg.ClientConnection.Burst != 10 || cfg.ClientConnection.QPS != 5 || cfg.ConfigSyncPeriod.Duration != 15*time.Minute {
		t.Errorf("zero burst/qps/configSyncPeriod not defaulted: %+v, %v", cfg.ClientConnection, cfg.ConfigSyncPeriod)
	}
	// ... but a pointer set to zero is an explicit value.
	if *cfg.IPTables.MasqueradeBit != 0 || *cfg.IPTables.LocalhostNodePorts || *cfg.OOMScoreAdj != 0 ||
		*cfg.Conntrack.MaxPerCore != 0 || cfg.Conntrack.TCPEstablishedTimeout.Duration != 0 {
		t.Errorf("explicit zero pointers were overwritten: %+v %+v oom=%d", cfg.IPTables, cfg.Conntrack, *cfg.OOMScoreAdj)
	}

	again := cfg.DeepCopy()
	SetDefaults(again)
	if !equalConfigs(cfg, again) {
		t.Errorf("SetDefaults is not idempotent")
	}
}

func TestApplyPlatformDefaults(t *testing.T) {
	tests := []struct {
		name              string
		in                v1alpha1.KubeProxyConfiguration
		wantMode          string
		wantDefaulted     bool
		wantNodePortAddrs []string
		wantDetectLocal   string
	}{
		{name: "empty mode becomes iptables and is reported",
			wantMode: "iptables", wantDefaulted: true, wantDetectLocal: "ClusterCIDR"},
		{name: "nftables without nodePortAddresses gets primary",
			in:       v1alpha1.KubeProxyConfiguration{Mode: "nftables"},
			wantMode: "nftables", wantNodePortAddrs: []string{"primary"}, wantDetectLocal: "ClusterCIDR"},
		{name: "nftables keeps explicit nodePortAddresses",
			in:       v1alpha1.KubeProxyConfiguration{Mode: "nftables", NodePortAddresses: []string{"10.0.0.0/8"}},
			wantMode: "nftables", wantNodePortAddrs: []string{"10.0.0.0/8"}, wantDetectLocal: "ClusterCIDR"},
		{name: "ipvs leaves nodePortAddresses unset",
			in:       v1alpha1.KubeProxyConfiguration{Mode: "ipvs"},
			wantMode: "ipvs", wantDetectLocal: "ClusterCIDR"},
		{name: "explicit detectLocalMode kept",
			in:       v1alpha1.KubeProxyConfiguration{Mode: "iptables", DetectLocalMode: "NodeCIDR"},
			wantMode: "iptables", wantDetectLocal: "NodeCIDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.in.DeepCopy()
			defaulted := ApplyPlatformDefaults(cfg)
			if string(cfg.Mode) != tt.wantMode || defaulted != tt.wantDefaulted || string(cfg.DetectLocalMode) != tt.wantDetectLocal {
				t.Errorf("mode=%q defaulted=%v detectLocalMode=%q; want %q %v %q", cfg.Mode, defaulted, cfg.DetectLocalMode, tt.wantMode, tt.wantDefaulted, tt.wantDetectLocal)
			}
			if !equalStrings(cfg.NodePortAddresses, tt.wantNodePortAddrs) {
				t.Errorf("nodePortAddresses = %q, want %q", cfg.NodePortAddresses, tt.wantNodePortAddrs)
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
