// Package require decides what a test does when the machine lacks something it needs: skip
// where that is expected, fail where the environment promised it.
//
// A test that needs a feature the kernel or the machine may lack (SCTP sockets, IPVS,
// iptables-legacy, ...) probes for it and calls Feature with the answer. Without the
// feature the test skips, unless $SLUICE_REQUIRE names it: then the test fails, because the
// environment that set SLUICE_REQUIRE (CI's host tiers, the IPVS VM) is known to have it and
// a skip there would silently drop the claim the test proves.
//
//	require.Feature(t, require.SCTP, echo.SCTPSupported(), "kernel has no SCTP sockets")
//
// SLUICE_REQUIRE is a comma-separated list of the feature names below. A name this package
// does not know fails every test that consults the list, so a typo cannot turn a
// requirement off. The scripts that run the tiers set it (hack/lib/require.sh).
package require

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// Env is the environment variable listing the required features.
const Env = "SLUICE_REQUIRE"

// The features tests probe for. Each constant's comment says what "present" means.
const (
	// Root: the test runs as root (network namespaces, netfilter).
	Root = "root"
	// IPv6: the kernel has IPv6 enabled, so sluice proxies both families.
	IPv6 = "ipv6"
	// SCTP: the kernel has SCTP sockets (the sctp module).
	SCTP = "sctp"
	// IPVS: the kernel has IPVS (its generic-netlink family answers).
	IPVS = "ipvs"
	// NoIPVS: the kernel has no IPVS, so the tests of sluice's behaviour without it can run.
	NoIPVS = "no-ipvs"
	// IPSet: the kernel has ipset (ip_set and the hash and bitmap types the ipvs mode uses).
	IPSet = "ipset"
	// IPTablesLegacy: iptables-legacy-restore is installed.
	IPTablesLegacy = "iptables-legacy"
	// IPTablesNFT: iptables-nft-restore is installed.
	IPTablesNFT = "iptables-nft"
	// NFT: nft(8) is installed.
	NFT = "nft"
	// ImageRelease: the machine runs the Debian release the container image is built on, so
	// dpkg can answer questions about the image's packages.
	ImageRelease = "image-release"
	// Loopback: the test's network namespace has a loopback address.
	Loopback = "loopback"
)

// Known lists every feature name SLUICE_REQUIRE may hold.
var Known = []string{Root, IPv6, SCTP, IPVS, NoIPVS, IPSet, IPTablesLegacy, IPTablesNFT, NFT, ImageRelease, Loopback}

// Feature returns when have is true. Otherwise it skips t with why, or, when $SLUICE_REQUIRE
// names feature, fails t with why and the reason the environment expected the feature.
func Feature(t testing.TB, feature string, have bool, why string) {
	t.Helper()
	if !slices.Contains(Known, feature) {
		t.Fatalf("require.Feature: unknown feature %q (known: %s)", feature, strings.Join(Known, ", "))
	}
	required, err := Required()
	if err != nil {
		t.Fatal(err)
	}
	if have {
		return
	}
	if slices.Contains(required, feature) {
		t.Fatalf("%s: %s requires %q here, so this test must run, not skip", why, Env, feature)
	}
	t.Skipf("%s (feature %q; %s=%s would make this a failure)", why, feature, Env, feature)
}

// Required returns the features $SLUICE_REQUIRE names, or an error naming any it does not know.
func Required() ([]string, error) {
	return parse(os.Getenv(Env))
}

func parse(list string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(Known, f) {
			return nil, fmt.Errorf("%s=%q: unknown feature %q (known: %s)", Env, list, f, strings.Join(Known, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}
