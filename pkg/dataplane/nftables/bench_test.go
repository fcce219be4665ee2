//go:build kernel

package nftables

// Benchmarks of the backend against the kernel (go test -tags kernel -run XXX -bench .).
// Results and method: docs/benchmarks-nftables.md.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

var benchSizes = []int{1000, 10000}

// cpuTime returns the CPU time (user + system) this process used so far. nf_tables
// processes a batch inside our sendmsg, so the kernel's work is in it.
func cpuTime() time.Duration {
	u, s := cpuTimes()
	return u + s
}

func cpuTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func reportStats(b *testing.B, st ApplyStats) {
	b.ReportMetric(float64(st.Messages), "msgs/op")
	b.ReportMetric(float64(st.Bytes), "netlink-B/op")
	b.ReportMetric(float64(st.Batches), "batches/op")
	b.ReportMetric(float64(st.Operations), "ops/op")
}

// BenchmarkColdSync: an empty table to N Services x 10 endpoints, one full Apply.
func BenchmarkColdSync(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := scaleState(model.IPv4, n, 10)
			var st ApplyStats
			var user, sys time.Duration
			for b.Loop() {
				b.StopTimer()
				resetTable(b)
				be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
				b.StartTimer()
				u0, s0 := cpuTimes()
				mustApply(b, be, ns, model.Changes{Full: true})
				u1, s1 := cpuTimes()
				user += u1 - u0
				sys += s1 - s0
				st = be.LastStats()
			}
			reportStats(b, st)
			b.ReportMetric(float64(user.Milliseconds())/float64(b.N), "user-ms/op")
			b.ReportMetric(float64(sys.Milliseconds())/float64(b.N), "sys-ms/op")
			b.ReportMetric(float64(st.PlanTime.Milliseconds()), "plan-ms")
			b.ReportMetric(float64(st.ApplyTime.Milliseconds()), "apply-ms")
		})
	}
}

// BenchmarkColdSyncBatchSize: the cold sync of 10 000 Services with other batch limits.
func BenchmarkColdSyncBatchSize(b *testing.B) {
	ns := scaleState(model.IPv4, 10000, 10)
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			var st ApplyStats
			for b.Loop() {
				b.StopTimer()
				resetTable(b)
				be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP), WithBatchLimits(size, 1<<30))
				b.StartTimer()
				mustApply(b, be, ns, model.Changes{Full: true})
				st = be.LastStats()
			}
			reportStats(b, st)
		})
	}
}

// BenchmarkReplaceInOneTransaction: a whole 10 000 x 10 table in a single transaction
// (what replacing an incompatible table takes): how big one batch can be.
func BenchmarkReplaceInOneTransaction(b *testing.B) {
	ns := scaleState(model.IPv4, 10000, 10)
	var st ApplyStats
	for b.Loop() {
		b.StopTimer()
		resetTable(b)
		nftScript(b, "add table ip kube-proxy\nadd map ip kube-proxy service-ips { type ipv4_addr : verdict ; }\n")
		be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
		b.StartTimer()
		mustApply(b, be, ns, model.Changes{Full: true})
		st = be.LastStats()
		if !st.Replaced || st.Batches != 1 {
			b.Fatalf("not one replacing transaction: %+v", st)
		}
	}
	reportStats(b, st)
}

// BenchmarkOneEndpointChange: one endpoint of one Service moves, on a table of N
// Services x 10 endpoints.
func BenchmarkOneEndpointChange(b *testing.B) {
	benchEndpointMoves(b, func(*model.NodeState) types.NamespacedName {
		return types.NamespacedName{Namespace: "ns7", Name: "svc7"}
	})
}

// BenchmarkOneEndpointServiceMoves: the endpoint of a one-endpoint Service moves. Its
// endpoint is written in the Service's rule (no map), so the move rewrites that rule; the
// scale benchmark's sentinel is such a Service.
func BenchmarkOneEndpointServiceMoves(b *testing.B) {
	benchEndpointMoves(b, func(ns *model.NodeState) types.NamespacedName {
		target := types.NamespacedName{Namespace: "t", Name: "single"}
		single := svc("t", "single", "http", model.TCP, "172.31.0.1", 80).Endpoints("10.180.0.1:8080").Build()
		ns.SetService(target, []*model.ServicePort{single}, nil)
		return target
	})
}

