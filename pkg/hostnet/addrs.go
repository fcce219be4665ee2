package hostnet

import (
	"fmt"
	"net"
	"net/netip"
)

// InterfaceAddrs returns the addresses of every interface of this network namespace, up or
// down, IPv4-mapped IPv6 addresses unmapped. The order is the kernel's.
func InterfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	return addrsOf(addrs), nil
}

// addrsOf converts what net.InterfaceAddrs returns (*net.IPNet on Linux; *net.IPAddr on
// some other systems) and skips anything else.
func addrsOf(addrs []net.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		default:
			continue
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, addr.Unmap())
		}
	}
	return out
}
