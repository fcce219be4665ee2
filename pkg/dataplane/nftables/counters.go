package nftables

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
)

// perChainDumpMax is the number of counted chains up to which a read asks for each
// chain's rules; above it, one dump of the whole table is cheaper than that many
// requests.
const perChainDumpMax = 256

var _ dataplane.TrafficCounterReader = (*Backend)(nil)

// ReadTrafficCounters reads the counters of the counted Service ports' path chains
// (README, "Traffic counters"). It uses a netlink socket of its own and never waits for
// an Apply: it may run on any goroutine, for example a metrics scrape.
func (b *Backend) ReadTrafficCounters() ([]dataplane.TrafficCount, error) {
	n := b.counters.Len()
	if n == 0 {
		return nil, nil
	}
	raw := make(map[string]dataplane.ChainCount, n)
	seen := make(map[string]bool, n)
	fn := func(chain string, r rawRule) {
		if seen[chain] {
			return // the counter is the chain's first rule
		}
		seen[chain] = true
		// A path chain (nat) sees a connection's first packet only: the index takes its
		// packets for new connections; a packet counter chain sees every packet.
		// A chain without a leading counter is there, and counts nothing.
		pkts, bytes, _ := leadingCounter(r.exprs)
		raw[chain] = dataplane.ChainCount{Packets: pkts, Bytes: bytes}
	}
	fam := byte(b.f.nf)
	if n <= perChainDumpMax {
		for _, chain := range b.counters.Chains() {
			// A chain that is not (yet) in the kernel answers ENOENT.
			if err := dumpWithRetry(b.rc, fam, chain, fn); err != nil && !errors.Is(err, unix.ENOENT) {
				return nil, fmt.Errorf("read the counters of chain %s: %w", chain, err)
			}
		}
	} else if err := dumpWithRetry(b.rc, fam, "", fn); err != nil {
		return nil, fmt.Errorf("read the counters of the %s table: %w", b.f.name, err)
	}
	return b.counters.Resolve(raw), nil
}

// dumpWithRetry dumps rules, once more if a change interrupted the dump.
func dumpWithRetry(c *conn, fam byte, chain string, fn func(chain string, r rawRule)) error {
	err := dumpRules(c, fam, chain, fn)
	if errors.Is(err, errDumpInterrupted) {
		err = dumpRules(c, fam, chain, fn)
	}
	return err
}

// leadingCounter returns the values of a rule whose first expression is a counter.
func leadingCounter(exprs []byte) (packets, bytes uint64, ok bool) {
	it := nlattr.NewIter(exprs)
	for it.Next() {
		if it.Type() != unix.NFTA_LIST_ELEM {
			continue
		}
		var name string
		var data []byte
		for e := nlattr.NewIter(it.Value()); e.Next(); {
			switch e.Type() {
			case unix.NFTA_EXPR_NAME:
				name = nlattr.String(e.Value())
			case unix.NFTA_EXPR_DATA:
				data = e.Value()
			}
		}
		if name != "counter" {
			return 0, 0, false
		}
		for d := nlattr.NewIter(data); d.Next(); {
			switch d.Type() {
			case unix.NFTA_COUNTER_PACKETS:
				packets = nlattr.Uint64(d.Value())
			case unix.NFTA_COUNTER_BYTES:
				bytes = nlattr.Uint64(d.Value())
			}
		}
		return packets, bytes, true
	}
	return 0, 0, false
}