// benchEndpointMoves loads N Services x 10 endpoints (plus what addTarget adds), then
// moves the last endpoint of addTarget's Service once per iteration, one partial sync
// each.
func benchEndpointMoves(b *testing.B, addTarget func(*model.NodeState) types.NamespacedName) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			resetTable(b)
			be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
			ns := scaleState(model.IPv4, n, 10)
			target := addTarget(ns)
			mustApply(b, be, ns, model.Changes{Full: true})
			ch := changed(target.String())
			i := 0
			var st ApplyStats
			c0 := cpuTime()
			for b.Loop() {
				i++
				moveOneEndpoint(ns, target, fmt.Sprintf("10.250.%d.%d:8080", (i/250)%250, i%250+1))
				mustApply(b, be, ns, ch)
				st = be.LastStats()
			}
			reportStats(b, st)
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkFirstPacket: the time to connect (TCP handshake through DNAT: a new
// connection's first packet goes through the rules) to a ClusterIP, with N Services x 10
// endpoints in the table. The connects run in the client namespace, one after the
// other; the endpoint is a pod of this node.
func BenchmarkFirstPacket(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchFirstPacket(b, n, false) })
	}
}

// benchFirstPacket measures connects to a ClusterIP among n Services x 10 endpoints,
// with every Service's traffic counted or none.
func benchFirstPacket(b *testing.B, n int, counted bool) {
	resetTable(b)
	tp := newTopology(b, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
	ns := scaleState(model.IPv4, n, 10)
	target := svc("t", "target", "http", model.TCP, "172.31.0.1", 80).Endpoints("10.180.0.1:80", "10.180.0.1:8080").Build()
	ns.SetService(target.Name.NamespacedName, []*model.ServicePort{target}, nil)
	ns.ServiceCIDRs = append(ns.ServiceCIDRs, netip.MustParsePrefix("172.31.0.0/16"))
	if counted {
		ns = withCounters(ns)
	}
	mustApply(b, be, ns, model.Changes{Full: true})
	var samples []time.Duration
	err := netnstest.Do(tp.client, func() error {
		d := net.Dialer{Timeout: quick}
		for b.Loop() {
			start := time.Now()
			c, err := d.Dial("tcp", "172.31.0.1:80")
			if err != nil {
				return err
			}
			samples = append(samples, time.Since(start))
			_ = c.Close()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPeakRSS runs a cold sync of N Services x 10 endpoints in a child process
// (this test binary, TestHelperColdSyncRSS) and reports the child's peak RSS (VmHWM):
// the model's NodeState, the backend's plan and model, and the netlink buffers.
func BenchmarkPeakRSS(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var hwm, base float64
			for b.Loop() {
				resetTable(b)
				hwm, base = childRSS(b, n)
			}
			b.ReportMetric(hwm/1024, "peak-RSS-MiB")
			b.ReportMetric(base/1024, "RSS-before-sync-MiB")
		})
	}
}

func childRSS(b *testing.B, n int) (hwm, before float64) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperColdSyncRSS$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SLUICE_RSS_HELPER="+strconv.Itoa(n))
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("helper: %v: %s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var v float64
		if _, err := fmt.Sscanf(sc.Text(), "VmHWM %f", &v); err == nil {
			hwm = v
		}
		if _, err := fmt.Sscanf(sc.Text(), "before %f", &v); err == nil {
			before = v
		}
		for _, k := range []string{"heap-nodestate", "heap-after-cold", "heap-after-resync1", "heap-after-resync2", "heap-peak"} {
			if _, err := fmt.Sscanf(sc.Text(), k+" %f", &v); err == nil {
				b.ReportMetric(v/1024, k+"-MiB")
			}
		}
	}
	if hwm == 0 {
		b.Fatalf("no VmHWM in the helper's output: %s", out)
	}
	return hwm, before
}

// TestHelperColdSyncRSS is the child of BenchmarkPeakRSS; it does nothing otherwise.
func TestHelperColdSyncRSS(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("SLUICE_RSS_HELPER"))
	if err != nil {
		t.Skip("only run by BenchmarkPeakRSS")
	}
	ns := scaleState(model.IPv4, n, 10)
	fmt.Printf("before %d\n", statusKiB("VmRSS"))
	fmt.Printf("heap-nodestate %d\n", liveHeapKiB())
	be, err := New(context.Background(), testConfig(model.IPv4), WithoutLeftoverCleanup(), fixedAddrs(testNodeIP))
	if err != nil {
		t.Fatal(err)
	}
	if res := be.Apply(context.Background(), ns, model.Changes{Full: true}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if path := os.Getenv("SLUICE_RSS_HEAP_PROFILE"); path != "" {
		if err := writeHeapProfile(path); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("after-cold %d\n", statusKiB("VmHWM"))
	fmt.Printf("heap-after-cold %d\n", liveHeapKiB())
	// Full resyncs right after: each reads the whole table back. The heap in use is sampled
	// while it runs (garbage included: what the process's RSS follows).
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peakHeapKiB = max(peakHeapKiB, int(ms.HeapInuse/1024))
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	// Two of them, as a run with periodic resyncs has: the first parses every chain
	// (handles unknown after our own writes), the second only compares handles.
	for i := 1; i <= 2; i++ {
		if res := be.Apply(context.Background(), ns, model.Changes{Full: true}); res.Err != nil {
			t.Fatal(res.Err)
		}
		fmt.Printf("heap-after-resync%d %d\n", i, liveHeapKiB())
	}
	close(stop)
	<-sampled
	fmt.Printf("VmHWM %d\n", statusKiB("VmHWM"))
	if path := os.Getenv("SLUICE_RSS_HEAP_PROFILE"); path != "" {
		if err := writeHeapProfile(path + ".resync"); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("heap-peak %d\n", peakHeapKiB)
	runtime.KeepAlive(ns)
	runtime.KeepAlive(be)
}

// liveHeapKiB collects garbage and returns the heap in use: what the process holds.
// writeHeapProfile writes a heap profile (after a GC) to path, for SLUICE_RSS_HEAP_PROFILE.
func writeHeapProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("heap profile %s: %w", path, err)
	}
	return f.Close()
}

func liveHeapKiB() int {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int(ms.HeapInuse / 1024)
}

var peakHeapKiB int

func statusKiB(field string) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			v, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return v
		}
	}
	return 0
}

