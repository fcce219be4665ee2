package hostnet

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluiceproxy/sluice/test/require"
)

func TestAddrsOfUnmapsAndSkipsWhatIsNoIP(t *testing.T) {
	tests := []struct {
		name string
		in   []net.Addr
		want []netip.Addr
	}{
		{name: "none", in: nil, want: []netip.Addr{}},
		{
			name: "prefixes as Linux reports them, in order",
			in: []net.Addr{
				&net.IPNet{IP: net.ParseIP("127.0.0.1").To4(), Mask: net.CIDRMask(8, 32)},
				&net.IPNet{IP: net.ParseIP("fd00::2"), Mask: net.CIDRMask(64, 128)},
			},
			want: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("fd00::2")},
		},
		{
			name: "an IPv4 address in 16-byte form is unmapped",
			in:   []net.Addr{&net.IPNet{IP: net.ParseIP("10.0.0.1"), Mask: net.CIDRMask(24, 32)}},
			want: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		},
		{
			name: "bare addresses count too",
			in:   []net.Addr{&net.IPAddr{IP: net.ParseIP("192.0.2.7")}},
			want: []netip.Addr{netip.MustParseAddr("192.0.2.7")},
		},
		{
			name: "other address kinds and malformed IPs are skipped",
			in: []net.Addr{
				&net.UnixAddr{Name: "/run/x.sock", Net: "unix"},
				&net.IPNet{IP: net.IP{1, 2, 3}},
				&net.IPAddr{IP: net.ParseIP("2001:db8::1")},
			},
			want: []netip.Addr{netip.MustParseAddr("2001:db8::1")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := addrsOf(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("addrsOf = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestInterfaceAddrsHasLoopback(t *testing.T) {
	addrs, err := InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	require.Feature(t, require.Loopback, slices.ContainsFunc(addrs, netip.Addr.IsLoopback),
		fmt.Sprintf("no loopback address in this namespace (%v)", addrs))
	for _, a := range addrs {
		if a.Is4In6() {
			t.Errorf("%s is not unmapped", a)
		}
	}
}
