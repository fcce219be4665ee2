package dataplane

import (
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// protocols are the Service protocols with their IP protocol number and the lower-case
// name nft and ipvsadm print for it: the one mapping between the three for every backend.
var protocols = []struct {
	proto  model.Protocol
	number uint8
	name   string
}{
	{model.TCP, unix.IPPROTO_TCP, "tcp"},
	{model.UDP, unix.IPPROTO_UDP, "udp"},
	{model.SCTP, unix.IPPROTO_SCTP, "sctp"},
}

// ProtoNumber is the IP protocol number of a Service protocol; ok is false for a protocol
// the model does not know, so that each caller chooses its fallback.
func ProtoNumber(p model.Protocol) (n uint8, ok bool) {
	for _, e := range protocols {
		if e.proto == p {
			return e.number, true
		}
	}
	return 0, false
}

// ProtoFromNumber is the Service protocol of IP protocol number n; ok is false for a
// protocol a Service cannot carry.
func ProtoFromNumber(n uint8) (p model.Protocol, ok bool) {
	for _, e := range protocols {
		if e.number == n {
			return e.proto, true
		}
	}
	return "", false
}

// ProtoName is the lower-case name of IP protocol number n as nft and ipvsadm print it
// ("tcp", "udp", "sctp"); ok is false for a protocol a Service cannot carry, so that each
// caller chooses how to print an unexpected number.
func ProtoName(n uint8) (name string, ok bool) {
	for _, e := range protocols {
		if e.number == n {
			return e.name, true
		}
	}
	return "", false
}
