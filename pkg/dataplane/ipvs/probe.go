// Package ipvs is sluice's IPVS backend: it programs the kernel's IP Virtual Server through
// generic netlink (github.com/moby/ipvs), with a dummy interface holding the Service addresses.
//
// This file holds the kernel probe the backend starts with. Its tests that need a kernel with
// IPVS run in a VM on Debian's stock kernel: hack/ipvs-vm.sh, see hack/vm/README.md.
package ipvs

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// GenlFamily is the generic-netlink family the ip_vs module registers (IPVS_GENL_NAME in
// include/uapi/linux/ip_vs.h). Every IPVS command travels in a message of this family.
const GenlFamily = "IPVS"

// KernelSupportsIPVS reports whether the running kernel serves IPVS, by asking the
// generic-netlink controller for the "IPVS" family.
//
// Asking is the only reliable test. github.com/moby/ipvs looks the family up once, and when the
// lookup fails it keeps family ID 0 and carries on: its requests then go out with netlink
// message type 0, which the kernel treats as a control message and acknowledges without looking
// at it. Every call (NewService, NewDestination, Flush ...) reports success and nothing is
// programmed, so a backend that trusted those errors would report healthy syncs on a kernel that
// drops every Service.
//
// The lookup also loads ip_vs when it is a module that is not loaded yet: the kernel asks
// modprobe for the alias "net-pf-16-proto-16-family-IPVS", which ip_vs declares. A kernel
// without IPVS answers ENOENT, reported as (false, nil); any other failure is an error.
// Generic-netlink families are global, so the answer holds in every network namespace.
func KernelSupportsIPVS() (bool, error) {
	_, err := netlink.GenlFamilyGet(GenlFamily)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	default:
		return false, fmt.Errorf("look up generic netlink family %q: %w", GenlFamily, err)
	}
}
