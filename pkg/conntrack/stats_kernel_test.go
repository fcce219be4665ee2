//go:build kernel

package conntrack

// Kernel test of the conntrack health reader. The node is this process's private network
// namespace (netnstest.Main, see kernel_test.go); traffic goes over its loopback, in both
// families. Connection tracking runs in a namespace only while some rule uses it, so the
// test first adds an nftables rule that matches on conntrack state, as every proxy mode's
// rules do.

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/hostnet/nlattr"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

var record = flag.Bool("record", false, "rewrite testdata/stats-*.hex with the kernel's answers (TestKernelConntrackHealthMoves)")

// trackConnections makes the kernel track connections in this namespace: an inet table
// whose output and prerouting chains match on ct state.
func trackConnections(t testing.TB) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "ct-health-test"})
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookOutput, nftables.ChainHookPrerouting} {
		chain := c.AddChain(&nftables.Chain{Name: fmt.Sprintf("hook%d", *hook), Table: table,
			Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitNEW), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Counter{},
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("adding the nftables rules that turn on connection tracking: %v", err)
	}
	t.Cleanup(func() {
		c.DelTable(table)
		_ = c.Flush()
	})
}

// udpFlows sends one datagram from each of n fresh sockets to a listener on addr: n
// conntrack entries. Over IPv4 each socket has a source address of its own in 127.0.0.0/8,
// so that no two flows share a tuple however many there are.
func udpFlows(t testing.TB, network, addr string, n int) {
	t.Helper()
	ln, err := net.ListenPacket(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := ln.LocalAddr().(*net.UDPAddr)
	for i := 0; i < n; i++ {
		var src *net.UDPAddr
		if network == "udp4" {
			src = &net.UDPAddr{IP: net.IPv4(127, 1+byte(i>>16), byte(i>>8), byte(i))}
		}
		c, err := net.DialUDP(network, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
}

// tcpConnections opens and closes n TCP connections to a listener on addr.
func tcpConnections(t *testing.T, network, addr string, n int) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
}

// invalidTCP sends n TCP segments with SYN and FIN both set, which no connection may
// carry: conntrack marks them invalid.
func invalidTCP(t *testing.T, n int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(fd) }()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], 40000) // source port
	binary.BigEndian.PutUint16(seg[2:], 9)     // destination port
	seg[12] = 5 << 4                           // header length: 5 words
	seg[13] = 0x01 | 0x02                      // FIN | SYN
	binary.BigEndian.PutUint16(seg[14:], 1024) // window
	to := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	for i := 0; i < n; i++ {
		if err := unix.Sendto(fd, seg, 0, to); err != nil {
			t.Fatal(err)
		}
	}
}

// insertOverNetlink creates one UDP entry over ctnetlink, the one way the kernel's insert
// statistic moves (entries created by packets are not counted there).
func insertOverNetlink(t *testing.T) {
	t.Helper()
	client, server := net.IPv4(192, 0, 2, 1).To4(), net.IPv4(192, 0, 2, 2).To4()
	flow := &netlink.ConntrackFlow{FamilyType: netlink.FAMILY_V4, TimeOut: 120,
		Forward: netlink.IPTuple{SrcIP: client, DstIP: server, Protocol: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: 53},
		Reverse: netlink.IPTuple{SrcIP: server, DstIP: client, Protocol: unix.IPPROTO_UDP, SrcPort: 53, DstPort: 40000}}
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, flow); err != nil {
		t.Fatalf("creating a conntrack entry over netlink: %v", err)
	}
}

func TestKernelConntrackHealthMoves(t *testing.T) {
	trackConnections(t)
	rec := &recordingStats{}
	m := newMonitor(rec, hostnet.ProcSys{})
	before, err := m.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if before.CPUs < 1 || before.Limit == nil {
		t.Fatalf("first read: %d CPUs, limit %v", before.CPUs, before.Limit)
	}
	// Every statistic this kernel (6.1 or later: chain_toolong) reports is read.
	for _, k := range counterKinds {
		if _, ok := before.Counters[k.name]; !ok {
			t.Errorf("counter %s missing from the first read: %v", k.name, before.Counters)
		}
	}

	const udp4, udp6, tcp4, tcp6, invalidSegments = 40, 20, 10, 10, 3
	udpFlows(t, "udp4", "127.0.0.1:0", udp4)
	udpFlows(t, "udp6", "[::1]:0", udp6)
	tcpConnections(t, "tcp4", "127.0.0.1:0", tcp4)
	tcpConnections(t, "tcp6", "[::1]:0", tcp6)
	invalidTCP(t, invalidSegments)
	insertOverNetlink(t)

	after, err := m.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	t.Logf("before: %d entries, %v; after: %d entries, %v", before.Entries, before.Counters, after.Entries, after.Counters)
	// Each flow leaves its entry behind (UDP for 30 s, TCP in TIME_WAIT for 2 min). The
	// entries counted before may expire meanwhile (CI saw one go), so only the new ones
	// are required.
	if want := uint64(udp4 + udp6 + tcp4 + tcp6 + 1); after.Entries < want {
		t.Errorf("entries: %d after the traffic, want at least %d", after.Entries, want)
	}
	// A SYN+FIN segment is invalid on its way out and again on its way in.
	if got, want := after.Counters["invalid"]-before.Counters["invalid"], uint64(invalidSegments); got < want {
		t.Errorf("invalid grew by %d, want at least %d", got, want)
	}
	if got := after.Counters["insert"] - before.Counters["insert"]; got != 1 {
		t.Errorf("insert grew by %d, want 1 (one entry created over netlink)", got)
	}
	// Nothing here fills the table: no drops of any kind. (Provoking them takes a table
	// of the host-wide limit's size, hundreds of thousands of entries.)
	for _, name := range []string{"drop", "early_drop", "insert_failed", "chain_toolong"} {
		if after.Counters[name] != before.Counters[name] {
			t.Errorf("%s moved from %d to %d without a full table", name, before.Counters[name], after.Counters[name])
		}
	}

	// The collector exports the same, read afresh.
	got := collected(t, m)
	if got["sluice_conntrack_entries"] < float64(after.Entries) {
		t.Errorf("sluice_conntrack_entries = %v, want at least %d", got["sluice_conntrack_entries"], after.Entries)
	}
	if got["sluice_conntrack_limit"] != float64(*after.Limit) || got["sluice_conntrack_invalid_total"] < float64(after.Counters["invalid"]) ||
		got["sluice_conntrack_insert_total"] != float64(after.Counters["insert"]) {
		t.Errorf("collector exported %v; the read before said %+v", got, after)
	}
	if _, ok := got["sluice_conntrack_drop_total"]; !ok || got["sluice_conntrack_read_failures_total"] != 0 {
		t.Errorf("collector exported %v", got)
	}
	if *record {
		rec.write(t)
	}
}

