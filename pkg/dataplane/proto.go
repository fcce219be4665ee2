package dataplane

import "golang.org/x/sys/unix"

// ProtoName is the lower-case name of IP protocol number n as nft and ipvsadm print it
// ("tcp", "udp", "sctp"); ok is false for a protocol a Service cannot carry, so that each
// caller chooses how to print an unexpected number.
func ProtoName(n uint8) (name string, ok bool) {
	switch n {
	case unix.IPPROTO_TCP:
		return "tcp", true
	case unix.IPPROTO_UDP:
		return "udp", true
	case unix.IPPROTO_SCTP:
		return "sctp", true
	}
	return "", false
}
