package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
	"github.com/sluiceproxy/sluice/pkg/metrics"
)

// The conntrack table's health: how full it is and what the kernel's statistics say,
// read over ctnetlink. Neither netlink library sluice uses implements these requests
// (vishvananda/netlink only names IPCTNL_MSG_CT_GET_STATS{,_CPU} in a comment;
// mdlayher/netlink is a transport), so they are built here with vishvananda/netlink's
// request type and parsed with this package's attribute iterator, as the flow dump is.

// ctnetlink's statistics requests and attributes, from
// include/uapi/linux/netfilter/nfnetlink_conntrack.h. Every value is a big-endian u32.
const (
	ctMsgGetStatsCPU = 4 // IPCTNL_MSG_CT_GET_STATS_CPU: a dump, one message per possible CPU
	ctMsgGetStats    = 5 // IPCTNL_MSG_CT_GET_STATS: one message for the network namespace

	ctaStatsFound         = 2
	ctaStatsInvalid       = 4
	ctaStatsInsert        = 8
	ctaStatsInsertFailed  = 9
	ctaStatsDrop          = 10
	ctaStatsEarlyDrop     = 11
	ctaStatsError         = 12
	ctaStatsSearchRestart = 13
	ctaStatsClashResolve  = 14 // Linux 5.11
	ctaStatsChainTooLong  = 15 // Linux 6.1

	ctaStatsGlobalEntries    = 1
	ctaStatsGlobalMaxEntries = 2
)

// counterKinds are the per-CPU statistics sluice exports, by the kernel's (and
// `conntrack -S`'s) name. Attributes the kernel no longer fills (searched, new, ignore,
// delete, delete_list: always 0 since Linux 4.10) are not read; those a kernel does not
// send (clash_resolve before 5.11, chain_toolong before 6.1) are left out of the metrics
// and the report rather than shown as 0.
var counterKinds = [...]struct {
	attr uint16
	name string
	desc *prometheus.Desc
}{
	{ctaStatsFound, "found", metrics.ConntrackFoundDesc},
	{ctaStatsInvalid, "invalid", metrics.ConntrackInvalidDesc},
	{ctaStatsInsert, "insert", metrics.ConntrackInsertDesc},
	{ctaStatsInsertFailed, "insert_failed", metrics.ConntrackInsertFailedDesc},
	{ctaStatsDrop, "drop", metrics.ConntrackDropDesc},
	{ctaStatsEarlyDrop, "early_drop", metrics.ConntrackEarlyDropDesc},
	{ctaStatsError, "error", metrics.ConntrackErrorDesc},
	{ctaStatsSearchRestart, "search_restart", metrics.ConntrackSearchRestartDesc},
	{ctaStatsClashResolve, "clash_resolve", metrics.ConntrackClashResolveDesc},
	{ctaStatsChainTooLong, "chain_toolong", metrics.ConntrackChainTooLongDesc},
}

// cpuCounters are one CPU's statistics as the kernel sent them: 32-bit values, and which
// of counterKinds were present.
type cpuCounters struct {
	cpu     uint16
	values  [len(counterKinds)]uint32
	present [len(counterKinds)]bool
}

// globalStats is the answer to IPCTNL_MSG_CT_GET_STATS.
type globalStats struct {
	entries    uint32
	maxEntries uint32
	// hasMax is false on kernels whose answer has no CTA_STATS_GLOBAL_MAX_ENTRIES.
	hasMax bool
}

// parseCPUStats reads one message of the per-CPU dump (after the netlink header). The
// CPU's number is the nfgenmsg's res_id, in network byte order.
func parseCPUStats(msg []byte) (cpuCounters, error) {
	var c cpuCounters
	if len(msg) < nl.SizeofNfgenmsg {
		return c, fmt.Errorf("conntrack statistics message of %d bytes is too short", len(msg))
	}
	c.cpu = binary.BigEndian.Uint16(msg[2:4])
	nlattr.Walk(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		if len(v) < 4 {
			return
		}
		for i, k := range counterKinds {
			if k.attr == typ {
				c.values[i], c.present[i] = binary.BigEndian.Uint32(v), true
				return
			}
		}
	})
	return c, nil
}

// parseGlobalStats reads the answer to IPCTNL_MSG_CT_GET_STATS (after the netlink header).
func parseGlobalStats(msg []byte) (globalStats, error) {
	var g globalStats
	if len(msg) < nl.SizeofNfgenmsg {
		return g, fmt.Errorf("conntrack statistics message of %d bytes is too short", len(msg))
	}
	hasEntries := false
	nlattr.Walk(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		if len(v) < 4 {
			return
		}
		switch typ {
		case ctaStatsGlobalEntries:
			g.entries, hasEntries = binary.BigEndian.Uint32(v), true
		case ctaStatsGlobalMaxEntries:
			g.maxEntries, g.hasMax = binary.BigEndian.Uint32(v), true
		}
	})
	if !hasEntries {
		return g, errors.New("the kernel's conntrack statistics carry no entry count")
	}
	return g, nil
}

