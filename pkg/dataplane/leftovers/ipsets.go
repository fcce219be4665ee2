package leftovers

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// ipvsIPSets are the ipvs mode's ipsets, by their IPv4 names: upstream's
// (pkg/proxy/ipvs/ipset.go) and sluice's own KUBE-SLUICE-NO-LOCAL-EPS and
// KUBE-SLUICE-NO-ENDPOINTS-TCP. The ipvs backend
// keeps them with their types in pkg/dataplane/ipvs/names.go; a test there checks that this
// list names the same sets.
var ipvsIPSets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL", "KUBE-LOAD-BALANCER",
	"KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
	"KUBE-SLUICE-NO-LOCAL-EPS", "KUBE-SLUICE-NO-ENDPOINTS-TCP",
}

// maxIPSetNameLength is the kernel's limit on ipset names (IPSET_MAXNAMELEN - 1).
const maxIPSetNameLength = 31

// IPVSIPSetNames returns the names of the ipvs mode's ipsets in one family. ipset names are
// global to the network namespace, so the ipvs mode keeps the IPv4 names and names the IPv6
// sets "KUBE-6-...", cut to the kernel's 31 characters (KUBE-6-LOAD-BALANCER-SOURCE-CID).
func IPVSIPSetNames(family model.IPFamily) []string {
	names := make([]string, 0, len(ipvsIPSets))
	for _, name := range ipvsIPSets {
		if family == model.IPv6 {
			name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
			if len(name) > maxIPSetNameLength {
				name = name[:maxIPSetNameLength]
			}
		}
		names = append(names, name)
	}
	return names
}

// DestroyIPVSIPSets destroys the ipvs mode's ipsets of one family that exist and returns how
// many it destroyed. It must run after the rules using them are gone: the kernel refuses to
// destroy a set a rule references, and such a set is reported and kept while the others go.
func DestroyIPVSIPSets(family model.IPFamily) (int, error) {
	return destroyIPSets(netlinkIPSets{}, IPVSIPSetNames(family))
}

// ipsetDestroyer is the part of the kernel's ipset interface destroyIPSets needs; a seam for
// tests.
type ipsetDestroyer interface {
	exists(name string) bool
	destroy(name string) error
}

// netlinkIPSets is the kernel's ipsetDestroyer.
type netlinkIPSets struct{}

func (netlinkIPSets) exists(name string) bool {
	_, err := netlink.IpsetList(name)
	return err == nil
}

func (netlinkIPSets) destroy(name string) error { return netlink.IpsetDestroy(name) }

// destroyIPSets destroys every set of names that exists and returns how many it destroyed.
// The failures (a set still referenced by a rule) are joined; the other sets go anyway.
func destroyIPSets(k ipsetDestroyer, names []string) (int, error) {
	var errs []error
	n := 0
	for _, name := range names {
		if !k.exists(name) {
			continue
		}
		if err := k.destroy(name); err != nil {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
