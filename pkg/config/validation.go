package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// Validate checks a configuration that has been through SetDefaults and
// ApplyPlatformDefaults, with upstream's rules, and returns every problem found, each
// with the v1alpha1 path of the field (for example "nftables.syncPeriod" or
// "nodePortAddresses[2]").
//
// As upstream does, only the active mode's section is checked for sync periods (and the
// ipvs and nftables sections only in their own mode), while iptables.masqueradeBit is
// always checked. Unlike upstream, an unknown mode lists the valid ones and mode ipvs is
// refused with its own message when the KubeProxyIPVS gate is off.
func Validate(cfg *v1alpha1.KubeProxyConfiguration) field.ErrorList {
	errs, _, _ := validate(cfg)
	return errs
}

// validate is Validate that also returns the feature gate set it evaluated (the defaults
// when featureGates is invalid) and the gates it ignored (see setFeatureGates).
func validate(cfg *v1alpha1.KubeProxyConfiguration) (field.ErrorList, featuregate.FeatureGate, []string) {
	var errs field.ErrorList

	gate, ignoredGates, err := setFeatureGates(cfg.FeatureGates)
	if err != nil {
		errs = append(errs, field.Invalid(field.NewPath("featureGates"), cfg.FeatureGates, err.Error()))
	}

	errs = append(errs, validateMasqueradeBit(cfg.IPTables.MasqueradeBit, field.NewPath("iptables", "masqueradeBit"))...)
	mode := dataplane.Mode(cfg.Mode)
	switch mode {
	case dataplane.ModeIPVS:
		errs = append(errs, validateIPVS(&cfg.IPVS, field.NewPath("ipvs"))...)
	case dataplane.ModeNFTables:
		errs = append(errs, validateMasqueradeBit(cfg.NFTables.MasqueradeBit, field.NewPath("nftables", "masqueradeBit"))...)
	}
	errs = append(errs, validateMode(mode, gate, field.NewPath("mode"))...)

	section := syncSectionPath(mode)
	syncPeriod, minSyncPeriod := activeSyncPeriods(cfg)
	if syncPeriod <= 0 {
		errs = append(errs, field.Invalid(section.Child("syncPeriod"), metav1.Duration{Duration: syncPeriod}, "must be greater than 0"))
	}
	if minSyncPeriod < 0 {
		errs = append(errs, field.Invalid(section.Child("minSyncPeriod"), metav1.Duration{Duration: minSyncPeriod}, "must be greater than or equal to 0"))
	} else if minSyncPeriod > syncPeriod && syncPeriod > 0 {
		errs = append(errs, field.Invalid(section.Child("minSyncPeriod"), metav1.Duration{Duration: minSyncPeriod},
			fmt.Sprintf("must be less than or equal to %s (%s)", section.Child("syncPeriod"), syncPeriod)))
	}
	if cfg.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("configSyncPeriod"), cfg.ConfigSyncPeriod, "must be greater than 0"))
	}

	errs = append(errs, validateConntrack(&cfg.Conntrack, field.NewPath("conntrack"))...)
	if cfg.OOMScoreAdj != nil && (*cfg.OOMScoreAdj < -1000 || *cfg.OOMScoreAdj > 1000) {
		errs = append(errs, field.Invalid(field.NewPath("oomScoreAdj"), *cfg.OOMScoreAdj, "must be within the range [-1000, 1000]"))
	}
	if cfg.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("clientConnection", "burst"), cfg.ClientConnection.Burst, "must be greater than or equal to 0"))
	}

	if parseIP(cfg.BindAddress) == nil {
		errs = append(errs, field.Invalid(field.NewPath("bindAddress"), cfg.BindAddress, "must be an IP address"))
	}
	if cfg.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(cfg.HealthzBindAddress, field.NewPath("healthzBindAddress"))...)
	}
	errs = append(errs, validateHostPort(cfg.MetricsBindAddress, field.NewPath("metricsBindAddress"))...)
	errs = append(errs, validateNodePortAddresses(cfg.NodePortAddresses, field.NewPath("nodePortAddresses"))...)
	errs = append(errs, validateShowHiddenMetricsForVersion(cfg.ShowHiddenMetricsForVersion, field.NewPath("showHiddenMetricsForVersion"))...)
	errs = append(errs, validateDetectLocal(cfg, field.NewPath("detectLocalMode"))...)
	errs = append(errs, logsapi.Validate(&cfg.Logging, gate, field.NewPath("logging"))...)
	return errs, gate, ignoredGates
}

