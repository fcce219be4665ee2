//go:build kernel

package iptables

// Scale benchmarks against the real kernel, in this process's private network namespace:
//
//	go test -tags kernel -run '^$' -bench . -benchtime 1x ./pkg/dataplane/iptables/
//
// Each reports, besides ns/op, the CPU the iptables programs used (child-cpu-s) — the
// machine is shared, and wall time is noisy while CPU time is not — and the size of the
// ruleset. Figures are recorded in docs/benchmarks-iptables.md.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// childCPU is the CPU time (user and system) the programs this process ran and waited for
// have used; selfCPU is this process's own.
func childCPU() time.Duration { return rusageCPU(syscall.RUSAGE_CHILDREN) }
func selfCPU() time.Duration  { return rusageCPU(syscall.RUSAGE_SELF) }

func rusageCPU(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// moveOneEndpoint returns st with the first endpoint of ns0/svc0 replaced.
func moveOneEndpoint(st *model.NodeState, n int) *model.NodeState {
	name := types.NamespacedName{Namespace: "ns0", Name: "svc0"}
	out := st.Clone()
	sp := *st.PortsOf(name)[0]
	sp.AllEndpoints = slices.Clone(sp.AllEndpoints)
	sp.AllEndpoints[0].IP = netip.AddrFrom4([4]byte{10, 250, byte(n >> 8), byte(n)})
	sp.ClusterEndpoints = sp.AllEndpoints
	out.SetService(name, []*model.ServicePort{&sp}, nil)
	return out
}

func countRules(b *testing.B, f Flavour) (rules, chains int) {
	out := run(b, "iptables-"+string(f)+"-save", "-t", "nat")
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "-A "):
			rules++
		case strings.HasPrefix(l, ":"):
			chains++
		}
	}
	return rules, chains
}

// benchBackend is a kernel backend whose first sync does not look for other modes'
// leftovers.
func benchBackend(b *testing.B, f Flavour) *Backend {
	return newKernelBackend(b, f, WithoutLeftoverCleanup())
}

// syncedBenchBackend stops the timer, empties the tables, and returns a new backend that
// has programmed st with a full sync.
func syncedBenchBackend(b *testing.B, f Flavour, st *model.NodeState) *Backend {
	b.StopTimer()
	wipeIPTables(b)
	be := benchBackend(b, f)
	if res := be.Apply(context.Background(), st, full()); res.Err != nil {
		b.Fatal(res.Err)
	}
	return be
}

// timedApply applies st with the timer running (it is stopped before and after), and adds
// the CPU time the iptables programs used to *cpu.
func timedApply(b *testing.B, be *Backend, st *model.NodeState, ch model.Changes, cpu *time.Duration) dataplane.Result {
	c0 := childCPU()
	b.StartTimer()
	res := be.Apply(context.Background(), st, ch)
	b.StopTimer()
	*cpu += childCPU() - c0
	return res
}

func BenchmarkIPTablesSync(b *testing.B) {
	for _, f := range flavours {
		for _, n := range []int{1000, 10000} {
			st := scaleState(n, 10)
			b.Run(fmt.Sprintf("%s/%d/cold-full", f, n), func(b *testing.B) {
				var cpu time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					wipeIPTables(b)
					be := benchBackend(b, f)
					res := timedApply(b, be, st, full(), &cpu)
					if res.Err != nil || len(res.Failed) > 0 {
						b.Fatalf("Apply: %v %v", res.Err, res.Failed)
					}
					if i == 0 {
						rules, chains := countRules(b, f)
						b.ReportMetric(float64(rules), "nat-rules")
						b.ReportMetric(float64(chains), "nat-chains")
						b.ReportMetric(float64(be.LastStats().Restores), "restores")
					}
				}
				b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
			})
			b.Run(fmt.Sprintf("%s/%d/one-endpoint", f, n), func(b *testing.B) {
				be := syncedBenchBackend(b, f, st)
				var cpu time.Duration
				lines := 0
				for i := 0; i < b.N; i++ {
					next := moveOneEndpoint(st, i)
					res := timedApply(b, be, next, changed("ns0/svc0"), &cpu)
					if res.Err != nil || res.Full {
						b.Fatalf("Apply: err=%v full=%v", res.Err, res.Full)
					}
					lines += be.LastStats().Lines
				}
				b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
				b.ReportMetric(float64(lines)/float64(b.N), "restore-lines/op")
			})
			b.Run(fmt.Sprintf("%s/%d/full-resync", f, n), func(b *testing.B) {
				be := syncedBenchBackend(b, f, st)
				var cpu time.Duration
				for i := 0; i < b.N; i++ {
					res := timedApply(b, be, st, full(), &cpu)
					if res.Err != nil {
						b.Fatal(res.Err)
					}
				}
				b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
			})
		}
	}
	wipeIPTables(b)
}