// statsSource asks the kernel for the raw statistics messages, netlink headers stripped:
// the per-CPU dump's, one per possible CPU, and the answer to IPCTNL_MSG_CT_GET_STATS. A
// seam for tests, which replay recorded answers.
type statsSource interface {
	read() (perCPU [][]byte, global []byte, err error)
}

// statsTimeout bounds each netlink exchange of a read: a scrape must not hang on the kernel.
const statsTimeout = 5 * time.Second

// netlinkStats is the kernel, in the network namespace of the calling thread. Each read
// opens a netlink socket of its own, so concurrent reads share nothing.
type netlinkStats struct{}

func (netlinkStats) read() ([][]byte, []byte, error) {
	sock, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	defer sock.Close()
	tv := unix.NsecToTimeval(statsTimeout.Nanoseconds())
	if err := sock.SetSendTimeout(&tv); err != nil {
		return nil, nil, err
	}
	if err := sock.SetReceiveTimeout(&tv); err != nil {
		return nil, nil, err
	}
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}}
	request := func(msgType, flags int) ([][]byte, error) {
		req := nl.NewNetlinkRequest(nfnlSubsysCTNetlink<<8|msgType, flags)
		req.Sockets = sockets
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
		return req.Execute(unix.NETLINK_NETFILTER, uint16(nfnlSubsysCTNetlink<<8|msgType))
	}

	// The kernel marks its one answer to GET_STATS as part of a multi-part message but
	// sends no NLMSG_DONE after it: the acknowledgement asked for here ends the exchange.
	global, err := request(ctMsgGetStats, unix.NLM_F_ACK)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the conntrack table's size: %w", err)
	}
	if len(global) != 1 {
		return nil, nil, fmt.Errorf("reading the conntrack table's size: %d answers, want 1", len(global))
	}
	perCPU, err := request(ctMsgGetStatsCPU, unix.NLM_F_DUMP)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the per-CPU conntrack statistics: %w", err)
	}
	return perCPU, global[0], nil
}

// Stats are the conntrack table's size and the kernel's statistics for sluice's network
// namespace: what `sluice status` shows (in the daemon's status report) and what the
// sluice_conntrack_* metrics export.
type Stats struct {
	// Entries is the number of entries in this network namespace's table.
	Entries uint64 `json:"entries"`
	// Limit is nf_conntrack_max: the kernel drops a new connection's first packet when
	// this namespace's table holds that many entries and none can be evicted. 0 means no
	// limit; nil that it could not be read. It is host-wide, and read-only outside the
	// host's initial network namespace.
	Limit *uint64 `json:"limit,omitempty"`
	// Counters are the kernel's per-CPU statistics summed over CPUs, by the kernel's
	// names (found, invalid, insert, insert_failed, drop, early_drop, error,
	// search_restart, clash_resolve, chain_toolong); only those the kernel reports.
	// Counted since the network namespace was created (for the host's, since boot).
	Counters map[string]uint64 `json:"counters"`
	// CPUs is the number of CPUs the kernel reported statistics for.
	CPUs int `json:"cpus"`
}

// Status is Stats as the daemon's status report carries it: with the reason the table
// could not be read, if it could not.
type Status struct {
	Stats
	Error string `json:"error,omitempty"`
}

// sysctlMax is nf_conntrack_max below /proc/sys.
const sysctlMax = "net/netfilter/nf_conntrack_max"

// Monitor reads the conntrack table's health. Each read costs two netlink requests whose
// answers grow with the number of CPUs, never with the size of the table, so it is cheap
// enough to run on every scrape and every `sluice status`.
//
// The kernel's statistics are 32-bit per-CPU numbers that wrap around (a busy node can
// count 2^32 events in hours). Monitor keeps the last value of each and adds up the
// differences modulo 2^32, so the sums it reports only ever grow: a wrap between two reads
// is carried, several wraps of one CPU's number between two reads (2^32 events on one CPU)
// are not noticed.
//
// A Monitor is a prometheus.Collector; it is safe for concurrent use. Reads are serialised:
// two reads whose answers were accumulated out of order would take the older values for a
// wrap-around.
type Monitor struct {
	source statsSource
	sysctl hostnet.Sysctls

	// mu is held for a whole read, from the request to the accumulation, and guards the
	// following state.
	mu sync.Mutex
	// last is, per CPU, the raw values of the previous read.
	last map[uint16][len(counterKinds)]uint32
	// totals are the widened sums; present says which kinds any CPU reported.
	totals   [len(counterKinds)]uint64
	present  [len(counterKinds)]bool
	failures uint64
}

