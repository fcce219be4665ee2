package conntrack

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink/nl"

	"github.com/sluiceproxy/sluice/pkg/metrics/metricstest"
	"github.com/sluiceproxy/sluice/test/errtest"
)

// Conventions: the recorded answers in testdata/stats-*.hex come from a 2-CPU kernel (see
// the files' headers and TestKernelConntrackHealthMoves); the other messages are built
// here, attribute by attribute, as older kernels send them.

// readHex reads a testdata file of hex messages, one per line, # for comments.
func readHex(t *testing.T, name string) [][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, b)
	}
	return out
}

// statsMsg builds a ctnetlink statistics message: the nfgenmsg with res_id (the CPU), then
// one big-endian u32 attribute per entry of values.
func statsMsg(resID uint16, values map[uint16]uint32) []byte {
	msg := []byte{0, 0, 0, 0}
	binary.BigEndian.PutUint16(msg[2:], resID)
	for typ := uint16(1); typ < 32; typ++ { // in attribute order, like the kernel
		if v, ok := values[typ]; ok {
			msg = append(msg, nl.NewRtAttr(int(typ), nl.BEUint32Attr(v)).Serialize()...)
		}
	}
	return msg
}

// replay is a statsSource answering from a list of reads.
type replay struct {
	reads []replayRead
	n     int
}

type replayRead struct {
	cpu    [][]byte
	global []byte
	err    error
}

func (r *replay) read() ([][]byte, []byte, error) {
	rd := r.reads[min(r.n, len(r.reads)-1)]
	r.n++
	return rd.cpu, rd.global, rd.err
}

// sysctls is an in-memory hostnet.Sysctls.
type sysctls map[string]int

func (s sysctls) Get(name string) (int, error) {
	v, ok := s[name]
	if !ok {
		return 0, os.ErrNotExist
	}
	return v, nil
}
func (s sysctls) Set(name string, v int) error { return errors.New("read-only") }