// upstreamStyle renders what upstream kube-proxy feeds iptables-restore for st, for a
// same-machine comparison: a full sync is the same text with chains declared in
// upstream's order (random: Services in map order) instead of reverse name order; a sync after a change to one
// Service rewrites every shared chain (a line per Service) plus all of that Service's
// chains, as upstream's KEP-3453 partial sync does.
func upstreamStyle(st *model.NodeState, changedSvc *types.NamespacedName, stale []string) []byte {
	rc := newRenderConfig(testConfig(model.IPv4), st.Node, nil, false, false, 100000)
	p := &fullPlan{static: renderStatic(rc), prestaged: map[types.NamespacedName]bool{}, stale: stale}
	names := st.ServiceNames().UnsortedList()
	slices.SortFunc(names, compareNames)
	for _, name := range names {
		p.write = append(p.write, renderService(rc, name, st.PortsOf(name)))
		if changedSvc != nil && name != *changedSvc {
			p.prestaged[name] = true
		}
	}
	text := renderFull(p).String()
	// Upstream declares chains as it meets them: per Service, in hash order.
	lines := strings.Split(text, "\n")
	var decls []string
	first := -1
	for i, l := range lines {
		if strings.HasPrefix(l, ":KUBE-S") || strings.HasPrefix(l, ":KUBE-E") || strings.HasPrefix(l, ":KUBE-F") {
			if xtables.IsServiceChain(strings.Fields(l[1:])[0]) {
				if first < 0 {
					first = i
				}
				decls = append(decls, l)
			}
		}
	}
	// Upstream's order: Services in Go map order, each Service's chains together: random.
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(decls), func(i, j int) { decls[i], decls[j] = decls[j], decls[i] })
	if first >= 0 {
		copy(lines[first:first+len(decls)], decls)
	}
	return []byte(strings.Join(lines, "\n"))
}

func BenchmarkUpstreamStyleRestore(b *testing.B) {
	for _, f := range flavours {
		for _, n := range []int{1000, 10000} {
			st := scaleState(n, 10)
			t := xtables.NewTools(xtables.Exec{}, model.IPv4, f, "")
			if f == FlavourLegacy {
				b.Run(fmt.Sprintf("%s/%d/cold-full", f, n), func(b *testing.B) {
					in := upstreamStyle(st, nil, nil)
					for i := 0; i < b.N; i++ {
						b.StopTimer()
						wipeIPTables(b)
						c0 := childCPU()
						b.StartTimer()
						if err := t.Restore(context.Background(), in); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						b.ReportMetric((childCPU() - c0).Seconds(), "child-cpu-s/op")
					}
				})
			}
			b.Run(fmt.Sprintf("%s/%d/one-endpoint", f, n), func(b *testing.B) {
				syncedBenchBackend(b, f, st) // the table upstream's partial restores start from
				name := types.NamespacedName{Namespace: "ns0", Name: "svc0"}
				var cpu time.Duration
				cur := st
				for i := 0; i < b.N; i++ {
					next := moveOneEndpoint(st, i)
					old := endpointChain("ns0/svc0:p80", "tcp", cur.PortsOf(name)[0].AllEndpoints[0].String())
					in := upstreamStyle(next, &name, []string{old})
					c0 := childCPU()
					b.StartTimer()
					if err := t.Restore(context.Background(), in); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					cpu += childCPU() - c0
					cur = next
				}
				b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
			})
		}
	}
	wipeIPTables(b)
}

