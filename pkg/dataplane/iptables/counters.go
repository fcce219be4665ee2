package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// perChainReadMax is the number of counted chains up to which a read in the nft flavour
// lists each chain's first rule (`iptables -t nat -S CHAIN 1 -v`); above it one `iptables-save -c -t nat` is cheaper than that many runs.
// The legacy flavour always reads one iptables-save: each legacy run copies the whole
// table out of the kernel (10 runs took over 30 s at 10 000 Services x 10 endpoints on a
// loaded machine, one save 3 s: BenchmarkReadTrafficCounters).
const perChainReadMax = 64

// counterReadTimeout bounds one read of the traffic counters.
const counterReadTimeout = 30 * time.Second

var _ dataplane.TrafficCounterReader = (*Backend)(nil)

// ReadTrafficCounters reads the counter rules of the counted Service ports' path chains
// in nat (new connections) and of their packet counter chains in mangle (packets and
// bytes; README, "Traffic counters"): one iptables-save per table (or, in the nft flavour
// with few counted nat chains, one listing per chain). It runs the iptables programs
// itself and never waits for an Apply; with the legacy flavour it may wait for the
// xtables lock while a restore holds it, the restore never waits for it longer than one
// listing.
func (b *Backend) ReadTrafficCounters() ([]dataplane.TrafficCount, error) {
	n := b.counters.Len()
	if n == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), counterReadTimeout)
	defer cancel()
	chains := b.counters.Chains()
	var natChains, mangleChains []string
	for _, c := range chains {
		if isPacketChain(c) {
			mangleChains = append(mangleChains, c)
		} else {
			natChains = append(natChains, c)
		}
	}
	raw, err := b.readCounterRules(ctx, natChains)
	if err != nil {
		return nil, err
	}
	if len(mangleChains) > 0 {
		// A timeout of its own: a slow nat read must not starve it.
		mctx, mcancel := context.WithTimeout(context.Background(), counterReadTimeout)
		defer mcancel()
		packets, err := b.readPacketCounters(mctx, mangleChains)
		if err != nil {
			return nil, err
		}
		for c, n := range packets {
			raw[c] = n
		}
	}
	raw = b.restarts.fold(raw, chains, false)
	out := make(map[string]dataplane.ChainCount, len(raw))
	for chain, c := range raw {
		out[chain] = dataplane.ChainCount{Packets: c.packets, Bytes: c.bytes}
	}
	return b.counters.Resolve(out), nil
}

// ruleCount is a rule's counters.
type ruleCount struct{ packets, bytes uint64 }

// restartFold keeps the counts of counter rules monotonic when the kernel restarts them
// from zero although the backend carried them: ip6tables-nft-restore 1.8.9 (Debian 12)
// ignores "[packets:bytes]" and "-c" for IPv6 rules, so every rewrite of a counted chain
// would restart its counter in that flavour and family. Every read goes through fold,
// the one just before a rewrite included (carryCounts), so only what was counted between
// that read and the restore is lost, as with a carry that works. Where the carry works a
// value never goes down and the fold adds nothing.
type restartFold struct {
	mu sync.Mutex
	// last is the kernel's value at the last read; base what restarts took away.
	last, base map[string]ruleCount
}

// fold returns raw plus what earlier restarts took from each chain. keep, when not nil,
// is the full list of counted chains: the others are forgotten. carried says the result
// is about to be written to the kernel: the kernel then holds it all, or (a restore that
// ignores it) restarts from zero, which the next read folds in.
func (f *restartFold) fold(raw map[string]ruleCount, keep []string, carried bool) map[string]ruleCount {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last, f.base = map[string]ruleCount{}, map[string]ruleCount{}
	}
	if keep != nil {
		counted := make(map[string]bool, len(keep))
		for _, c := range keep {
			counted[c] = true
		}
		for c := range f.last {
			if !counted[c] {
				delete(f.last, c)
				delete(f.base, c)
			}
		}
	}
	out := make(map[string]ruleCount, len(raw))
	for chain, cur := range raw {
		last, seen := f.last[chain]
		base := f.base[chain]
		if seen && (cur.packets < last.packets || cur.bytes < last.bytes) {
			base.packets += last.packets
			base.bytes += last.bytes
			f.base[chain] = base
		}
		total := ruleCount{packets: base.packets + cur.packets, bytes: base.bytes + cur.bytes}
		f.last[chain] = cur
		if carried {
			f.last[chain], f.base[chain] = total, ruleCount{}
		}
		out[chain] = total
	}
	return out
}

