package xtables

import "github.com/sluiceproxy/sluice/pkg/dataplane"

// LocalMatches returns the iptables matches for traffic from a local pod and for traffic
// from anywhere else, both nil for the no-op detector. Upstream's CIDR detectors take one
// CIDR per family, and iptables cannot negate a list: with several, the first is used.
func LocalMatches(d dataplane.LocalDetector) (local, notLocal []string) {
	if d.IsNoOp() {
		return nil, nil
	}
	switch d.Mode {
	case dataplane.DetectLocalClusterCIDR, dataplane.DetectLocalNodeCIDR:
		c := d.CIDRs[0].String()
		return []string{"-s", c}, []string{"!", "-s", c}
	case dataplane.DetectLocalBridgeInterface:
		return []string{"-i", d.Interface}, []string{"!", "-i", d.Interface}
	case dataplane.DetectLocalInterfaceNamePrefix:
		return []string{"-i", d.Interface + "+"}, []string{"!", "-i", d.Interface + "+"}
	}
	return nil, nil
}
