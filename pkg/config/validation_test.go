package config

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

// validConfig returns a defaulted configuration in the given mode.
func validConfig(mode string) *v1alpha1.KubeProxyConfiguration {
	cfg := &v1alpha1.KubeProxyConfiguration{Mode: v1alpha1.ProxyMode(mode)}
	SetDefaults(cfg)
	ApplyPlatformDefaults(cfg)
	return cfg
}

func TestValidateAcceptsDefaultsInEveryMode(t *testing.T) {
	for _, mode := range []string{"", "iptables", "nftables", "ipvs"} {
		if errs := Validate(validConfig(mode)); len(errs) > 0 {
			t.Errorf("mode %q: %v", mode, errs)
		}
	}
}

func TestValidateReportsEveryInvalidField(t *testing.T) {
	tests := []struct {
		name   string
		mode   string
		modify func(*v1alpha1.KubeProxyConfiguration)
		// want maps each field path to a fragment of its message.
		want map[string]string
	}{
		{
			name: "several invalid fields are reported together",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.IPTables.MasqueradeBit = ptr.To[int32](32)
				c.BindAddress = "not-an-ip"
				c.MetricsBindAddress = "127.0.0.1"
				c.HealthzBindAddress = "0.0.0.0:0"
				c.OOMScoreAdj = ptr.To[int32](-1001)
				c.Conntrack.Min = ptr.To[int32](-1)
				c.Conntrack.UDPTimeout.Duration = -time.Second
				c.ClientConnection.Burst = -1
				c.ConfigSyncPeriod.Duration = -time.Minute
				c.NodePortAddresses = []string{"primary", "10.0.0.0/33", "primary"}
				c.ShowHiddenMetricsForVersion = "1.30"
			},
			want: map[string]string{
				"iptables.masqueradeBit":      "within the range [0, 31]",
				"bindAddress":                 "must be an IP address",
				"metricsBindAddress":          "must be IP:port",
				"healthzBindAddress":          "must be a valid port",
				"oomScoreAdj":                 "[-1000, 1000]",
				"conntrack.min":               "greater than or equal to 0",
				"conntrack.udpTimeout":        "greater than or equal to 0",
				"clientConnection.burst":      "greater than or equal to 0",
				"configSyncPeriod":            "greater than 0",
				"nodePortAddresses[1]":        "valid CIDR or one of the keywords",
				"nodePortAddresses[2]":        "Duplicate value",
				"showHiddenMetricsForVersion": `"1.36"`,
			},
		},
		{
			name: "sync periods are checked in the active mode's section",
			mode: "nftables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.NFTables.SyncPeriod.Duration = 10 * time.Second
				c.NFTables.MinSyncPeriod.Duration = 20 * time.Second
				c.NFTables.MasqueradeBit = ptr.To[int32](-1)
				c.IPTables.SyncPeriod.Duration = -1 // inactive section: not checked
			},
			want: map[string]string{
				"nftables.minSyncPeriod": "less than or equal to nftables.syncPeriod",
				"nftables.masqueradeBit": "within the range [0, 31]",
			},
		},
		{
			name: "negative sync periods",
			mode: "ipvs",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.IPVS.SyncPeriod.Duration = -time.Second
				c.IPVS.MinSyncPeriod.Duration = -time.Second
				c.IPVS.TCPTimeout.Duration = -time.Second
				c.IPVS.ExcludeCIDRs = []string{"10.0.0.0/8", "bogus"}
			},
			want: map[string]string{
				"ipvs.syncPeriod":      "greater than 0",
				"ipvs.minSyncPeriod":   "greater than or equal to 0",
				"ipvs.tcpTimeout":      "greater than or equal to 0",
				"ipvs.excludeCIDRs[1]": "valid CIDR",
			},
		},
		{
			name:   "unknown mode lists the valid ones",
			mode:   "userspace",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {},
			want:   map[string]string{"mode": `supported values: "iptables", "nftables", "ipvs"`},
		},
		{
			name: "ipvs refused when its gate is off",
			mode: "ipvs",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.FeatureGates = map[string]bool{"KubeProxyIPVS": false}
			},
			want: map[string]string{"mode": "disabled by the feature gate KubeProxyIPVS=false; use one of iptables, nftables"},
		},
		{
			// Upstream knows every Kubernetes gate; sluice ignores (and warns about) the
			// ones that do not concern it, so the file still validates.
			name: "a gate sluice does not know is not an error",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.FeatureGates = map[string]bool{"NoSuchGate": true}
			},
			want: map[string]string{},
		},
		{
			name: "locked feature gate",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.FeatureGates = map[string]bool{"PreferSameTrafficDistribution": false}
			},
			want: map[string]string{"featureGates": "locked to true"},
		},
		{
			name: "detect-local interface modes need their interface",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.DetectLocalMode = "BridgeInterface"
			},
			want: map[string]string{"detectLocal.bridgeInterface": "must be set"},
		},
		{
			name: "interface name prefix must be set",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.DetectLocalMode = "InterfaceNamePrefix"
			},
			want: map[string]string{"detectLocal.interfaceNamePrefix": "must be set"},
		},
		{
			name: "unknown detect-local mode",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.DetectLocalMode = "PodCIDR"
			},
			want: map[string]string{"detectLocalMode": `supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"`},
		},
		{
			name: "cluster CIDR must be one CIDR or a dual-stack pair",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.ClusterCIDR = "10.0.0.0/8,10.1.0.0/16"
			},
			want: map[string]string{"clusterCIDR": "dual-stack pair"},
		},
		{
			name: "cluster CIDR entries must parse (and are not trimmed)",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.ClusterCIDR = "10.0.0.0/8, fd00::/48"
			},
			want: map[string]string{"clusterCIDR": `" fd00::/48" must be a valid CIDR`},
		},
		{
			name: "logging is validated too",
			mode: "iptables",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.Logging.Format = "xml"
				c.Logging.Options.Text.SplitStream = true
			},
			want: map[string]string{
				"logging.format":                   "Unsupported log format",
				"logging.options.text.splitStream": "LoggingAlphaOptions",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig(tt.mode)
			tt.modify(cfg)
			errs := Validate(cfg)
			got := map[string][]string{}
			for _, e := range errs {
				got[e.Field] = append(got[e.Field], e.Error())
			}
			for path, fragment := range tt.want {
				msgs, ok := got[path]
				if !ok {
					t.Errorf("no error for %s; got %v", path, errs)
					continue
				}
				if !strings.Contains(strings.Join(msgs, "\n"), fragment) {
					t.Errorf("%s: %q does not mention %q", path, msgs, fragment)
				}
			}
			for path := range got {
				if _, expected := tt.want[path]; !expected {
					t.Errorf("unexpected error for %s: %v", path, got[path])
				}
			}
		})
	}
}

func TestValidationErrorListsEveryField(t *testing.T) {
	err := &ValidationError{Source: "/etc/sluice.yaml", Errors: field.ErrorList{
		field.Invalid(field.NewPath("iptables", "masqueradeBit"), 40, "must be within the range [0, 31]"),
		field.Invalid(field.NewPath("bindAddress"), "x", "must be an IP address"),
	}}
	msg := err.Error()
	for _, want := range []string{"/etc/sluice.yaml", "iptables.masqueradeBit: Invalid value: 40", "bindAddress: Invalid value: \"x\""} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
}