// readCounterRules returns the counter rule's counts of those of chains that are in the
// kernel.
func (b *Backend) readCounterRules(ctx context.Context, chains []string) (map[string]ruleCount, error) {
	out := make(map[string]ruleCount, len(chains))
	if b.tools.Flavour == FlavourNFT && len(chains) <= perChainReadMax {
		for _, chain := range chains {
			args := []string{"--wait", strconv.Itoa(b.tools.WaitSeconds), "-t", tableNAT, "-S", chain, "1", "-v"}
			stdout, _, err := b.tools.Cmd.Run(ctx, b.tools.IPTables, args, nil)
			if err != nil {
				continue // not (yet, or any more) in the kernel
			}
			if c, ok := parseListedCounter(string(bytes.TrimSpace(stdout))); ok {
				out[chain] = c
			}
		}
		return out, nil
	}
	return b.readSavedCounters(ctx, tableNAT, chains)
}

// readPacketCounters returns the counts of the mangle counter chains among chains that
// are in the kernel: one iptables-save of mangle, whatever their number.
func (b *Backend) readPacketCounters(ctx context.Context, chains []string) (map[string]ruleCount, error) {
	return b.readSavedCounters(ctx, tableMangle, chains)
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

// carryCounts reads the counts of the counted chains of services that are in the
// kernel, so that rewriting them (a flush and refill, which restarts a rule's counters)
// carries the counts over. A failed read is logged and carries nothing: the collector
// then sees the counter restart, and adds what it counts from there.
// rewritten, when not nil, says which chains are about to be rewritten.
func (b *Backend) carryCounts(ctx context.Context, services []*serviceRules, rewritten func(chain string) bool) {
	var chains []string
	for _, s := range services {
		for _, sp := range s.ports {
			if sp.Counted {
				for _, cp := range countedChains(sp) {
					if rewritten == nil || rewritten(cp.Chain) {
						chains = append(chains, cp.Chain)
					}
				}
			}
		}
	}
	if len(chains) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, counterReadTimeout)
	defer cancel()
	counts, err := b.readCounterRules(ctx, chains)
	if err != nil {
		b.logger.Error(err, "Failed to read the traffic counters of the chains about to be rewritten; their counts restart")
		return
	}
	// What the kernel holds now is carried (written as [packets:bytes]); the fold gets
	// the same, for the restore that does not take it (ip6tables-nft 1.8.9). The counts
	// it returns are those written: the kernel's plus what a restart already folded in.
	counts = b.restarts.fold(counts, nil, true)
	for _, s := range services {
		for _, c := range s.natChains {
			if n, ok := counts[c.name]; ok {
				if s.carry == nil {
					s.carry = map[string]ruleCount{}
				}
				s.carry[c.name] = n
			}
		}
	}
}

// parseListedCounter reads `-A CHAIN -m comment --comment "… traffic counter" -c P B`.
func parseListedCounter(l string) (ruleCount, bool) {
	if !strings.Contains(l, counterComment+`"`) {
		return ruleCount{}, false
	}
	i := strings.LastIndex(l, " -c ")
	if i < 0 {
		return ruleCount{}, false
	}
	f := strings.Fields(l[i+4:])
	if len(f) < 2 {
		return ruleCount{}, false
	}
	p, err1 := strconv.ParseUint(f[0], 10, 64)
	by, err2 := strconv.ParseUint(f[1], 10, 64)
	return ruleCount{p, by}, err1 == nil && err2 == nil
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
