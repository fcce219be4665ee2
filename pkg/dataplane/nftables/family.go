package nftables

import (
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// nft data type identifiers (nftables' src/datatype.h). A set's key type is one of these,
// or several combined by concatType.
const (
	typeVerdict     = 1
	typeInteger     = 4
	typeIPv4Addr    = 7
	typeIPv6Addr    = 8
	typeInetProto   = 12
	typeInetService = 13

	// dataTypeVerdict is the NFTA_SET_DATA_TYPE of a verdict map (NFT_DATA_VERDICT).
	dataTypeVerdict = 0xffffff00
)

// concatType combines data types the way nft does for "a . b . c": six bits per part.
func concatType(types ...uint32) uint32 {
	var t uint32
	for _, x := range types {
		t = t<<6 | x
	}
	return t
}

// family holds what differs between the ip and ip6 tables: address sizes, header offsets,
// and the registers nft(8) picks for concatenations (which we copy so that rules we write
// compare equal, byte for byte, to rules upstream kube-proxy wrote through nft).
type family struct {
	model  model.IPFamily
	nf     nftables.TableFamily
	name   string // "ip" or "ip6", as nft spells the family and the address match
	addrLn int
	// saddrOffset and daddrOffset are the header offsets of the addresses.
	saddrOffset, daddrOffset uint32
	addrType                 uint32
	loopback                 netip.Prefix
	// rejectCode is nft's default "reject": ICMP port unreachable for IPv4, ICMPv6 port
	// unreachable for IPv6.
	rejectCode uint8

	// Registers of "addr . meta l4proto . th dport" (regAddr is always 1).
	regProtoAfterAddr, regPortAfterAddr uint32
	// Registers of "saddr . daddr . meta l4proto . th dport".
	regHairpinDaddr, regHairpinProto, regHairpinPort uint32
	// Register of the port after the address in a numgen "addr . port" map.
	regMapPort uint32
}

var (
	ipv4 = &family{
		model: model.IPv4, nf: nftables.TableFamilyIPv4, name: "ip", addrLn: 4,
		saddrOffset: 12, daddrOffset: 16, addrType: typeIPv4Addr,
		loopback:          netip.MustParsePrefix("127.0.0.0/8"),
		rejectCode:        3, // ICMP_PORT_UNREACH
		regProtoAfterAddr: 9, regPortAfterAddr: 10,
		regHairpinDaddr: 9, regHairpinProto: 10, regHairpinPort: 11,
		regMapPort: 9,
	}
	ipv6 = &family{
		model: model.IPv6, nf: nftables.TableFamilyIPv6, name: "ip6", addrLn: 16,
		saddrOffset: 8, daddrOffset: 24, addrType: typeIPv6Addr,
		loopback:          netip.MustParsePrefix("::1/128"),
		rejectCode:        4, // ICMPV6_PORT_UNREACH
		regProtoAfterAddr: 2, regPortAfterAddr: 13,
		regHairpinDaddr: 2, regHairpinProto: 3, regHairpinPort: 17,
		regMapPort: 2,
	}
)

func familyOf(f model.IPFamily) *family {
	if f == model.IPv6 {
		return ipv6
	}
	return ipv4
}

// addrBytes returns addr in network order, sized for the family.
func (f *family) addrBytes(addr netip.Addr) []byte {
	if f.addrLn == 4 {
		a := addr.Unmap().As4()
		return a[:]
	}
	a := addr.As16()
	return a[:]
}

// natFamily is the NFTA_NAT_FAMILY of this family.
func (f *family) natFamily() uint32 {
	if f.addrLn == 4 {
		return unix.NFPROTO_IPV4
	}
	return unix.NFPROTO_IPV6
}

// protoNumber maps a Service protocol to its IP protocol number (TCP, the API's default,
// for an unknown one).
func protoNumber(p model.Protocol) byte {
	if n, ok := dataplane.ProtoNumber(p); ok {
		return n
	}
	return unix.IPPROTO_TCP
}

func protoName(n byte) string {
	if name, ok := dataplane.ProtoName(n); ok {
		return name
	}
	return "proto" + itoa(int(n))
}
