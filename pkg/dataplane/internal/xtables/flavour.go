package xtables

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/google/nftables"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Choosing the flavour. A node must use one flavour for everything: rules of both are
// active at once, and kube-proxy's, kubelet's and the CNI's rules only work together in
// the same one. Upstream's kube-proxy image settles this with iptables-wrapper; sluice
// follows its order, without running iptables-nft-save (14 s on 110 000 chains) and
// without creating a table by reading it:
//
//  1. kubelet (1.24+) creates KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY in mangle in the
//     flavour it uses: if one flavour has one, use it (nft looked at first, as the wrapper
//     does);
//  2. otherwise use the flavour that holds more chains in filter, nat and mangle (the
//     wrapper counts rules, which would need iptables-nft-save);
//  3. otherwise the flavour installed as `iptables`.
//
// Only flavours whose programs are installed and that have a table in this network
// namespace count in 1 and 2.

// kubeletHintChains are the chains kubelet creates in mangle of the flavour it uses.
var kubeletHintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// Probe reads what each flavour holds, without creating anything. SystemProbe is the
// kernel's; unit tests answer from a script.
type Probe interface {
	// InUse reports whether t's flavour has any table in t's family in this network
	// namespace.
	InUse(t *Tools) bool
	// Chains lists the chains of filter, nat and mangle, by table (a table the flavour
	// does not have is missing).
	Chains(ctx context.Context, t *Tools) (map[string]map[string]bool, error)
}

// Choice is the flavour to use, and why.
type Choice struct {
	Flavour Flavour
	// Installed is the flavour of the plain `iptables` program ("" when it is unknown).
	Installed Flavour
	Reason    string
}

// Installed asks `iptables --version` ("iptables v1.8.9 (nf_tables)"); iptables before
// 1.8 names no flavour and is legacy.
func Installed(ctx context.Context, cmd Commander, family model.IPFamily) (Flavour, error) {
	name := "iptables"
	if family == model.IPv6 {
		name = "ip6tables"
	}
	out, stderr, err := cmd.Run(ctx, name, []string{"--version"}, nil)
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", name, err, bytes.TrimSpace(stderr))
	}
	if bytes.Contains(out, []byte("nf_tables")) {
		return NFT, nil
	}
	return Legacy, nil
}

// Choose returns the flavour configured (configured != "") or, when none is, the one the
// rule above picks, with the programs to use it. It fails when that flavour's programs are
// not installed.
func Choose(ctx context.Context, cmd Commander, probe Probe, family model.IPFamily, configured Flavour) (*Tools, Choice, error) {
	installed, err := Installed(ctx, cmd, family)
	var choice Choice
	switch {
	case configured != "":
		// The configured flavour's own programs are used when `iptables` cannot say what it is.
		choice = Choice{Flavour: configured, Installed: installed, Reason: "configured"}
	case err != nil:
		return nil, Choice{}, err
	default:
		choice = detect(ctx, cmd, probe, family, installed)
	}
	t := NewTools(cmd, family, choice.Flavour, choice.Installed)
	if !t.Available() {
		return nil, choice, fmt.Errorf("iptables flavour %s: %s or %s not found", choice.Flavour, t.RestoreProgram, t.SaveProgram)
	}
	return t, choice, nil
}

func detect(ctx context.Context, cmd Commander, probe Probe, family model.IPFamily, installed Flavour) Choice {
	held := map[Flavour]map[string]map[string]bool{}
	for _, t := range inUse(cmd, probe, family, installed) {
		chains, err := probe.Chains(ctx, t)
		if err != nil {
			continue
		}
		held[t.Flavour] = chains
	}
	for _, f := range Flavours {
		for _, c := range kubeletHintChains {
			if held[f][TableMangle][c] {
				return Choice{Flavour: f, Installed: installed, Reason: "kubelet's hint chain is in this flavour"}
			}
		}
	}
	count := func(f Flavour) int {
		n := 0
		for _, chains := range held[f] {
			n += len(chains)
		}
		return n
	}
	nft, legacy := count(NFT), count(Legacy)
	switch {
	case nft > legacy:
		return Choice{Flavour: NFT, Installed: installed, Reason: fmt.Sprintf("it holds more chains (%d against %d)", nft, legacy)}
	case legacy > nft:
		return Choice{Flavour: Legacy, Installed: installed, Reason: fmt.Sprintf("it holds more chains (%d against %d)", legacy, nft)}
	}
	return Choice{Flavour: installed, Installed: installed, Reason: "installed as iptables"}
}

