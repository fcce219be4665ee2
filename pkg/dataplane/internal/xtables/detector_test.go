package xtables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

func TestLocalMatchesAreOneMatchAndItsNegation(t *testing.T) {
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")}
	for _, tc := range []struct {
		detector dataplane.LocalDetector
		local    []string // nil: no matches at all
	}{
		{dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: cidrs}, []string{"-s", "10.244.0.0/16"}},
		{dataplane.LocalDetector{Mode: dataplane.DetectLocalNodeCIDR, CIDRs: cidrs[1:]}, []string{"-s", "10.245.0.0/16"}},
		{dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}, []string{"-i", "cbr0"}},
		{dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}, []string{"-i", "veth+"}},
		{dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR}, nil},
		{dataplane.LocalDetector{}, nil},
	} {
		local, notLocal := LocalMatches(tc.detector)
		var wantNot []string
		if tc.local != nil {
			wantNot = append([]string{"!"}, tc.local...)
		}
		if !slices.Equal(local, tc.local) || !slices.Equal(notLocal, wantNot) || (tc.local == nil) != (local == nil && notLocal == nil) {
			t.Errorf("%+v: %q and %q, want %q and %q", tc.detector, local, notLocal, tc.local, wantNot)
		}
	}
}
