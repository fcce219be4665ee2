package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"
)

// maxProblemsPerService bounds the problems one ComputeService call reports. A slice of
// 10 000 bad endpoints then costs a handful of log lines and one summary, not 10 000 Events
// and megabytes kept in the NodeState.
const maxProblemsPerService = 16

// maxQuotedValue is how much of a bad value a Problem quotes; annotations can be huge.
const maxQuotedValue = 64

// problemList collects the problems of one Service, up to maxProblemsPerService.
type problemList struct {
	service types.NamespacedName
	list    []Problem
	dropped int
}

// add records a problem; the message is only formatted when it will be kept.
func (p *problemList) add(object, field, format string, args ...any) {
	if len(p.list) >= maxProblemsPerService {
		p.dropped++
		return
	}
	p.list = append(p.list, Problem{
		Service: p.service,
		Object:  object,
		Field:   field,
		Message: fmt.Sprintf(format, args...),
	})
}

// result returns the problems, with a summary of those left out.
func (p *problemList) result() []Problem {
	if p.dropped > 0 {
		p.list = append(p.list, Problem{
			Service: p.service,
			Object:  "Service",
			Field:   "",
			Message: fmt.Sprintf("%d more problems not listed", p.dropped),
		})
		p.dropped = 0
	}
	return p.list
}

// quote returns s quoted for a message, cut to maxQuotedValue bytes (on a rune boundary).
func quote(s string) string {
	if len(s) <= maxQuotedValue {
		return strconv.Quote(s)
	}
	cut := maxQuotedValue
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("... (%d bytes)", len(s))
}

// parseIP parses an address the way the API server stored it. IPv4 with leading zeros
// ("010.0.0.1") is accepted as decimal, as upstream's ParseIPSloppy does, because objects
// created before Kubernetes 1.20 may hold such values. IPv4-mapped IPv6 addresses are
// normalised to IPv4. Zoned, unspecified and multicast addresses are refused: none of them
// can be a Service or endpoint address, and programming one (a 0.0.0.0 VIP bound to a dummy
// interface, say) would do harm.
func parseIP(s string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	if err != nil {
		ip := netutils.ParseIPSloppy(s)
		if ip == nil {
			return netip.Addr{}, fmt.Errorf("%s is not an IP address", quote(s))
		}
		addr, _ = netip.AddrFromSlice(ip)
	}
	if addr.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s has an IPv6 zone", quote(s))
	}
	addr = addr.Unmap()
	if addr.IsUnspecified() || addr.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%s is not a unicast address", quote(s))
	}
	return addr, nil
}

// parsePrefix parses a CIDR after trimming white space (loadBalancerSourceRanges validation
// lets padding through). Host bits are cleared, leading zeros in IPv4 are accepted like
// parseIP, and an IPv4-mapped IPv6 prefix becomes the IPv4 prefix it covers.
func parsePrefix(s string) (netip.Prefix, error) {
	trimmed := strings.TrimSpace(s)
	prefix, err := netip.ParsePrefix(trimmed)
	if err != nil {
		_, ipnet, err := netutils.ParseCIDRSloppy(trimmed)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%s is not a CIDR", quote(s))
		}
		addr, _ := netip.AddrFromSlice(ipnet.IP)
		ones, _ := ipnet.Mask.Size()
		prefix = netip.PrefixFrom(addr, ones)
	}
	if addr := prefix.Addr(); addr.Is4In6() {
		if prefix.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%s mixes IPv4-mapped and IPv6 addresses", quote(s))
		}
		prefix = netip.PrefixFrom(addr.Unmap(), prefix.Bits()-96)
	}
	if !prefix.IsValid() {
		return netip.Prefix{}, fmt.Errorf("%s is not a CIDR", quote(s))
	}
	return prefix.Masked(), nil
}

// path is a field path such as spec.ports[2].nodePort, formatted only when a problem is
// reported: most objects have none, and formatting every path would cost an allocation
// per port and per slice.
type path struct {
	base  string
	index int
}

// at returns the path of the element followed by suffix (".port", "" ...).
func (p path) at(suffix string) string { return fmt.Sprintf("%s[%d]%s", p.base, p.index, suffix) }

// validPort reports whether p can be a TCP/UDP/SCTP port number.
func validPort(p int32) bool { return p > 0 && p < 65536 }