// BenchmarkOneChangeFloor compares, in one run and on the same table of n Services x 10
// endpoints, sluice's one-endpoint partial sync with the floor of any such sync: one
// iptables-restore --noflush rewriting one chain (a Service's KUBE-SVC chain, with the
// rules it has), timed alone. Each iteration does both, alternately, so that the
// machine's load hits them alike. In the legacy flavour every restore copies the whole
// nat table out of the kernel and back, whatever it changes: that copy is the floor.
// CPU times (child-cpu: the iptables programs') are the steadier figures on a shared
// machine.
func BenchmarkOneChangeFloor(b *testing.B) {
	for _, f := range flavours {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", f, n), func(b *testing.B) {
				st := scaleState(n, 10)
				wipeIPTables(b)
				be := benchBackend(b, f)
				if res := be.Apply(context.Background(), st, full()); res.Err != nil {
					b.Fatal(res.Err)
				}
				// The floor rewrites another Service's chain (the moving one's rules change
				// with every iteration): the same size of input, the same table.
				floor := oneChainRestore(b, f, prefixClusterPolicy+portHash("ns0/svc1:p80", "tcp"))
				t := xtables.NewTools(xtables.Exec{}, model.IPv4, f, "")
				var syncWall, floorWall, syncCPU, floorCPU, canaryWall time.Duration
				restores := 0
				for i := 0; b.Loop(); i++ {
					next := moveOneEndpoint(st, i)
					c0, w0 := childCPU(), time.Now()
					res := be.Apply(context.Background(), next, changed("ns0/svc0"))
					syncWall += time.Since(w0)
					syncCPU += childCPU() - c0
					if res.Err != nil || res.Full {
						b.Fatalf("Apply: err=%v full=%v", res.Err, res.Full)
					}
					restores += be.LastStats().Restores
					w0 = time.Now()
					if _, err := be.canaryPresent(); err != nil {
						b.Fatal(err)
					}
					canaryWall += time.Since(w0)
					c0, w0 = childCPU(), time.Now()
					if err := t.Restore(context.Background(), floor); err != nil {
						b.Fatal(err)
					}
					floorWall += time.Since(w0)
					floorCPU += childCPU() - c0
				}
				per := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(b.N) }
				b.ReportMetric(per(syncWall), "sync-ms/op")
				b.ReportMetric(per(floorWall), "floor-ms/op")
				b.ReportMetric(syncWall.Seconds()/floorWall.Seconds(), "sync/floor")
				b.ReportMetric(per(syncCPU), "sync-child-cpu-ms/op")
				b.ReportMetric(per(floorCPU), "floor-child-cpu-ms/op")
				b.ReportMetric(float64(restores)/float64(b.N), "restores/op")
				// The canary check every partial sync makes (an iptables run reading the
				// mangle table), timed apart: part of sync-ms, not of floor-ms.
				b.ReportMetric(per(canaryWall), "canary-ms/op")
			})
		}
	}
	wipeIPTables(b)
}

// oneChainRestore returns iptables-restore input that rewrites chain (of the nat table)
// with the rules it has now.
func oneChainRestore(b *testing.B, f Flavour, chain string) []byte {
	var buf strings.Builder
	buf.WriteString("*nat\n:" + chain + " - [0:0]\n")
	for _, l := range strings.Split(run(b, "iptables-"+string(f)+"-save", "-t", "nat"), "\n") {
		if strings.HasPrefix(l, "-A "+chain+" ") {
			buf.WriteString(l + "\n")
		}
	}
	buf.WriteString("COMMIT\n")
	if !strings.Contains(buf.String(), "-A ") {
		b.Fatalf("chain %s has no rules", chain)
	}
	return []byte(buf.String())
}
