package config

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

var (
	dualStackNode = model.NodeInfo{
		Name:     "node-a",
		IPs:      []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11"), netip.MustParseAddr("fd00::10")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")},
	}
	ipv6PrimaryNode = model.NodeInfo{
		Name: "node-b",
		IPs:  []netip.Addr{netip.MustParseAddr("fd00::20"), netip.MustParseAddr("192.168.1.20")},
	}
	ipv4OnlyNode = model.NodeInfo{Name: "node-c", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.30")}}
	noIPNode     = model.NodeInfo{Name: "node-d"}
)

// effectiveFor builds the Effective view of a defaulted configuration changed by modify.
func effectiveFor(t *testing.T, mode string, modify func(*v1alpha1.KubeProxyConfiguration)) *Effective {
	t.Helper()
	cfg := &v1alpha1.KubeProxyConfiguration{Mode: v1alpha1.ProxyMode(mode)}
	SetDefaults(cfg)
	if modify != nil {
		modify(cfg)
	}
	ApplyPlatformDefaults(cfg)
	if errs := Validate(cfg); len(errs) > 0 {
		t.Fatalf("invalid test configuration: %v", errs)
	}
	e, err := NewEffective(cfg, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// prefixes is a short name for the tables.
var prefixes = modeltest.Prefixes

func TestNodePortAddressesPerFamily(t *testing.T) {
	tests := []struct {
		name        string
		mode        string
		entries     []string
		bindAddress string
		node        model.NodeInfo
		wantV4      dataplane.NodePortAddresses
		wantV6      dataplane.NodePortAddresses
	}{
		{name: "unset in iptables mode matches all",
			mode: "iptables", node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{MatchAll: true}, wantV6: dataplane.NodePortAddresses{MatchAll: true}},
		{name: "unset in nftables mode is the primary IP of each family",
			mode: "nftables", node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.1.10/32")},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("fd00::10/128")}},
		{name: "primary follows an IPv6-primary node",
			mode: "nftables", node: ipv6PrimaryNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.1.20/32")},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("fd00::20/128")}},
		{name: "primary of a missing family is skipped, so that family matches all",
			mode: "nftables", node: ipv4OnlyNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.1.30/32")},
			wantV6: dataplane.NodePortAddresses{MatchAll: true}},
		{name: "primary on a node without IPs (loopback fallback) matches all",
			mode: "nftables", node: noIPNode,
			wantV4: dataplane.NodePortAddresses{MatchAll: true}, wantV6: dataplane.NodePortAddresses{MatchAll: true}},
		{name: "bindAddress overrides the primary IP of its family",
			mode: "nftables", node: dualStackNode, bindAddress: "192.168.1.11",
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.1.11/32")},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("fd00::10/128")}},
		{name: "localhost gives loopback of each family",
			mode: "nftables", entries: []string{"localhost"}, node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("127.0.0.0/8")},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("::1/128")}},
		{name: "keywords and CIDRs combine, CIDRs go to their own family",
			mode: "iptables", entries: []string{"primary", "10.0.0.0/8", "localhost", "10.1.2.3/8"}, node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.1.10/32", "10.0.0.0/8", "127.0.0.0/8")},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("fd00::10/128", "::1/128")}},
		{name: "all matches all",
			mode: "nftables", entries: []string{"primary", "all"}, node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{MatchAll: true}, wantV6: dataplane.NodePortAddresses{MatchAll: true}},
		{name: "a zero CIDR matches all in its family only",
			mode: "nftables", entries: []string{"0.0.0.0/0", "fd00::/64"}, node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{MatchAll: true},
			wantV6: dataplane.NodePortAddresses{CIDRs: prefixes("fd00::/64")}},
		{name: "CIDRs of one family leave the other matching all",
			mode: "iptables", entries: []string{"192.168.0.0/16"}, node: dualStackNode,
			wantV4: dataplane.NodePortAddresses{CIDRs: prefixes("192.168.0.0/16")},
			wantV6: dataplane.NodePortAddresses{MatchAll: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := effectiveFor(t, tt.mode, func(c *v1alpha1.KubeProxyConfiguration) {
				c.NodePortAddresses = tt.entries
				if tt.bindAddress != "" {
					c.BindAddress = tt.bindAddress
				}
			})
			for family, want := range map[model.IPFamily]dataplane.NodePortAddresses{model.IPv4: tt.wantV4, model.IPv6: tt.wantV6} {
				got := e.NodePortAddressesFor(family, tt.node)
				if got.MatchAll != want.MatchAll || !slices.Equal(got.CIDRs, want.CIDRs) {
					t.Errorf("%s: got %+v, want %+v", family, got, want)
				}
			}
		})
	}
}

func TestLocalDetectorPerFamily(t *testing.T) {
	tests := []struct {
		name           string
		modify         func(*v1alpha1.KubeProxyConfiguration)
		node           model.NodeInfo
		wantV4, wantV6 dataplane.LocalDetector
	}{
		{name: "ClusterCIDR split by family",
			modify: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "fd00:244::/56,10.244.0.0/16" },
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: prefixes("10.244.0.0/16")},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: prefixes("fd00:244::/56")}},
		{name: "ClusterCIDR without a CIDR of a family is a no-op there",
			modify: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "10.244.0.0/16" },
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: prefixes("10.244.0.0/16")},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR}},
		{name: "ClusterCIDR unset is a no-op",
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR}},
		{name: "NodeCIDR uses the node's pod CIDRs",
			modify: func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "NodeCIDR"; c.ClusterCIDR = "10.0.0.0/8" },
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR, CIDRs: prefixes("10.244.1.0/24")},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR, CIDRs: prefixes("fd00:244:1::/64")}},
		{name: "NodeCIDR before the node has pod CIDRs is a no-op",
			modify: func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "NodeCIDR" },
			node:   noIPNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR}},
		{name: "BridgeInterface applies to both families",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.DetectLocalMode = "BridgeInterface"
				c.DetectLocal.BridgeInterface = "cbr0"
			},
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}},
		{name: "InterfaceNamePrefix applies to both families",
			modify: func(c *v1alpha1.KubeProxyConfiguration) {
				c.DetectLocalMode = "InterfaceNamePrefix"
				c.DetectLocal.InterfaceNamePrefix = "veth"
			},
			node:   dualStackNode,
			wantV4: dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"},
			wantV6: dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := effectiveFor(t, "iptables", tt.modify)
			for family, want := range map[model.IPFamily]dataplane.LocalDetector{model.IPv4: tt.wantV4, model.IPv6: tt.wantV6} {
				got := e.LocalDetectorFor(family, tt.node)
				if got.Mode != want.Mode || got.Interface != want.Interface || !slices.Equal(got.CIDRs, want.CIDRs) {
					t.Errorf("%s: got %+v, want %+v", family, got, want)
				}
				if got.IsNoOp() != want.IsNoOp() {
					t.Errorf("%s: IsNoOp = %v", family, got.IsNoOp())
				}
			}
		})
	}
}

