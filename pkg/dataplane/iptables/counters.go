package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
)

// counterReadTimeout bounds one read of the traffic counters.
const counterReadTimeout = 30 * time.Second

var _ dataplane.TrafficCounterReader = (*Backend)(nil)

// ReadTrafficCounters reads the counter rules of the counted Service ports' counter
// chains: new connections in nat (SLUICE-NEW{C,L,E}-h), packets and bytes in mangle
// (SLUICE-PKT{C,L,E}-h; README, "Traffic counters"). It never waits for an Apply. The nft
// flavour reads only those chains, over netlink (one request per chain on a connection of
// its own). The legacy flavour runs one `iptables-legacy-save -c -t <table>` per table:
// the kernel hands out a legacy table only whole, whatever is listed, so a read of nat
// copies every rule of it. iptables-legacy-save takes no xtables lock (its table read is
// one atomic getsockopt), so a read never holds up a restore, nor waits for one.
func (b *Backend) ReadTrafficCounters() ([]dataplane.TrafficCount, error) {
	if b.counters.Len() == 0 {
		return nil, nil
	}
	var natChains, mangleChains []string
	for _, c := range b.counters.Chains() {
		if isPacketChain(c) {
			mangleChains = append(mangleChains, c)
		} else {
			natChains = append(natChains, c)
		}
	}
	out := map[string]dataplane.ChainCount{}
	for _, t := range []struct {
		table  string
		chains []string
	}{{tableNAT, natChains}, {tableMangle, mangleChains}} {
		if len(t.chains) == 0 {
			continue
		}
		// A timeout per table: a slow nat read must not starve mangle's.
		ctx, cancel := context.WithTimeout(context.Background(), counterReadTimeout)
		raw, err := b.readCounterRules(ctx, t.table, t.chains)
		cancel()
		if err != nil {
			return nil, err
		}
		for chain, c := range raw {
			out[chain] = dataplane.ChainCount{Packets: c.packets, Bytes: c.bytes}
		}
	}
	return b.counters.Resolve(out), nil
}

// ruleCount is a rule's counters.
type ruleCount struct{ packets, bytes uint64 }

// readCounterRules returns the counts of the counter rules of those of chains (of table)
// that are in the kernel.
func (b *Backend) readCounterRules(ctx context.Context, table string, chains []string) (map[string]ruleCount, error) {
	if b.netlinkReads() {
		read, err := xtables.ReadNFTCounters(b.cfg.Family, table, chains)
		if err != nil {
			return nil, err
		}
		out := make(map[string]ruleCount, len(read))
		for chain, c := range read {
			out[chain] = ruleCount{c.Packets, c.Bytes}
		}
		return out, nil
	}
	return b.readSavedCounters(ctx, table, chains)
}

// netlinkReads reports whether the backend reads iptables-nft's tables over netlink (the
// nft flavour, unless a test asks for iptables-save).
func (b *Backend) netlinkReads() bool {
	return b.tools.Flavour == FlavourNFT && !b.opts.listChains
}

// readSavedCounters reads the counter rules of chains from one `iptables-save -c` of
// table: the first counter rule of each.
func (b *Backend) readSavedCounters(ctx context.Context, table string, chains []string) (map[string]ruleCount, error) {
	out := make(map[string]ruleCount, len(chains))
	stdout, stderr, err := b.tools.Cmd.Run(ctx, b.tools.SaveProgram, []string{"-c", "-t", table}, nil)
	if err != nil {
		return nil, fmt.Errorf("%s -c -t %s: %w: %s", b.tools.SaveProgram, table, err, bytes.TrimSpace(stderr))
	}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	want := make(map[string]bool, len(chains))
	for _, c := range chains {
		want[c] = true
	}
	for sc.Scan() {
		if chain, c, ok := parseSavedCounter(sc.Text()); ok && want[chain] {
			if _, seen := out[chain]; !seen {
				out[chain] = c
			}
		}
	}
	return out, sc.Err()
}

// intactCounterChains returns the new-connection counter chains the kernel holds with
// their one rule (kv: what a full sync read). A full sync leaves them as they are, so
// that they keep counting; the others it writes (or deletes). The nft flavour, whose
// full sync lists chain names only, reads their rules over netlink.
func (b *Backend) intactCounterChains(kv *kernelView) (map[string]bool, error) {
	var chains []string
	for c := range kv.chains[tableNAT] {
		if isNewConnChain(c) {
			chains = append(chains, c)
		}
	}
	if len(chains) == 0 {
		return nil, nil
	}
	intact := make(map[string]bool, len(chains))
	if kv.rules != nil {
		for _, c := range chains {
			if kv.rules[tableNAT][c] == 1 {
				intact[c] = true
			}
		}
		return intact, nil
	}
	read, err := xtables.ReadNFTCounters(b.cfg.Family, tableNAT, chains)
	if err != nil {
		return nil, err
	}
	for c, n := range read {
		if n.Rules == 1 {
			intact[c] = true
		}
	}
	return intact, nil
}

// parseSavedCounter reads `[P:B] -A CHAIN -m comment --comment "… traffic counter"`.
func parseSavedCounter(l string) (string, ruleCount, bool) {
	if !strings.HasPrefix(l, "[") || !strings.HasSuffix(l, counterComment+`"`) {
		return "", ruleCount{}, false
	}
	end := strings.IndexByte(l, ']')
	if end < 0 {
		return "", ruleCount{}, false
	}
	ps, bs, ok := strings.Cut(l[1:end], ":")
	f := strings.Fields(l[end+1:])
	if !ok || len(f) < 2 || f[0] != "-A" {
		return "", ruleCount{}, false
	}
	p, err1 := strconv.ParseUint(ps, 10, 64)
	by, err2 := strconv.ParseUint(bs, 10, 64)
	return f[1], ruleCount{p, by}, err1 == nil && err2 == nil
}