// BenchmarkEndpointChanges: every kind of single-endpoint change, each a partial sync of
// one Service on a table of N Services x 10 endpoints (N from SLUICE_BENCH_SIZES, default
// 100, 1 000, 10 000 and 50 000). Each iteration toggles the target Service between two
// states. Besides the sync's wall time (ns/op) and CPU (user: sluice's planning and
// encoding; sys: mostly the kernel, which commits inside our sendmsg), it reports the
// ratio of wall times to the same case at the first size of the run (vs-first).
func BenchmarkEndpointChanges(b *testing.B) {
	eps := func(n, base int) []string {
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, fmt.Sprintf("10.%d.%d.%d:8080", 200+base/65536, (base/256)%256, base%256+i))
		}
		return out
	}
	type state struct{ a, b []string }
	cases := []struct {
		name string
		st   state
	}{
		{"move-in-10", state{eps(10, 0), append(eps(9, 0), "10.251.0.1:8080")}},
		{"add-remove-10-11", state{eps(10, 256), eps(11, 256)}},
		{"move-only-endpoint", state{eps(1, 512), eps(1, 768)}},
		{"first-last-endpoint-0-1", state{nil, eps(1, 1024)}},
		{"one-two-endpoints-1-2", state{eps(1, 1280), eps(2, 1280)}},
	}
	first := map[string]float64{}
	for _, n := range commitCostSizes(100, 1000, 10000, 50000) {
		resetTable(b)
		be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
		be.recordPlan = false
		ns := scaleState(model.IPv4, n, 10)
		targets := make([]types.NamespacedName, len(cases))
		for i, c := range cases {
			targets[i] = types.NamespacedName{Namespace: "target", Name: c.name}
			sp := svc("target", c.name, "http", model.TCP, fmt.Sprintf("172.31.0.%d", i+1), 80).Endpoints(c.st.a...).Build()
			ns.SetService(targets[i], []*model.ServicePort{sp}, nil)
		}
		mustApply(b, be, ns, model.Changes{Full: true})
		for i, c := range cases {
			b.Run(fmt.Sprintf("services=%d/%s", n, c.name), func(b *testing.B) {
				ch := model.Changes{Services: sets.New(targets[i])}
				k := 0
				var st ApplyStats
				u0, s0 := cpuTimes()
				start := time.Now()
				for b.Loop() {
					k++
					list := c.st.a
					if k%2 == 1 {
						list = c.st.b
					}
					sp := svc("target", c.name, "http", model.TCP, fmt.Sprintf("172.31.0.%d", i+1), 80).Endpoints(list...).Build()
					ns.SetService(targets[i], []*model.ServicePort{sp}, nil)
					mustApply(b, be, ns, ch)
					st = be.LastStats()
				}
				perOp := float64(time.Since(start).Nanoseconds()) / float64(b.N)
				u1, s1 := cpuTimes()
				reportStats(b, st)
				b.ReportMetric(float64((u1-u0).Microseconds())/float64(b.N), "user-µs/op")
				b.ReportMetric(float64((s1-s0).Microseconds())/float64(b.N), "sys-µs/op")
				if f, ok := first[c.name]; ok {
					b.ReportMetric(perOp/f, "vs-first")
				} else {
					first[c.name] = perOp
				}
			})
		}
	}
}
