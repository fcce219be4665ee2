package config

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// FullSyncInterval is the longest upstream's iptables and nftables sync loops wait between
// two syncs when nothing changes (pkg/proxy/util FullSyncPeriod).
const FullSyncInterval = time.Hour

// Effective is the completed configuration, typed and with every mode-dependent choice
// already made, so that the rest of sluice never looks at v1alpha1 sections itself. It is
// derived from a defaulted, validated KubeProxyConfiguration by NewEffective.
//
// Values that depend on the Node object (its IPs, its pod CIDRs) are resolved per IP
// family by the methods, which take the node as an argument.
type Effective struct {
	// Mode is the backend: iptables, nftables or ipvs.
	Mode dataplane.Mode
	// ModeDefaulted is true when no mode was configured and iptables was chosen; upstream
	// logs an error and records the KubeProxyDefaultMode Event in that case.
	ModeDefaulted bool

	// NodeName is the name of this node: hostnameOverride (from --hostname-override or
	// the file) or else the OS hostname, trimmed and lowercased.
	NodeName string

	// BindAddress is bindAddress. Despite its name no socket binds to it: when it is not
	// unspecified (0.0.0.0 or ::) it replaces the node's IP of its family.
	BindAddress netip.Addr
	// HealthzBindAddress is the IP:port of /healthz and /livez; "" disables that server.
	HealthzBindAddress string
	// MetricsBindAddress is the IP:port of /metrics (and /configz, pprof ...).
	MetricsBindAddress string
	// BindAddressHardFail makes a failure to bind the two servers fatal instead of retried.
	BindAddressHardFail bool
	// EnableProfiling serves /debug/pprof on the metrics server.
	EnableProfiling bool
	// ShowHiddenMetricsForVersion is "" or the previous minor release.
	ShowHiddenMetricsForVersion string

	// SyncPeriod and MinSyncPeriod come from the active mode's section (iptables.*,
	// nftables.* or ipvs.*). MinSyncPeriod is the least time between two syncs;
	// SyncPeriod is the retry interval after a failed sync, and twice it is the health
	// check's staleness limit.
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// MaxSyncInterval is the longest the sync loop waits when nothing changes: one hour
	// in iptables mode and SyncPeriod in ipvs mode (as upstream's runners), and SyncPeriod
	// in nftables mode, where upstream waits an hour: sluice's periodic nftables sync is a
	// netlink read of the table that repairs drift (an element or chain removed by hand)
	// within syncPeriod, and costs nothing in the kernel when there is none.
	MaxSyncInterval time.Duration

	// MasqueradeBit is nftables.masqueradeBit in nftables mode and iptables.masqueradeBit
	// otherwise (ipvs uses the iptables one, as upstream does).
	MasqueradeBit int
	// MasqueradeAll is nftables.masqueradeAll in nftables mode, iptables.masqueradeAll
	// otherwise.
	MasqueradeAll bool
	// LocalhostNodePorts is iptables.localhostNodePorts; only iptables mode, and only for
	// IPv4, acts on it (DataplaneConfig resolves that).
	LocalhostNodePorts bool

	// NodePortAddresses is nodePortAddresses after platform defaulting (["primary"] when
	// unset in nftables mode), keywords not yet expanded: see NodePortAddressesFor.
	NodePortAddresses []string

	// DetectLocalMode says how pod traffic is recognised; see LocalDetectorFor.
	DetectLocalMode dataplane.LocalDetectMode
	// ClusterCIDRs is clusterCIDR split at commas and parsed (at most one per family).
	ClusterCIDRs []netip.Prefix
	// BridgeInterface is detectLocal.bridgeInterface.
	BridgeInterface string
	// InterfaceNamePrefix is detectLocal.interfaceNamePrefix.
	InterfaceNamePrefix string

	// IPVS holds the ipvs section's remaining settings (used in ipvs mode only).
	IPVS IPVSSettings
	// Conntrack holds the conntrack sysctl settings, applied in every mode.
	Conntrack ConntrackSettings
	// OOMScoreAdj is the oom_score_adj to set on the sluice process.
	OOMScoreAdj int
	// ConfigSyncPeriod is the informers' resync period.
	ConfigSyncPeriod time.Duration
	// ClientConnection is how to reach the API server (kubeconfig, content type, QPS,
	// burst). The --master override is Options.Master.
	ClientConnection componentbaseconfigv1alpha1.ClientConnectionConfiguration
}

