package dataplane

import (
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// ProtoNumber is the IP protocol number of a Service protocol; ok is false for a protocol
// the model does not know, so that each caller chooses its fallback.
func ProtoNumber(p model.Protocol) (n uint8, ok bool) {
	switch p {
	case model.TCP:
		return unix.IPPROTO_TCP, true
	case model.UDP:
		return unix.IPPROTO_UDP, true
	case model.SCTP:
		return unix.IPPROTO_SCTP, true
	}
	return 0, false
}

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