// syncSectionPath is the section whose syncPeriod and minSyncPeriod a mode uses: ipvs and
// nftables their own, every other mode (iptables, and unknown ones) the iptables section.
func syncSectionPath(mode dataplane.Mode) *field.Path {
	switch mode {
	case dataplane.ModeIPVS:
		return field.NewPath("ipvs")
	case dataplane.ModeNFTables:
		return field.NewPath("nftables")
	}
	return field.NewPath("iptables")
}

// activeSyncPeriods returns syncPeriod and minSyncPeriod of the active mode's section.
func activeSyncPeriods(cfg *v1alpha1.KubeProxyConfiguration) (syncPeriod, minSyncPeriod time.Duration) {
	switch dataplane.Mode(cfg.Mode) {
	case dataplane.ModeIPVS:
		return cfg.IPVS.SyncPeriod.Duration, cfg.IPVS.MinSyncPeriod.Duration
	case dataplane.ModeNFTables:
		return cfg.NFTables.SyncPeriod.Duration, cfg.NFTables.MinSyncPeriod.Duration
	}
	return cfg.IPTables.SyncPeriod.Duration, cfg.IPTables.MinSyncPeriod.Duration
}

func validateMode(mode dataplane.Mode, gate featuregate.FeatureGate, path *field.Path) field.ErrorList {
	valid := []string{string(dataplane.ModeIPTables), string(dataplane.ModeNFTables)}
	ipvsAllowed := gate.Enabled(KubeProxyIPVS)
	if ipvsAllowed {
		valid = append(valid, string(dataplane.ModeIPVS))
	}
	switch mode {
	case "", dataplane.ModeIPTables, dataplane.ModeNFTables:
		return nil
	case dataplane.ModeIPVS:
		if ipvsAllowed {
			return nil
		}
		return field.ErrorList{field.Forbidden(path,
			fmt.Sprintf("mode %q is disabled by the feature gate %s=false; use one of %s", mode, KubeProxyIPVS, strings.Join(valid, ", ")))}
	}
	return field.ErrorList{field.NotSupported(path, string(mode), valid)}
}

func validateMasqueradeBit(bit *int32, path *field.Path) field.ErrorList {
	if bit != nil && (*bit < 0 || *bit > 31) {
		return field.ErrorList{field.Invalid(path, *bit, "must be within the range [0, 31]")}
	}
	return nil
}

func validateIPVS(ipvs *v1alpha1.KubeProxyIPVSConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, d := range []struct {
		name  string
		value metav1.Duration
	}{
		{"tcpTimeout", ipvs.TCPTimeout},
		{"tcpFinTimeout", ipvs.TCPFinTimeout},
		{"udpTimeout", ipvs.UDPTimeout},
	} {
		if d.value.Duration < 0 {
			errs = append(errs, field.Invalid(path.Child(d.name), d.value, "must be greater than or equal to 0"))
		}
	}
	for i, cidr := range ipvs.ExcludeCIDRs {
		if _, err := parseCIDR(cidr); err != nil {
			errs = append(errs, field.Invalid(path.Child("excludeCIDRs").Index(i), cidr, "must be a valid CIDR"))
		}
	}
	return errs
}

func validateConntrack(ct *v1alpha1.KubeProxyConntrackConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		errs = append(errs, field.Invalid(path.Child("maxPerCore"), *ct.MaxPerCore, "must be greater than or equal to 0"))
	}
	if ct.Min != nil && *ct.Min < 0 {
		errs = append(errs, field.Invalid(path.Child("min"), *ct.Min, "must be greater than or equal to 0"))
	}
	for _, d := range []struct {
		name  string
		value *metav1.Duration
	}{
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout},
		{"udpTimeout", &ct.UDPTimeout},
		{"udpStreamTimeout", &ct.UDPStreamTimeout},
	} {
		if d.value != nil && d.value.Duration < 0 {
			errs = append(errs, field.Invalid(path.Child(d.name), *d.value, "must be greater than or equal to 0"))
		}
	}
	return errs
}

