package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Choosing the flavour. A node must use one flavour for everything: rules of both are
// active at once, and kube-proxy's, kubelet's and the CNI's rules only work together in the
// same one. Upstream's kube-proxy image settles this with iptables-wrapper, which sluice
// follows:
//
//  1. kubelet (1.24+) creates KUBE-IPTABLES-HINT and KUBE-KUBELET-CANARY in mangle in the
//     flavour it uses: if one flavour has them, use it;
//  2. otherwise use the flavour that holds more (here: more chains in filter, nat and
//     mangle; counting rules would mean running iptables-nft-save, which takes seconds on
//     large rulesets);
//  3. otherwise the flavour installed as `iptables`.

// flavourChoice is the outcome of detectFlavour.
type flavourChoice struct {
	flavour, installed Flavour
	reason             string
}

// installedFlavour asks `iptables --version` ("iptables v1.8.9 (nf_tables)").
func installedFlavour(ctx context.Context, cmd commander, family model.IPFamily) (Flavour, error) {
	name := "iptables"
	if family == model.IPv6 {
		name = "ip6tables"
	}
	out, stderr, err := cmd.Run(ctx, name, []string{"--version"}, nil)
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", name, err, bytes.TrimSpace(stderr))
	}
	switch {
	case bytes.Contains(out, []byte("nf_tables")):
		return FlavourNFT, nil
	case bytes.Contains(out, []byte("legacy")):
		return FlavourLegacy, nil
	}
	// iptables before 1.8 has no flavour in its version string and is legacy.
	return FlavourLegacy, nil
}

// flavourProbe reads what each flavour holds. It is a seam: tests answer from a script.
type flavourProbe interface {
	// inUse reports whether the flavour has any table in this network namespace, without
	// creating one.
	inUse(f Flavour) bool
	// mangleHasHint reports whether kubelet's hint or canary chain is in the flavour's
	// mangle table.
	mangleHasHint(ctx context.Context, f Flavour) bool
	// chainCount counts the chains of filter, nat and mangle.
	chainCount(ctx context.Context, f Flavour) int
	// hasOwnedChains reports whether the flavour holds chains of kube-proxy's iptables or
	// ipvs mode.
	hasOwnedChains(ctx context.Context, f Flavour) bool
}

func detectFlavour(ctx context.Context, cmd commander, probe flavourProbe, family model.IPFamily) (flavourChoice, error) {
	installed, err := installedFlavour(ctx, cmd, family)
	if err != nil {
		return flavourChoice{}, err
	}
	choice := flavourChoice{flavour: installed, installed: installed, reason: "installed as iptables"}
	available := func(f Flavour) bool {
		if f == installed {
			return true
		}
		_, restore, _ := toolNames(family, f, installed)
		_, err := cmd.LookPath(restore)
		return err == nil
	}
	flavours := []Flavour{FlavourNFT, FlavourLegacy}
	for _, f := range flavours {
		if available(f) && probe.inUse(f) && probe.mangleHasHint(ctx, f) {
			return flavourChoice{flavour: f, installed: installed, reason: "kubelet's hint chain is in this flavour"}, nil
		}
	}
	counts := map[Flavour]int{}
	for _, f := range flavours {
		if available(f) && probe.inUse(f) {
			counts[f] = probe.chainCount(ctx, f)
		}
	}
	switch {
	case counts[FlavourNFT] > counts[FlavourLegacy]:
		choice.flavour, choice.reason = FlavourNFT, fmt.Sprintf("it holds more chains (%d against %d)", counts[FlavourNFT], counts[FlavourLegacy])
	case counts[FlavourLegacy] > counts[FlavourNFT]:
		choice.flavour, choice.reason = FlavourLegacy, fmt.Sprintf("it holds more chains (%d against %d)", counts[FlavourLegacy], counts[FlavourNFT])
	}
	return choice, nil
}

// systemProbe is the real flavourProbe.
type systemProbe struct {
	cmd    commander
	family model.IPFamily
}

func (p systemProbe) inUse(f Flavour) bool {
	if f == FlavourLegacy {
		// The legacy tables of a namespace are created on first use; the list of
		// instantiated ones is in /proc.
		name := "/proc/net/ip_tables_names"
		if p.family == model.IPv6 {
			name = "/proc/net/ip6_tables_names"
		}
		b, err := os.ReadFile(name)
		return err == nil && len(bytes.TrimSpace(b)) > 0
	}
	return len(p.nftTables()) > 0
}

// nftTables lists the iptables-nft tables (filter, nat, mangle, raw, security) over netlink.
func (p systemProbe) nftTables() map[string]bool {
	c, err := nftables.New()
	if err != nil {
		return nil
	}
	f := nftables.TableFamilyIPv4
	if p.family == model.IPv6 {
		f = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(f)
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, t := range tables {
		switch t.Name {
		case "filter", "nat", "mangle", "raw", "security":
			out[t.Name] = true
		}
	}
	return out
}

func (p systemProbe) mangleHasHint(ctx context.Context, f Flavour) bool {
	if f == FlavourNFT && !p.nftTables()[tableMangle] {
		return false
	}
	_, _, save := toolNames(p.family, f, "")
	out, _, err := p.cmd.Run(ctx, save, []string{"-t", tableMangle}, nil)
	if err != nil {
		return false
	}
	return bytes.Contains(out, []byte(":KUBE-IPTABLES-HINT ")) || bytes.Contains(out, []byte(":KUBE-KUBELET-CANARY "))
}

func (p systemProbe) chainCount(ctx context.Context, f Flavour) int {
	if f == FlavourNFT {
		n := 0
		for _, table := range []string{tableFilter, tableNAT, tableMangle} {
			chains, err := listNFTChains(p.family, table)
			if err == nil {
				n += len(chains)
			}
		}
		return n
	}
	_, _, save := toolNames(p.family, f, "")
	out, _, err := p.cmd.Run(ctx, save, nil, nil)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, ":") {
			n++
		}
	}
	return n
}

func (p systemProbe) hasOwnedChains(ctx context.Context, f Flavour) bool {
	for _, table := range []string{tableNAT, tableFilter} {
		var chains map[string]bool
		if f == FlavourNFT {
			c, err := listNFTChains(p.family, table)
			if err != nil {
				continue
			}
			chains = c
		} else {
			_, _, save := toolNames(p.family, f, "")
			out, _, err := p.cmd.Run(ctx, save, []string{"-t", table}, nil)
			if err != nil {
				continue
			}
			chains, _ = parseSave(out)
		}
		for c := range chains {
			if ownedByIPTablesMode(table, c) {
				return true
			}
		}
	}
	return false
}
