//go:build kernel

package iptables

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
)

// BenchmarkReadTrafficCounters: one read of the traffic counters (what a scrape costs)
// with 10 000 Services x 10 endpoints in the tables, all counted or 10 of them, in both
// flavours. A read is one `iptables -S CHAIN 1 -v` per counted nat path chain up to 64,
// else one `iptables-save -c -t nat`, and one `iptables-save -c -t mangle` for the
// packet counters. child-cpu-s/op is the CPU the iptables programs used.
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
				var cpu time.Duration
				b.ResetTimer()
				for b.Loop() {
					c0 := childCPU()
					counts, err := be.ReadTrafficCounters()
					cpu += childCPU() - c0
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
			})
		}
	}
	wipeIPTables(b)
}
