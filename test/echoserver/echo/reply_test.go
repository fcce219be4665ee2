package echo

import (
	"net/netip"
	"testing"
)

func TestReplyRoundTrips(t *testing.T) {
	for _, r := range []Reply{
		{Pod: "a0", Local: netip.MustParseAddrPort("10.244.1.10:8080"), Remote: netip.MustParseAddrPort("172.18.0.3:40000"), Protocol: TCP},
		{Pod: "b1", Local: netip.MustParseAddrPort("[fd00:10:244:2::11]:8080"), Remote: netip.MustParseAddrPort("[fd00:172:18::100]:5353"), Protocol: UDP},
	} {
		got, err := ParseReply(r.String() + "\n")
		if err != nil {
			t.Fatalf("ParseReply(%q): %v", r.String(), err)
		}
		if got != r {
			t.Errorf("round trip of %q gave %+v", r.String(), got)
		}
	}
}

func TestParseReplyRejectsIncompleteLines(t *testing.T) {
	for _, line := range []string{
		"",
		"pod=a0 local=10.0.0.1:80 remote=10.0.0.2:1",            // no proto
		"pod=a0 local=10.0.0.1 remote=10.0.0.2:1 proto=tcp",     // local without port
		"pod=a0 local=10.0.0.1:80 remote=10.0.0.2:1 proto=icmp", // unknown protocol
		"hello world", // not a reply at all
	} {
		if r, err := ParseReply(line); err == nil {
			t.Errorf("ParseReply(%q) = %+v, want an error", line, r)
		}
	}
}

func TestParseReplyIgnoresUnknownFields(t *testing.T) {
	r, err := ParseReply("pod=a0 local=10.0.0.1:80 remote=10.0.0.2:1 proto=sctp node=node-a")
	if err != nil {
		t.Fatal(err)
	}
	if r.Pod != "a0" || r.Protocol != SCTP {
		t.Errorf("got %+v", r)
	}
}
