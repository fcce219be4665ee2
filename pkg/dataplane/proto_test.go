package dataplane

import (
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestProtoNumberAndName(t *testing.T) {
	for _, tc := range []struct {
		proto model.Protocol
		name  string
	}{
		{model.TCP, "tcp"},
		{model.UDP, "udp"},
		{model.SCTP, "sctp"},
	} {
		n, ok := ProtoNumber(tc.proto)
		if !ok {
			t.Fatalf("ProtoNumber(%s) not known", tc.proto)
		}
		if name, ok := ProtoName(n); !ok || name != tc.name {
			t.Errorf("ProtoName(%d) = %q, %v; want %q", n, name, ok, tc.name)
		}
	}
	if _, ok := ProtoNumber("ICMP"); ok {
		t.Error("ProtoNumber(ICMP) is known")
	}
	if _, ok := ProtoName(1); ok {
		t.Error("ProtoName(1) is known")
	}
}