// ToolsInUse returns the programs of each flavour, legacy then nft, that is installed and
// has a table of family in this network namespace: the flavours that may hold kube-proxy's
// chains. When `iptables --version` fails, which flavour is installed as `iptables` is
// not known, and each flavour's own program names are used.
func ToolsInUse(ctx context.Context, cmd Commander, probe Probe, family model.IPFamily) []*Tools {
	installed, err := Installed(ctx, cmd, family)
	if err != nil {
		installed = ""
	}
	return inUse(cmd, probe, family, installed)
}

// inUse returns the programs of each flavour, legacy then nft, that is installed and in
// use, installed being the flavour of `iptables`.
func inUse(cmd Commander, probe Probe, family model.IPFamily, installed Flavour) []*Tools {
	var out []*Tools
	for _, f := range []Flavour{Legacy, NFT} {
		if t := NewTools(cmd, family, f, installed); t.Available() && probe.InUse(t) {
			out = append(out, t)
		}
	}
	return out
}

// SystemProbe is the kernel's Probe.
type SystemProbe struct{}

// iptablesNFTTables are the tables iptables-nft creates in nf_tables.
var iptablesNFTTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// InUse implements Probe: legacy tables of a namespace are created on first use and
// listed in /proc; iptables-nft's are asked for over netlink.
func (SystemProbe) InUse(t *Tools) bool {
	if t.Flavour == Legacy {
		name := "/proc/net/ip_tables_names"
		if t.Family == model.IPv6 {
			name = "/proc/net/ip6_tables_names"
		}
		b, err := os.ReadFile(name)
		return err == nil && len(bytes.TrimSpace(b)) > 0
	}
	c, err := nftables.New()
	if err != nil {
		return false
	}
	tf := nftables.TableFamilyIPv4
	if t.Family == model.IPv6 {
		tf = nftables.TableFamilyIPv6
	}
	tables, err := c.ListTablesOfFamily(tf)
	if err != nil {
		return false
	}
	for _, t := range tables {
		if iptablesNFTTables[t.Name] {
			return true
		}
	}
	return false
}

// Chains implements Probe: the nft flavour's chains are listed over netlink (no
// iptables-nft-save); the legacy flavour's come from one iptables-save of every table it
// has (naming a table with -t would create it).
func (SystemProbe) Chains(ctx context.Context, t *Tools) (map[string]map[string]bool, error) {
	out := map[string]map[string]bool{}
	if t.Flavour == NFT {
		for _, table := range []string{TableFilter, TableNAT, TableMangle} {
			chains, err := ListNFTChains(t.Family, table)
			if err != nil {
				return nil, err
			}
			if len(chains) > 0 {
				out[table] = chains
			}
		}
		return out, nil
	}
	tables, err := ReadSaved(ctx, t)
	if err != nil {
		return nil, err
	}
	for _, table := range []string{TableFilter, TableNAT, TableMangle} {
		if st := tables[table]; st != nil {
			out[table] = st.ChainSet()
		}
	}
	return out, nil
}

// HasChains reports whether t's flavour holds a chain owned(table, chain) selects in
// filter, nat or mangle.
func HasChains(ctx context.Context, probe Probe, t *Tools, owned func(table, chain string) bool) (bool, error) {
	held, err := probe.Chains(ctx, t)
	if err != nil {
		return false, err
	}
	for table, chains := range held {
		for c := range chains {
			if owned(table, c) {
				return true, nil
			}
		}
	}
	return false, nil
}
