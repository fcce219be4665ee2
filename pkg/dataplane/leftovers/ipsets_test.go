package leftovers

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestIPVSIPSetNamesCoverBothFamiliesAndSluicesOwnSet(t *testing.T) {
	v4 := IPVSIPSetNames(model.IPv4)
	v6 := IPVSIPSetNames(model.IPv6)
	for _, want := range []string{"KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR", "KUBE-SLUICE-NO-LOCAL-EPS"} {
		if !slices.Contains(v4, want) {
			t.Errorf("IPv4 sets %v lack %s", v4, want)
		}
	}
	// The ipvs mode's IPv6 names (pkg/dataplane/ipvs ipsetName, upstream's NewIPSet), with
	// the two that the 31-character limit cuts.
	for _, want := range []string{"KUBE-6-CLUSTER-IP", "KUBE-6-LOAD-BALANCER-SOURCE-CID", "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS", "KUBE-6-SLUICE-NO-LOCAL-EPS"} {
		if !slices.Contains(v6, want) {
			t.Errorf("IPv6 sets %v lack %s", v6, want)
		}
	}
	for _, name := range v6 {
		if !strings.HasPrefix(name, "KUBE-6-") || len(name) > maxIPSetNameLength {
			t.Errorf("IPv6 set name %q: want the KUBE-6- prefix and at most %d characters", name, maxIPSetNameLength)
		}
		if slices.Contains(v4, name) {
			t.Errorf("set %s is in both families' lists", name)
		}
	}
	if len(v4) != len(v6) {
		t.Errorf("%d IPv4 sets, %d IPv6 sets", len(v4), len(v6))
	}
}

// fakeIPSetKernel holds sets by name; inUse ones refuse to be destroyed, as the kernel
// refuses a set an iptables rule references.
type fakeIPSetKernel struct {
	sets      map[string]bool
	inUse     map[string]bool
	destroyed []string
}

func (k *fakeIPSetKernel) exists(name string) bool { return k.sets[name] }

func (k *fakeIPSetKernel) destroy(name string) error {
	if k.inUse[name] {
		return errors.New("set is in use by a rule")
	}
	delete(k.sets, name)
	k.destroyed = append(k.destroyed, name)
	return nil
}

func TestDestroyIPSetsDestroysOnlyTheFamilysExistingSets(t *testing.T) {
	k := &fakeIPSetKernel{
		sets: map[string]bool{
			"KUBE-CLUSTER-IP": true, "KUBE-SLUICE-NO-LOCAL-EPS": true,
			"KUBE-6-CLUSTER-IP": true, "KUBE-6-LOAD-BALANCER-SOURCE-CID": true, "KUBE-6-SLUICE-NO-LOCAL-EPS": true,
			"KUBE-6-IPVS-IPS": true,
			"OTHER-SET":       true,
		},
		inUse: map[string]bool{"KUBE-6-IPVS-IPS": true},
	}
	n, err := destroyIPSets(k, IPVSIPSetNames(model.IPv6))
	if err == nil || !strings.Contains(err.Error(), "KUBE-6-IPVS-IPS") {
		t.Errorf("error = %v, want one naming the set still in use", err)
	}
	want := []string{"KUBE-6-CLUSTER-IP", "KUBE-6-LOAD-BALANCER-SOURCE-CID", "KUBE-6-SLUICE-NO-LOCAL-EPS"}
	slices.Sort(k.destroyed)
	if n != len(want) || !slices.Equal(k.destroyed, want) {
		t.Errorf("destroyed %d: %v, want %v", n, k.destroyed, want)
	}
	for _, keep := range []string{"KUBE-CLUSTER-IP", "KUBE-SLUICE-NO-LOCAL-EPS", "KUBE-6-IPVS-IPS", "OTHER-SET"} {
		if !k.sets[keep] {
			t.Errorf("%s was destroyed", keep)
		}
	}
}