// The limit is host-wide. Outside the host's initial network namespace (this test's
// namespace, a pod's, a netns node's) nf_conntrack_max is read-only on current kernels, and
// the namespace's own entries are compared against it. The Monitor only reads it, and
// still reads it when the kernel's netlink answer lacks it.
func TestKernelConntrackLimitIsHostWideAndReadOnly(t *testing.T) {
	if !netnstest.InNetns() {
		t.Fatal("this test must run in the private namespace netnstest.Main makes")
	}
	trackConnections(t)
	fromProc, err := hostnet.ProcSys{}.Get(sysctlMax)
	if err != nil {
		t.Fatalf("reading nf_conntrack_max in a non-initial namespace: %v", err)
	}
	if err := (hostnet.ProcSys{}).Set(sysctlMax, fromProc); err == nil {
		t.Errorf("writing nf_conntrack_max in a non-initial network namespace succeeded; on this kernel it is not the host's read-only value (update README.md)")
	} else if !errors.Is(err, os.ErrPermission) {
		t.Errorf("writing nf_conntrack_max: %v, want a permission error", err)
	}

	st, err := NewMonitor().Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if st.Limit == nil || *st.Limit != uint64(fromProc) {
		t.Errorf("limit over netlink = %v, /proc/sys says %d", st.Limit, fromProc)
	}

	// A kernel whose answer has no CTA_STATS_GLOBAL_MAX_ENTRIES: the limit comes from /proc.
	old := newMonitor(withoutMaxEntries{}, hostnet.ProcSys{})
	st, err = old.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if st.Limit == nil || *st.Limit != uint64(fromProc) {
		t.Errorf("limit from /proc = %v, want %d", st.Limit, fromProc)
	}
}

// withoutMaxEntries is the kernel's answer with the limit attribute taken out.
type withoutMaxEntries struct{ netlinkStats }

func (w withoutMaxEntries) read() ([][]byte, []byte, error) {
	cpu, global, err := w.netlinkStats.read()
	if err != nil {
		return nil, nil, err
	}
	out := append([]byte{}, global[:nl.SizeofNfgenmsg]...)
	nlattr.Walk(global[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		if typ != ctaStatsGlobalMaxEntries {
			out = append(out, nl.NewRtAttr(int(typ), v).Serialize()...)
		}
	})
	return cpu, out, nil
}

// recordingStats passes the kernel's answers through and keeps the last ones.
type recordingStats struct {
	netlinkStats
	lastCPU    [][]byte
	lastGlobal []byte
}

func (r *recordingStats) read() ([][]byte, []byte, error) {
	cpu, global, err := r.netlinkStats.read()
	r.lastCPU, r.lastGlobal = cpu, global
	return cpu, global, err
}

func (r *recordingStats) write(t *testing.T) {
	var uname unix.Utsname
	_ = unix.Uname(&uname)
	header := fmt.Sprintf("# Recorded from Linux %s by go test -tags kernel -run TestKernelConntrackHealthMoves -record ./pkg/conntrack/\n",
		unix.ByteSliceToString(uname.Release[:]))
	write := func(name string, msgs [][]byte) {
		var b strings.Builder
		b.WriteString(header)
		b.WriteString("# One ctnetlink message per line, netlink header stripped, in hex.\n")
		for _, m := range msgs {
			b.WriteString(hex.EncodeToString(m) + "\n")
		}
		if err := os.WriteFile(filepath.Join("testdata", name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("stats-cpu.hex", r.lastCPU)
	write("stats-global.hex", [][]byte{r.lastGlobal})
}

// BenchmarkKernelConntrackRead measures one read (what each scrape and each status report
// costs) with an empty table and with 20 000 entries: two netlink exchanges either way.
func BenchmarkKernelConntrackRead(b *testing.B) {
	trackConnections(b)
	m := NewMonitor()
	for _, entries := range []int{0, 20000} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) {
			if entries > 0 {
				udpFlows(b, "udp4", "127.0.0.1:0", entries)
			}
			st, err := m.Read()
			if err != nil || st.Entries < uint64(entries) {
				b.Fatalf("%d entries (%v), want at least %d", st.Entries, err, entries)
			}
			for b.Loop() {
				if _, err := m.Read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
