package leftovers

import (
	"errors"
	"fmt"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// IPVSDevice is the dummy device the ipvs mode binds every Service IP to, so that the node
// accepts packets for them.
const IPVSDevice = "kube-ipvs0"

// KernelHasIPVS reports whether the kernel has IPVS (its generic netlink family is
// registered). moby/ipvs reports success for every call on a kernel without IPVS, so a
// caller that wants to know whether a flush did anything asks first.
func KernelHasIPVS() bool {
	_, err := netlink.GenlFamilyGet("IPVS")
	return err == nil
}

// RemoveIPVSServersAndDevice removes what the ipvs mode leaves for a node that switches to
// another mode: every IPVS virtual server (when the kernel has IPVS), and kube-ipvs0, which
// holds every ClusterIP as a local address (with it the node would answer ClusterIP traffic
// itself). It does so only if kube-ipvs0 exists: that is the evidence the ipvs mode ran
// here, and other users of IPVS are left alone otherwise. found reports whether kube-ipvs0
// existed; the device is deleted even when the flush fails.
func RemoveIPVSServersAndDevice() (found bool, err error) {
	link, err := netlink.LinkByName(IPVSDevice)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return false, nil
		}
		return false, fmt.Errorf("look up %s: %w", IPVSDevice, err)
	}
	var errs []error
	if KernelHasIPVS() {
		h, err := ipvs.New("")
		if err != nil {
			errs = append(errs, fmt.Errorf("open IPVS: %w", err))
		} else {
			if err := h.Flush(); err != nil {
				errs = append(errs, fmt.Errorf("flush IPVS virtual servers: %w", err))
			}
			h.Close()
		}
	}
	if err := netlink.LinkDel(link); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", IPVSDevice, err))
	}
	return true, errors.Join(errs...)
}