// validateHostPort requires IP:port with a port in 1-65535.
func validateHostPort(input string, path *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(input)
	if err != nil {
		return field.ErrorList{field.Invalid(path, input, "must be IP:port")}
	}
	var errs field.ErrorList
	if parseIP(host) == nil {
		errs = append(errs, field.Invalid(path, input, fmt.Sprintf("%q must be a valid IP", host)))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(path, input, fmt.Sprintf("%q must be a valid port (1-65535)", port)))
	}
	return errs
}

func validateNodePortAddresses(entries []string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seenKeywords := map[string]bool{}
	for i, entry := range entries {
		switch entry {
		case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
			if seenKeywords[entry] {
				errs = append(errs, field.Duplicate(path.Index(i), entry))
			}
			seenKeywords[entry] = true
			continue
		}
		if _, err := parseCIDR(entry); err != nil {
			errs = append(errs, field.Invalid(path.Index(i), entry,
				fmt.Sprintf("must be a valid CIDR or one of the keywords %q, %q, %q", NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll)))
		}
	}
	return errs
}

// validateShowHiddenMetricsForVersion accepts "" or the minor release before
// UpstreamVersion, the only value upstream allows.
func validateShowHiddenMetricsForVersion(v string, path *field.Path) field.ErrorList {
	if v == "" {
		return nil
	}
	current := strings.Split(UpstreamVersion, ".")
	minor, _ := strconv.Atoi(current[1])
	previous := fmt.Sprintf("%s.%d", current[0], minor-1)
	if v != previous {
		return field.ErrorList{field.Invalid(path, v, fmt.Sprintf("must be omitted or %q; only the previous minor version is allowed", previous))}
	}
	return nil
}

func validateDetectLocal(cfg *v1alpha1.KubeProxyConfiguration, modePath *field.Path) field.ErrorList {
	mode := dataplane.LocalDetectMode(cfg.DetectLocalMode)
	switch mode {
	case "", dataplane.DetectLocalNodeCIDR:
		return nil
	case dataplane.DetectLocalBridgeInterface:
		if cfg.DetectLocal.BridgeInterface == "" {
			return field.ErrorList{field.Required(field.NewPath("detectLocal", "bridgeInterface"), "must be set when detectLocalMode is BridgeInterface")}
		}
		return nil
	case dataplane.DetectLocalInterfaceNamePrefix:
		if cfg.DetectLocal.InterfaceNamePrefix == "" {
			return field.ErrorList{field.Required(field.NewPath("detectLocal", "interfaceNamePrefix"), "must be set when detectLocalMode is InterfaceNamePrefix")}
		}
		return nil
	case dataplane.DetectLocalClusterCIDR:
		if cfg.ClusterCIDR == "" {
			return nil
		}
		return validateClusterCIDR(cfg.ClusterCIDR, field.NewPath("clusterCIDR"))
	}
	return field.ErrorList{field.NotSupported(modePath, string(mode), []string{
		string(dataplane.DetectLocalClusterCIDR), string(dataplane.DetectLocalNodeCIDR),
		string(dataplane.DetectLocalBridgeInterface), string(dataplane.DetectLocalInterfaceNamePrefix),
	})}
}

// validateClusterCIDR accepts one CIDR or a comma-separated dual-stack pair. Entries are
// not trimmed, as upstream does not trim them either.
func validateClusterCIDR(value string, path *field.Path) field.ErrorList {
	entries := strings.Split(value, ",")
	if len(entries) > 2 {
		return field.ErrorList{field.Invalid(path, value, "must be a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)")}
	}
	var errs field.ErrorList
	var prefixes []*net.IPNet
	for _, entry := range entries {
		_, ipNet, err := netutils.ParseCIDRSloppy(entry)
		if err != nil {
			errs = append(errs, field.Invalid(path, value, fmt.Sprintf("%q must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)", entry)))
			continue
		}
		prefixes = append(prefixes, ipNet)
	}
	if len(errs) == 0 && len(prefixes) == 2 && netutils.IsIPv4CIDR(prefixes[0]) == netutils.IsIPv4CIDR(prefixes[1]) {
		errs = append(errs, field.Invalid(path, value, "must be a single CIDR or a dual-stack pair of CIDRs (one IPv4, one IPv6)"))
	}
	return errs
}