// NewMonitor returns a Monitor of the kernel's conntrack table in the caller's network
// namespace.
func NewMonitor() *Monitor { return newMonitor(netlinkStats{}, hostnet.ProcSys{}) }

func newMonitor(source statsSource, sysctl hostnet.Sysctls) *Monitor {
	return &Monitor{source: source, sysctl: sysctl, last: map[uint16][len(counterKinds)]uint32{}}
}

// Read returns the table's current size and statistics.
//
// The entry count and the limit come from the kernel's global statistics message, the
// same source and request as the counters, in the namespace the netlink socket lives in.
// Only when a kernel's answer lacks the limit (older kernels may send the count alone) is
// nf_conntrack_max read from /proc/sys; when both fail, Limit is nil and the rest is still
// returned.
func (m *Monitor) Read() (Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := m.read()
	if err != nil {
		m.failures++
	}
	return st, err
}

// read asks the kernel and accumulates its answer. Holds mu.
func (m *Monitor) read() (Stats, error) {
	msgs, raw, err := m.source.read()
	if err != nil {
		return Stats{}, err
	}
	g, err := parseGlobalStats(raw)
	if err != nil {
		return Stats{}, err
	}
	cpus := make([]cpuCounters, 0, len(msgs))
	for _, msg := range msgs {
		c, err := parseCPUStats(msg)
		if err != nil {
			return Stats{}, err
		}
		cpus = append(cpus, c)
	}

	st := Stats{Entries: uint64(g.entries), CPUs: len(cpus)}
	switch {
	case g.hasMax:
		st.Limit = ptrTo(uint64(g.maxEntries))
	default:
		if v, err := m.sysctl.Get(sysctlMax); err == nil && v >= 0 {
			st.Limit = ptrTo(uint64(v))
		}
	}
	st.Counters = m.accumulate(cpus)
	return st, nil
}

// accumulate adds one read's per-CPU values to the totals and returns them by name.
// Holds mu.
func (m *Monitor) accumulate(cpus []cpuCounters) map[string]uint64 {
	for _, c := range cpus {
		prev, seen := m.last[c.cpu]
		for i := range counterKinds {
			if !c.present[i] {
				continue
			}
			m.present[i] = true
			if seen {
				m.totals[i] += uint64(c.values[i] - prev[i]) // modulo 2^32: carries a wrap
			} else {
				m.totals[i] += uint64(c.values[i])
			}
		}
		m.last[c.cpu] = c.values
	}
	out := make(map[string]uint64, len(counterKinds))
	for i, k := range counterKinds {
		if m.present[i] {
			out[k.name] = m.totals[i]
		}
	}
	return out
}

// Status reads the table for the daemon's status report.
func (m *Monitor) Status() *Status {
	st, err := m.Read()
	if err != nil {
		return &Status{Error: err.Error()}
	}
	return &Status{Stats: st}
}

// Describe implements prometheus.Collector.
func (m *Monitor) Describe(ch chan<- *prometheus.Desc) {
	ch <- metrics.ConntrackEntriesDesc
	ch <- metrics.ConntrackLimitDesc
	for _, k := range counterKinds {
		ch <- k.desc
	}
	ch <- metrics.ConntrackReadFailuresDesc
}

// Collect implements prometheus.Collector: it reads the kernel on every scrape. A failed
// read exports only sluice_conntrack_read_failures_total, never a stale or a zero value
// that would look healthy; the scrape itself succeeds.
func (m *Monitor) Collect(ch chan<- prometheus.Metric) {
	st, err := m.Read()
	if err == nil {
		ch <- prometheus.MustNewConstMetric(metrics.ConntrackEntriesDesc, prometheus.GaugeValue, float64(st.Entries))
		if st.Limit != nil {
			ch <- prometheus.MustNewConstMetric(metrics.ConntrackLimitDesc, prometheus.GaugeValue, float64(*st.Limit))
		}
		for _, k := range counterKinds {
			if v, ok := st.Counters[k.name]; ok {
				ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, float64(v))
			}
		}
	}
	m.mu.Lock()
	failures := m.failures
	m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(metrics.ConntrackReadFailuresDesc, prometheus.CounterValue, float64(failures))
}

var _ prometheus.Collector = (*Monitor)(nil)

func ptrTo[T any](v T) *T { return &v }