func TestEffectiveTakesTheActiveModesSection(t *testing.T) {
	sections := func(c *v1alpha1.KubeProxyConfiguration) {
		c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration = 11*time.Second, 1*time.Second
		c.IPTables.MasqueradeBit, c.IPTables.MasqueradeAll = ptr.To[int32](11), false
		c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration = 22*time.Second, 2*time.Second
		c.NFTables.MasqueradeBit, c.NFTables.MasqueradeAll = ptr.To[int32](22), true
		c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration = 33*time.Second, 3*time.Second
	}
	tests := []struct {
		mode                 string
		sync, minSync, max   time.Duration
		bit                  int
		masqueradeAll, local bool
	}{
		{"iptables", 11 * time.Second, 1 * time.Second, time.Hour, 11, false, true},
		{"nftables", 22 * time.Second, 2 * time.Second, 22 * time.Second, 22, true, false},
		{"ipvs", 33 * time.Second, 3 * time.Second, 33 * time.Second, 11, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			e := effectiveFor(t, tt.mode, sections)
			if e.SyncPeriod != tt.sync || e.MinSyncPeriod != tt.minSync || e.MaxSyncInterval != tt.max ||
				e.MasqueradeBit != tt.bit || e.MasqueradeAll != tt.masqueradeAll {
				t.Errorf("got sync=%v min=%v max=%v bit=%d all=%v", e.SyncPeriod, e.MinSyncPeriod, e.MaxSyncInterval, e.MasqueradeBit, e.MasqueradeAll)
			}
			v4 := e.DataplaneConfig(model.IPv4, dualStackNode)
			v6 := e.DataplaneConfig(model.IPv6, dualStackNode)
			if v4.LocalhostNodePorts != tt.local || v6.LocalhostNodePorts {
				t.Errorf("LocalhostNodePorts v4=%v v6=%v, want v4=%v v6=false", v4.LocalhostNodePorts, v6.LocalhostNodePorts, tt.local)
			}
			if v4.Family != model.IPv4 || v4.NodeName != "node-a" || v4.MasqueradeBit != tt.bit || v4.SyncPeriod != tt.sync ||
				v4.MasqueradeAll != tt.masqueradeAll {
				t.Errorf("DataplaneConfig = %+v", v4)
			}
		})
	}
}

func TestNodeIPAndPrimaryFamily(t *testing.T) {
	e := effectiveFor(t, "iptables", nil)
	if got := e.NodeIP(model.IPv4, dualStackNode); got != netip.MustParseAddr("192.168.1.10") {
		t.Errorf("v4 node IP %v", got)
	}
	if got := e.NodeIP(model.IPv6, ipv4OnlyNode); got != netip.IPv6Loopback() {
		t.Errorf("missing v6 node IP should be ::1, got %v", got)
	}
	if e.PrimaryFamily(ipv6PrimaryNode) != model.IPv6 || e.PrimaryFamily(noIPNode) != model.IPv4 {
		t.Errorf("primary family wrong")
	}
	e6 := effectiveFor(t, "iptables", func(c *v1alpha1.KubeProxyConfiguration) { c.BindAddress = "fd00::99" })
	if e6.PrimaryFamily(dualStackNode) != model.IPv6 || e6.NodeIP(model.IPv6, dualStackNode) != netip.MustParseAddr("fd00::99") {
		t.Errorf("bindAddress should make IPv6 primary with its IP")
	}
}

func TestIPVSAndConntrackSettings(t *testing.T) {
	e := effectiveFor(t, "ipvs", func(c *v1alpha1.KubeProxyConfiguration) {
		c.IPVS.ExcludeCIDRs = []string{"10.0.0.0/8", "fd00::/8"}
		c.IPVS.TCPTimeout.Duration = time.Minute
	})
	if e.IPVS.Scheduler != "rr" || e.IPVS.TCPTimeout != time.Minute ||
		!slices.Equal(e.IPVS.ExcludeCIDRsOf(model.IPv6), prefixes("fd00::/8")) {
		t.Errorf("IPVS = %+v", e.IPVS)
	}
	want := ConntrackSettings{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
	if e.Conntrack != want {
		t.Errorf("Conntrack = %+v, want %+v", e.Conntrack, want)
	}
}
