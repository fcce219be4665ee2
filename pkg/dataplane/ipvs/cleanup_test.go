package ipvs

import (
	"slices"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// The other modes destroy this mode's ipsets by the names package leftovers keeps; they must
// be the names this backend creates, or a switch away from ipvs leaves sets behind.
func TestLeftoversNamesEveryIPSetOfThisMode(t *testing.T) {
	for _, family := range []model.IPFamily{model.IPv4, model.IPv6} {
		var ours []string
		for id := ipsetID(0); id < numIPSets; id++ {
			ours = append(ours, ipsetName(id, family))
		}
		theirs := leftovers.IPVSIPSetNames(family)
		slices.Sort(ours)
		slices.Sort(theirs)
		if !slices.Equal(ours, theirs) {
			t.Errorf("%s: this backend's ipsets %v, leftovers removes %v", family, ours, theirs)
		}
	}
}