// IPVSSettings are the ipvs section's settings other than the sync periods.
type IPVSSettings struct {
	// Scheduler is the IPVS scheduler; "rr" when the configuration leaves it empty.
	Scheduler string
	// ExcludeCIDRs are never touched when cleaning up IPVS virtual servers (both
	// families; see ExcludeCIDRsOf).
	ExcludeCIDRs []netip.Prefix
	// StrictARP sets arp_ignore=1 and arp_announce=2.
	StrictARP bool
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS connection timeouts; 0 leaves
	// the kernel's value alone.
	TCPTimeout    time.Duration
	TCPFinTimeout time.Duration
	UDPTimeout    time.Duration
}

// ExcludeCIDRsOf returns the excluded CIDRs of one family.
func (s IPVSSettings) ExcludeCIDRsOf(family model.IPFamily) []netip.Prefix {
	return prefixesOf(s.ExcludeCIDRs, family)
}

// ConntrackSettings are the conntrack section's values, the type conntrack.ApplySysctls
// takes (one definition, so a new sysctl is added in one place). A zero duration or count
// leaves the kernel's value alone.
type ConntrackSettings = conntrack.Settings

// NewEffective derives the typed view of cfg, which must have been through SetDefaults,
// ApplyPlatformDefaults and Validate. nodeName is the resolved node name (see
// Options.Complete). The only error is a value that Validate would have rejected.
func NewEffective(cfg *v1alpha1.KubeProxyConfiguration, nodeName string) (*Effective, error) {
	bindIP := parseIP(cfg.BindAddress)
	if bindIP == nil {
		return nil, fmt.Errorf("bindAddress %q is not an IP address", cfg.BindAddress)
	}
	bindAddr, _ := netip.AddrFromSlice(bindIP)

	mode := dataplane.Mode(cfg.Mode)
	syncPeriod, minSyncPeriod := activeSyncPeriods(cfg)
	e := &Effective{
		Mode:                        mode,
		NodeName:                    nodeName,
		BindAddress:                 bindAddr.Unmap(),
		HealthzBindAddress:          cfg.HealthzBindAddress,
		MetricsBindAddress:          cfg.MetricsBindAddress,
		BindAddressHardFail:         cfg.BindAddressHardFail,
		EnableProfiling:             cfg.EnableProfiling,
		ShowHiddenMetricsForVersion: cfg.ShowHiddenMetricsForVersion,
		SyncPeriod:                  syncPeriod,
		MinSyncPeriod:               minSyncPeriod,
		MaxSyncInterval:             FullSyncInterval,
		MasqueradeBit:               int(ptr.Deref(cfg.IPTables.MasqueradeBit, DefaultMasqueradeBit)),
		MasqueradeAll:               cfg.IPTables.MasqueradeAll,
		LocalhostNodePorts:          ptr.Deref(cfg.IPTables.LocalhostNodePorts, true),
		NodePortAddresses:           append([]string(nil), cfg.NodePortAddresses...),
		DetectLocalMode:             dataplane.LocalDetectMode(cfg.DetectLocalMode),
		BridgeInterface:             cfg.DetectLocal.BridgeInterface,
		InterfaceNamePrefix:         cfg.DetectLocal.InterfaceNamePrefix,
		IPVS: IPVSSettings{
			Scheduler:     cfg.IPVS.Scheduler,
			StrictARP:     cfg.IPVS.StrictARP,
			TCPTimeout:    cfg.IPVS.TCPTimeout.Duration,
			TCPFinTimeout: cfg.IPVS.TCPFinTimeout.Duration,
			UDPTimeout:    cfg.IPVS.UDPTimeout.Duration,
		},
		Conntrack: ConntrackSettings{
			MaxPerCore:       int(ptr.Deref(cfg.Conntrack.MaxPerCore, DefaultConntrackMaxPerCore)),
			Min:              int(ptr.Deref(cfg.Conntrack.Min, DefaultConntrackMin)),
			TCPBeLiberal:     cfg.Conntrack.TCPBeLiberal,
			UDPTimeout:       cfg.Conntrack.UDPTimeout.Duration,
			UDPStreamTimeout: cfg.Conntrack.UDPStreamTimeout.Duration,
		},
		OOMScoreAdj:      int(ptr.Deref(cfg.OOMScoreAdj, DefaultOOMScoreAdj)),
		ConfigSyncPeriod: cfg.ConfigSyncPeriod.Duration,
		ClientConnection: cfg.ClientConnection,
	}
	switch mode {
	case dataplane.ModeNFTables:
		e.MasqueradeBit = int(ptr.Deref(cfg.NFTables.MasqueradeBit, DefaultMasqueradeBit))
		e.MasqueradeAll = cfg.NFTables.MasqueradeAll
		e.MaxSyncInterval = syncPeriod
	case dataplane.ModeIPVS:
		e.MaxSyncInterval = syncPeriod
	}
	if e.IPVS.Scheduler == "" {
		e.IPVS.Scheduler = DefaultIPVSScheduler
	}
	if cfg.Conntrack.TCPEstablishedTimeout != nil {
		e.Conntrack.TCPEstablishedTimeout = cfg.Conntrack.TCPEstablishedTimeout.Duration
	}
	if cfg.Conntrack.TCPCloseWaitTimeout != nil {
		e.Conntrack.TCPCloseWaitTimeout = cfg.Conntrack.TCPCloseWaitTimeout.Duration
	}

	// clusterCIDR and ipvs.excludeCIDRs are only validated where they are used; elsewhere
	// an unparsable entry is skipped here, as upstream's family split skips it.
	if cfg.ClusterCIDR != "" {
		for _, entry := range strings.Split(cfg.ClusterCIDR, ",") {
			if p, err := parseCIDR(entry); err == nil {
				e.ClusterCIDRs = append(e.ClusterCIDRs, p)
			}
		}
	}
	for _, entry := range cfg.IPVS.ExcludeCIDRs {
		if p, err := parseCIDR(entry); err == nil {
			e.IPVS.ExcludeCIDRs = append(e.IPVS.ExcludeCIDRs, p)
		}
	}
	for _, entry := range e.NodePortAddresses {
		if isNodePortKeyword(entry) {
			continue
		}
		if _, err := parseCIDR(entry); err != nil {
			return nil, fmt.Errorf("nodePortAddresses: %q is neither a CIDR nor a keyword", entry)
		}
	}
	return e, nil
}

