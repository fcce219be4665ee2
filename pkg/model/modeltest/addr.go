package modeltest

import "net/netip"

// Addrs parses addresses for a test's expectations; it panics on a bad one.
func Addrs(ss ...string) []netip.Addr { return mustParseAll(ss, netip.MustParseAddr) }

// Prefixes parses CIDRs for a test's expectations; it panics on a bad one.
func Prefixes(ss ...string) []netip.Prefix { return mustParseAll(ss, netip.MustParsePrefix) }

// mustParseAll parses every string of ss; nil (not empty) when ss is empty.
func mustParseAll[T any](ss []string, parse func(string) T) []T {
	var out []T
	for _, s := range ss {
		out = append(out, parse(s))
	}
	return out
}
