package config

import (
	"net"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// Upstream's default values (pkg/proxy/apis/config/v1alpha1/defaults.go at v1.37, plus the
// ports of pkg/cluster/ports and qos.KubeProxyOOMScoreAdj).
const (
	DefaultBindAddress           = "0.0.0.0"
	DefaultHealthzPort           = 10256
	DefaultMetricsPort           = 10249
	DefaultOOMScoreAdj           = -999
	DefaultMasqueradeBit         = 14
	DefaultSyncPeriod            = 30 * time.Second
	DefaultMinSyncPeriod         = 1 * time.Second
	DefaultConfigSyncPeriod      = 15 * time.Minute
	DefaultConntrackMaxPerCore   = 32 * 1024
	DefaultConntrackMin          = 128 * 1024
	DefaultTCPEstablishedTimeout = 24 * time.Hour
	DefaultTCPCloseWaitTimeout   = 1 * time.Hour
	DefaultContentType           = "application/vnd.kubernetes.protobuf"
	DefaultQPS                   = 5.0
	DefaultBurst                 = 10
	DefaultIPVSScheduler         = "rr"
)

// nodePortAddresses keywords, expanded per family by Effective.NodePortAddressesFor.
const (
	// NodePortAddressesPrimary stands for the node's primary IP of each family.
	NodePortAddressesPrimary = "primary"
	// NodePortAddressesLocalhost stands for 127.0.0.0/8 and ::1/128.
	NodePortAddressesLocalhost = "localhost"
	// NodePortAddressesAll stands for every local address (0.0.0.0/0 and ::/0).
	NodePortAddressesAll = "all"
)

// SetDefaults fills the fields of cfg that are unset with upstream's defaults, the way
// upstream's scheme defaulting does. "Unset" means what it means there: nil pointers and
// maps, empty strings, and zero durations and numbers, so an explicit `syncPeriod: 0s`,
// `burst: 0` or `qps: 0` (as kubeadm writes them) also gets the default.
//
// Two addresses depend on bindAddress: healthzBindAddress defaults to 0.0.0.0:10256 or
// [::]:10256 and metricsBindAddress to 127.0.0.1:10249 or [::1]:10249, by bindAddress's
// family; an address given without a port gets the default port appended.
//
// mode, nodePortAddresses and detectLocalMode are left alone: upstream defaults them only
// after merging flags (see ApplyPlatformDefaults). SetDefaults is idempotent.
func SetDefaults(cfg *v1alpha1.KubeProxyConfiguration) {
	if cfg.BindAddress == "" {
		cfg.BindAddress = DefaultBindAddress
	}
	healthzHost, metricsHost := defaultServerHosts(cfg.BindAddress)
	if cfg.HealthzBindAddress == "" {
		cfg.HealthzBindAddress = net.JoinHostPort(healthzHost, strconv.Itoa(DefaultHealthzPort))
	} else {
		cfg.HealthzBindAddress = appendPortIfNeeded(cfg.HealthzBindAddress, DefaultHealthzPort)
	}
	if cfg.MetricsBindAddress == "" {
		cfg.MetricsBindAddress = net.JoinHostPort(metricsHost, strconv.Itoa(DefaultMetricsPort))
	} else {
		cfg.MetricsBindAddress = appendPortIfNeeded(cfg.MetricsBindAddress, DefaultMetricsPort)
	}

	if cfg.OOMScoreAdj == nil {
		cfg.OOMScoreAdj = ptr.To[int32](DefaultOOMScoreAdj)
	}

	defaultDuration(&cfg.IPTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.IPTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if cfg.IPTables.LocalhostNodePorts == nil {
		cfg.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	if cfg.IPTables.MasqueradeBit == nil {
		cfg.IPTables.MasqueradeBit = ptr.To[int32](DefaultMasqueradeBit)
	}
	// ipvs.minSyncPeriod has no default: 0 means "sync on every change".
	defaultDuration(&cfg.IPVS.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.NFTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&cfg.NFTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if cfg.NFTables.MasqueradeBit == nil {
		cfg.NFTables.MasqueradeBit = ptr.To[int32](DefaultMasqueradeBit)
	}

	if cfg.Conntrack.MaxPerCore == nil {
		cfg.Conntrack.MaxPerCore = ptr.To[int32](DefaultConntrackMaxPerCore)
	}
	if cfg.Conntrack.Min == nil {
		cfg.Conntrack.Min = ptr.To[int32](DefaultConntrackMin)
	}
	if cfg.Conntrack.TCPEstablishedTimeout == nil {
		cfg.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: DefaultTCPEstablishedTimeout}
	}
	if cfg.Conntrack.TCPCloseWaitTimeout == nil {
		// Shorter than the kernel's CLOSE_WAIT default would let a half-closed NATed
		// connection lose its entry while the server still holds it; an hour matches
		// common server timeouts (upstream issue 32551).
		cfg.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: DefaultTCPCloseWaitTimeout}
	}
	defaultDuration(&cfg.ConfigSyncPeriod, DefaultConfigSyncPeriod)

	if cfg.ClientConnection.ContentType == "" {
		cfg.ClientConnection.ContentType = DefaultContentType
	}
	if cfg.ClientConnection.QPS == 0 {
		cfg.ClientConnection.QPS = DefaultQPS
	}
	if cfg.ClientConnection.Burst == 0 {
		cfg.ClientConnection.Burst = DefaultBurst
	}
	if cfg.FeatureGates == nil {
		cfg.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&cfg.Logging)
}

// ApplyPlatformDefaults applies the defaults upstream's Linux build sets after merging
// flags (cmd/kube-proxy/app/server_linux.go): an empty mode becomes iptables, nftables mode
// without nodePortAddresses gets ["primary"], and an empty detectLocalMode becomes
// ClusterCIDR. It reports whether the mode was defaulted, which upstream warns about
// (the default becomes nftables in 1.40).
func ApplyPlatformDefaults(cfg *v1alpha1.KubeProxyConfiguration) (modeDefaulted bool) {
	if cfg.Mode == "" {
		cfg.Mode = v1alpha1.ProxyMode(dataplane.ModeIPTables)
		modeDefaulted = true
	}
	if cfg.Mode == v1alpha1.ProxyMode(dataplane.ModeNFTables) && len(cfg.NodePortAddresses) == 0 {
		cfg.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	if cfg.DetectLocalMode == "" {
		cfg.DetectLocalMode = v1alpha1.LocalMode(dataplane.DetectLocalClusterCIDR)
	}
	return modeDefaulted
}

// NewDefaultConfiguration returns a configuration with every default applied, the one an
// empty file or a command line without flags produces (mode iptables).
func NewDefaultConfiguration() *v1alpha1.KubeProxyConfiguration {
	cfg := &v1alpha1.KubeProxyConfiguration{}
	SetDefaults(cfg)
	ApplyPlatformDefaults(cfg)
	return cfg
}

func defaultDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// defaultServerHosts picks the health and metrics servers' default hosts by the family of
// bindAddress: anything that is not an IPv4 address (even an unparsable one) counts as
// IPv6, as upstream decides.
func defaultServerHosts(bindAddress string) (healthz, metrics string) {
	if ip := netutils.ParseIPSloppy(bindAddress); ip != nil && ip.To4() != nil {
		return "0.0.0.0", "127.0.0.1"
	}
	return "::", "::1"
}

// appendPortIfNeeded turns a bare IP into IP:port; anything else (already IP:port, or
// invalid and left for validation to report) is returned unchanged.
func appendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if netutils.ParseIPSloppy(addr) == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(port))
}