func TestParseRecordedStats(t *testing.T) {
	cpus := readHex(t, "stats-cpu.hex")
	if len(cpus) != 2 {
		t.Fatalf("%d per-CPU messages recorded, want 2", len(cpus))
	}
	var got []cpuCounters
	for _, msg := range cpus {
		c, err := parseCPUStats(msg)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	// The recording: 6 invalid segments and 1 entry inserted over netlink, on CPU 1.
	all := [len(counterKinds)]bool{true, true, true, true, true, true, true, true, true, true}
	want := []cpuCounters{
		{cpu: 0, present: all},
		{cpu: 1, present: all, values: [len(counterKinds)]uint32{1: 6, 2: 1}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(cpuCounters{})); diff != "" {
		t.Errorf("per-CPU statistics (-want +got):\n%s", diff)
	}

	g, err := parseGlobalStats(readHex(t, "stats-global.hex")[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := (globalStats{entries: 81, maxEntries: 262144, hasMax: true}); g != want {
		t.Errorf("global statistics %+v, want %+v", g, want)
	}

	m := newMonitor(&replay{reads: []replayRead{{cpu: cpus, global: readHex(t, "stats-global.hex")[0]}}}, sysctls{})
	st, err := m.Read()
	if err != nil {
		t.Fatal(err)
	}
	wantStats := Stats{Entries: 81, Limit: ptrTo[uint64](262144), CPUs: 2, Counters: map[string]uint64{
		"found": 0, "invalid": 6, "insert": 1, "insert_failed": 0, "drop": 0, "early_drop": 0,
		"error": 0, "search_restart": 0, "clash_resolve": 0, "chain_toolong": 0,
	}}
	if diff := cmp.Diff(wantStats, st); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}
}

func TestReadStats(t *testing.T) {
	// A kernel before 5.11: the statistics it no longer fills are still sent, the newer
	// ones are not, and (older still) the global answer has no limit.
	oldCPU := func(cpu uint16, drop uint32) []byte {
		return statsMsg(cpu, map[uint16]uint32{1: 0, 2: 7, 3: 0, 4: 1, 5: 0, 6: 0, 7: 0, 8: 2, 9: 3, 10: drop, 11: 4, 12: 5, 13: 6})
	}
	global := statsMsg(0, map[uint16]uint32{ctaStatsGlobalEntries: 1000, ctaStatsGlobalMaxEntries: 131072})
	globalNoMax := statsMsg(0, map[uint16]uint32{ctaStatsGlobalEntries: 1000})
	oldCounters := map[string]uint64{"found": 14, "invalid": 2, "insert": 4, "insert_failed": 6, "drop": 20, "early_drop": 8, "error": 10, "search_restart": 12}

	tests := []struct {
		name    string
		read    replayRead
		sysctl  sysctls
		want    Stats
		wantErr string
	}{
		{
			name: "limit over netlink",
			read: replayRead{cpu: [][]byte{oldCPU(0, 10), oldCPU(1, 10)}, global: global},
			want: Stats{Entries: 1000, Limit: ptrTo[uint64](131072), CPUs: 2, Counters: oldCounters},
		},
		{
			name:   "limit from /proc/sys when netlink lacks it",
			read:   replayRead{cpu: [][]byte{oldCPU(0, 10), oldCPU(1, 10)}, global: globalNoMax},
			sysctl: sysctls{sysctlMax: 65536},
			want:   Stats{Entries: 1000, Limit: ptrTo[uint64](65536), CPUs: 2, Counters: oldCounters},
		},
		{
			name:   "no limit (0)",
			read:   replayRead{cpu: [][]byte{oldCPU(0, 10), oldCPU(1, 10)}, global: globalNoMax},
			sysctl: sysctls{sysctlMax: 0},
			want:   Stats{Entries: 1000, Limit: ptrTo[uint64](0), CPUs: 2, Counters: oldCounters},
		},
		{
			name: "limit unknown",
			read: replayRead{cpu: [][]byte{oldCPU(0, 10), oldCPU(1, 10)}, global: globalNoMax},
			want: Stats{Entries: 1000, CPUs: 2, Counters: oldCounters},
		},
		{
			name:    "netlink fails",
			read:    replayRead{err: errors.New("reading the conntrack table's size: protocol not supported")},
			wantErr: "protocol not supported",
		},
		{
			name:    "a truncated message",
			read:    replayRead{cpu: [][]byte{{0, 0}}, global: global},
			wantErr: "too short",
		},
		{
			name:    "a global answer without entries",
			read:    replayRead{global: statsMsg(0, map[uint16]uint32{ctaStatsGlobalMaxEntries: 5})},
			wantErr: "no entry count",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMonitor(&replay{reads: []replayRead{tt.read}}, tt.sysctl)
			got, err := m.Read()
			if errtest.Want(t, err, tt.wantErr) {
				if m.failures != 1 {
					t.Errorf("failures = %d, want 1", m.failures)
				}
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Read (-want +got):\n%s", diff)
			}
		})
	}
}

// The kernel's statistics are 32-bit per CPU; the sums only ever grow.
func TestCountersCarryWrapArounds(t *testing.T) {
	cpu := func(id uint16, drop uint32) []byte { return statsMsg(id, map[uint16]uint32{ctaStatsDrop: drop}) }
	global := statsMsg(0, map[uint16]uint32{ctaStatsGlobalEntries: 1})
	r := &replay{reads: []replayRead{
		{cpu: [][]byte{cpu(0, math.MaxUint32-1), cpu(1, 5)}, global: global},
		{cpu: [][]byte{cpu(0, 3), cpu(1, 5)}, global: global},            // CPU 0 wrapped: +5
		{cpu: [][]byte{cpu(0, 3), cpu(1, 5), cpu(2, 1)}, global: global}, // a CPU first seen counts whole
		{cpu: [][]byte{cpu(0, 10), cpu(1, 6), cpu(2, 1)}, global: global},
	}}
	m := newMonitor(r, sysctls{})
	want := []uint64{math.MaxUint32 - 1 + 5, math.MaxUint32 - 1 + 5 + 5, math.MaxUint32 - 1 + 5 + 5 + 1, math.MaxUint32 - 1 + 5 + 5 + 1 + 7 + 1}
	for i, w := range want {
		st, err := m.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Counters["drop"]; got != w {
			t.Errorf("read %d: drop = %d, want %d", i, got, w)
		}
		if _, ok := st.Counters["found"]; ok {
			t.Errorf("read %d: found is exported though the kernel never sent it", i)
		}
	}
}

// collected returns what m exports, by metric name.
func collected(t *testing.T, m *Monitor) map[string]float64 {
	t.Helper()
	families := metricstest.Collect(t, m)
	out := map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			if g := s.GetGauge(); g != nil {
				out[f.GetName()] = g.GetValue()
			} else {
				out[f.GetName()] = s.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestCollector(t *testing.T) {
	cpu := statsMsg(3, map[uint16]uint32{ctaStatsDrop: 2, ctaStatsEarlyDrop: 1, ctaStatsInsertFailed: 4})
	t.Run("a read", func(t *testing.T) {
		m := newMonitor(&replay{reads: []replayRead{{cpu: [][]byte{cpu}, global: statsMsg(0, map[uint16]uint32{1: 900, 2: 1000})}}}, sysctls{})
		want := map[string]float64{
			"sluice_conntrack_entries": 900, "sluice_conntrack_limit": 1000,
			"sluice_conntrack_drop_total": 2, "sluice_conntrack_early_drop_total": 1, "sluice_conntrack_insert_failed_total": 4,
			"sluice_conntrack_read_failures_total": 0,
		}
		if diff := cmp.Diff(want, collected(t, m)); diff != "" {
			t.Errorf("collected (-want +got):\n%s", diff)
		}
	})
	t.Run("the limit unknown", func(t *testing.T) {
		m := newMonitor(&replay{reads: []replayRead{{cpu: [][]byte{cpu}, global: statsMsg(0, map[uint16]uint32{1: 900})}}}, sysctls{})
		if got := collected(t, m); got["sluice_conntrack_entries"] != 900 || hasKey(got, "sluice_conntrack_limit") {
			t.Errorf("collected %v, want entries and no limit", got)
		}
	})
	t.Run("a failed read exports no stale values", func(t *testing.T) {
		m := newMonitor(&replay{reads: []replayRead{{err: errors.New("no conntrack")}}}, sysctls{})
		collected(t, m)
		want := map[string]float64{"sluice_conntrack_read_failures_total": 2}
		if diff := cmp.Diff(want, collected(t, m)); diff != "" {
			t.Errorf("collected (-want +got):\n%s", diff)
		}
	})
}

func hasKey(m map[string]float64, k string) bool { _, ok := m[k]; return ok }

func TestStatus(t *testing.T) {
	m := newMonitor(&replay{reads: []replayRead{{err: errors.New("reading the conntrack table's size: permission denied")}}}, sysctls{})
	if st := m.Status(); st.Error != "reading the conntrack table's size: permission denied" || st.Counters != nil {
		t.Errorf("Status = %+v", st)
	}
}

// Bad answers never panic.
func FuzzParseStats(f *testing.F) {
	f.Add(statsMsg(1, map[uint16]uint32{ctaStatsDrop: 1}))
	f.Add([]byte{0, 0, 0, 0, 5, 0, 10, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 4, 0, 1, 0})
	f.Fuzz(func(t *testing.T, msg []byte) {
		_, _ = parseCPUStats(msg)
		_, _ = parseGlobalStats(msg)
	})
}

// counting is a kernel whose drop statistic goes up by one at each read.
type counting struct{ n atomic.Uint32 }

func (c *counting) read() ([][]byte, []byte, error) {
	n := c.n.Add(1)
	return [][]byte{statsMsg(0, map[uint16]uint32{ctaStatsDrop: n})}, statsMsg(0, map[uint16]uint32{ctaStatsGlobalEntries: 1}), nil
}

// Concurrent reads (a scrape and a `sluice status`) never see the counters go back, and
// never take an older answer for a wrap-around.
func TestConcurrentReadsStayMonotonic(t *testing.T) {
	src := &counting{}
	m := newMonitor(src, sysctls{})
	const readers, reads = 8, 200
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for range reads {
				st, err := m.Read()
				if err != nil {
					t.Error(err)
					return
				}
				if st.Counters["drop"] < last {
					t.Errorf("drop went from %d to %d", last, st.Counters["drop"])
				}
				last = st.Counters["drop"]
			}
		}()
	}
	wg.Wait()
	st, _ := m.Read()
	if want := uint64(src.n.Load()); st.Counters["drop"] != want {
		t.Errorf("drop = %d after %d reads, want %d", st.Counters["drop"], want, want)
	}
}