// PrimaryFamily returns the node's primary IP family as upstream determines it: the family
// of bindAddress when that is not unspecified, else that of the node's first IP, else IPv4.
func (e *Effective) PrimaryFamily(node model.NodeInfo) model.IPFamily {
	if e.BindAddress.IsValid() && !e.BindAddress.IsUnspecified() {
		return model.FamilyOf(e.BindAddress)
	}
	if len(node.IPs) > 0 {
		return model.FamilyOf(node.IPs[0])
	}
	return model.IPv4
}

// NodeIP returns what upstream calls the node IP of one family: bindAddress when it is of
// that family and not unspecified, else the node's first IP of that family, else the
// loopback address (upstream's fallback when it cannot tell).
func (e *Effective) NodeIP(family model.IPFamily, node model.NodeInfo) netip.Addr {
	if e.BindAddress.IsValid() && !e.BindAddress.IsUnspecified() && model.FamilyOf(e.BindAddress) == family {
		return e.BindAddress
	}
	if ips := node.IPsOf(family); len(ips) > 0 {
		return ips[0].Unmap()
	}
	if family == model.IPv6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// NodePortAddressesFor resolves nodePortAddresses for one family:
//   - "primary" becomes NodeIP(family) as a /32 or /128, or nothing when that is a
//     loopback address (the node's IP of that family is unknown);
//   - "localhost" becomes 127.0.0.0/8 or ::1/128;
//   - "all", or any CIDR covering the whole family (0.0.0.0/0, ::/0), means MatchAll;
//   - CIDRs of the other family are dropped;
//   - when nothing of this family is left (including an unset list in iptables and ipvs
//     modes), NodePorts answer on every local address: MatchAll.
func (e *Effective) NodePortAddressesFor(family model.IPFamily, node model.NodeInfo) dataplane.NodePortAddresses {
	var cidrs []netip.Prefix
	add := func(p netip.Prefix) {
		for _, have := range cidrs {
			if have == p {
				return
			}
		}
		cidrs = append(cidrs, p)
	}
	for _, entry := range e.NodePortAddresses {
		switch entry {
		case NodePortAddressesPrimary:
			if ip := e.NodeIP(family, node); !ip.IsLoopback() {
				add(netip.PrefixFrom(ip, ip.BitLen()))
			}
		case NodePortAddressesLocalhost:
			if family == model.IPv6 {
				add(netip.PrefixFrom(netip.IPv6Loopback(), 128))
			} else {
				add(netip.MustParsePrefix("127.0.0.0/8"))
			}
		case NodePortAddressesAll:
			return dataplane.NodePortAddresses{MatchAll: true}
		default:
			p, err := parseCIDR(entry)
			if err != nil || model.FamilyOf(p.Addr()) != family {
				continue
			}
			if p.Bits() == 0 {
				return dataplane.NodePortAddresses{MatchAll: true}
			}
			add(p)
		}
	}
	if len(cidrs) == 0 {
		return dataplane.NodePortAddresses{MatchAll: true}
	}
	return dataplane.NodePortAddresses{CIDRs: cidrs}
}

// LocalDetectorFor resolves detectLocalMode for one family. ClusterCIDR mode uses the
// first cluster CIDR of the family and NodeCIDR mode the node's first pod CIDR of the
// family (a detector without one matches nothing, upstream's no-op detector); the two
// interface modes apply to both families alike.
func (e *Effective) LocalDetectorFor(family model.IPFamily, node model.NodeInfo) dataplane.LocalDetector {
	d := dataplane.LocalDetector{Mode: e.DetectLocalMode}
	switch e.DetectLocalMode {
	case dataplane.DetectLocalClusterCIDR:
		if cidrs := prefixesOf(e.ClusterCIDRs, family); len(cidrs) > 0 {
			d.CIDRs = cidrs[:1]
		}
	case dataplane.DetectLocalNodeCIDR:
		if cidrs := node.PodCIDRsOf(family); len(cidrs) > 0 {
			d.CIDRs = []netip.Prefix{cidrs[0].Masked()}
		}
	case dataplane.DetectLocalBridgeInterface:
		d.Interface = e.BridgeInterface
	case dataplane.DetectLocalInterfaceNamePrefix:
		d.Interface = e.InterfaceNamePrefix
	}
	return d
}

// DataplaneConfig builds the settings every backend shares, for one family.
// LocalhostNodePorts is true only in iptables mode, for IPv4, and only when
// iptables.localhostNodePorts is on (the only case upstream DNATs 127.0.0.1 NodePorts).
func (e *Effective) DataplaneConfig(family model.IPFamily, node model.NodeInfo) dataplane.Config {
	return dataplane.Config{
		Family:             family,
		NodeName:           e.NodeName,
		MasqueradeBit:      e.MasqueradeBit,
		MasqueradeAll:      e.MasqueradeAll,
		LocalhostNodePorts: e.Mode == dataplane.ModeIPTables && family == model.IPv4 && e.LocalhostNodePorts,
		NodePortAddresses:  e.NodePortAddressesFor(family, node),
		LocalDetector:      e.LocalDetectorFor(family, node),
		SyncPeriod:         e.SyncPeriod,
	}
}

func isNodePortKeyword(entry string) bool {
	switch entry {
	case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
		return true
	}
	return false
}

func prefixesOf(prefixes []netip.Prefix, family model.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range prefixes {
		if model.FamilyOf(p.Addr()) == family {
			out = append(out, p)
		}
	}
	return out
}

// parseIP parses an IP address the way upstream does (leading zeros in IPv4 octets are
// accepted, for compatibility with configurations that worked before Go 1.17).
func parseIP(s string) net.IP {
	return netutils.ParseIPSloppy(s)
}

// parseCIDR parses a CIDR as upstream does (sloppy IPv4, host bits allowed) and returns
// the masked prefix; IPv4 CIDRs come back as 4-byte prefixes.
func parseCIDR(s string) (netip.Prefix, error) {
	_, ipNet, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	addr, ok := netip.AddrFromSlice(ipNet.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
	}
	ones, bits := ipNet.Mask.Size()
	if bits == 32 {
		addr = addr.Unmap()
	}
	return netip.PrefixFrom(addr, ones).Masked(), nil
}
