//go:build kernel

package iptables

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// BenchmarkReadTrafficCounters: one read of the traffic counters (what a scrape costs)
// with 10 000 Services x 10 endpoints in the tables, all counted or 10 of them, in both
// flavours. A read is, in the nft flavour, one netlink request per counted chain (nat
// and mangle); in the legacy flavour one `iptables-legacy-save -c` of nat and one of
// mangle. child-cpu-s/op is the CPU the iptables programs used, self-cpu-s/op this
// process's (the netlink reads and parsing). It also logs the first full sync, and
// times an endpoint change of a counted Service (partial-sync-ms: no sync reads
// counters any more).
func BenchmarkReadTrafficCounters(b *testing.B) {
	const services = 10000
	st := scaleState(services, 10)
	for _, f := range flavours {
		for _, counted := range []int{10, services} {
			b.Run(fmt.Sprintf("%s/services=%d/counted=%d", f, services, counted), func(b *testing.B) {
				wipeIPTables(b)
				be := benchBackend(b, f)
				var only []string
				for i := 0; i < counted && counted < services; i++ {
					only = append(only, fmt.Sprintf("ns%d/svc%d", i/100, i))
				}
				if counted == services {
					only = nil
				}
				start := time.Now()
				if res := be.Apply(context.Background(), countertest.Counted(st, only...), full()); res.Err != nil || len(res.Failed) > 0 {
					b.Fatalf("Apply: %v %v", res.Err, res.Failed)
				}
				b.Logf("%s: full sync with %d counted: %v", f, counted, time.Since(start))
				var series int
				var cpu, self time.Duration
				b.ResetTimer()
				for b.Loop() {
					c0, s0 := childCPU(), selfCPU()
					counts, err := be.ReadTrafficCounters()
					cpu += childCPU() - c0
					self += selfCPU() - s0
					if err != nil {
						b.Fatal(err)
					}
					series = 0
					for _, c := range counts {
						if c.HasPacketsBytes {
							series++
						}
					}
				}
				if series != counted {
					b.Fatalf("read %d series with packets, want %d", series, counted)
				}
				b.ReportMetric(float64(series), "series")
				b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
				b.ReportMetric(self.Seconds()/float64(b.N), "self-cpu-s/op")
				b.StopTimer()
				// ns0/svc0 is counted in both cases.
				start = time.Now()
				if res := be.Apply(context.Background(), countertest.Counted(moveOneEndpoint(st, 1), only...), changed("ns0/svc0")); res.Err != nil || res.Full {
					b.Fatalf("Apply: %v (full %v)", res.Err, res.Full)
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "partial-sync-ms")
			})
		}
	}
	wipeIPTables(b)
}

// BenchmarkPacketCountersCost times UDP round trips on one established flow to a
// ClusterIP that is not counted, among Services that are all counted but it, and with
// nothing counted, in alternating rounds of one run (the shared machine's load weighs on
// both alike). Its packets walk every rule of SLUICE-SERVICE-PACKETS while counting is on:
// the worst case of the dispatch chain's linear cost (README, "Traffic counters").
func BenchmarkPacketCountersCost(b *testing.B) {
	const rounds, trips = 4, 1000
	for _, f := range flavours {
		for _, services := range []int{2000, 10000} {
			benchPacketCountersCost(b, f, services, rounds, trips)
		}
	}
	wipeIPTables(b)
}

// benchPacketCountersCost is one flavour and number of Services of BenchmarkPacketCountersCost.
func benchPacketCountersCost(b *testing.B, f Flavour, services, rounds, trips int) {
	b.Run(fmt.Sprintf("%s/services=%d", f, services), func(b *testing.B) {
		top := newTopology(b)
		be := benchBackend(b, f)
		w := &world{}
		w.add(fixture.APIService("ns/web", "p80", model.TCP, "172.30.0.10", 80).Endpoints(kPodA + ":80@local").Build())
		w.add(fixture.APIService("ns/dns", "p80", model.UDP, "172.30.0.10", 80).Endpoints(kPodA + ":80@local").Build())
		st := scaleState(services, 1)
		ws := w.kstate()
		for name := range ws.ServiceNames() {
			st.SetService(name, ws.PortsOf(name), nil)
		}
		var others []string
		for name := range st.ServiceNames() {
			if name.Namespace != "ns" {
				others = append(others, name.String())
			}
		}
		var conn net.Conn
		if err := netnstest.Do(top.client, func() error {
			var err error
			conn, err = net.Dial("udp", "172.30.0.10:80")
			return err
		}); err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		buf := make([]byte, 100)
		lat := map[bool][]time.Duration{}
		for r := 0; r < 2*rounds; r++ {
			on := r%2 == 1
			next := countertest.Counted(st, "none/none")
			if on {
				next = countertest.Counted(st, others...)
			}
			if res := be.Apply(context.Background(), next, full()); res.Err != nil || len(res.Failed) > 0 {
				b.Fatalf("Apply: %v %v", res.Err, res.Failed)
			}
			for i := 0; i < trips; i++ {
				_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
				t0 := time.Now()
				if _, err := conn.Write([]byte("hi")); err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Read(buf); err != nil {
					b.Fatal(err)
				}
				lat[on] = append(lat[on], time.Since(t0))
			}
		}
		p50 := func(d []time.Duration) time.Duration {
			slices.Sort(d)
			return d[len(d)/2]
		}
		off, on := p50(lat[false]), p50(lat[true])
		b.ReportMetric(float64(off.Microseconds()), "off-p50-µs")
		b.ReportMetric(float64(on.Microseconds()), "on-p50-µs")
		b.ReportMetric(float64((on-off).Nanoseconds())/float64(services), "ns-per-counted-rule")
	})
}
