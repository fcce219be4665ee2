//go:build kernel

package nftables

import (
	"fmt"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// BenchmarkReadTrafficCounters: one read of the traffic counters (what a scrape costs)
// with 10 000 Services x 10 endpoints in the table, all counted (one dump of the table)
// or 10 of them (one request per chain).
func BenchmarkReadTrafficCounters(b *testing.B) {
	for _, counted := range []int{10, 10000} {
		b.Run(fmt.Sprintf("services=10000/counted=%d", counted), func(b *testing.B) {
			resetTable(b)
			be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
			ns := scaleState(model.IPv4, 10000, 10)
			var only []string
			for i := 0; i < counted && counted < 10000; i++ {
				only = append(only, fmt.Sprintf("ns%d/svc%d", i%50, i))
			}
			mustApply(b, be, withCounters(ns, only...), model.Changes{Full: true})
			var series int
			for b.Loop() {
				counts, err := be.ReadTrafficCounters()
				if err != nil {
					b.Fatal(err)
				}
				series = len(counts)
			}
			if series != counted {
				b.Fatalf("read %d series, want %d", series, counted)
			}
			b.ReportMetric(float64(series), "series")
		})
	}
}

// BenchmarkFirstPacketCounters: connects to a ClusterIP among 10 000 Services x 10
// endpoints, without and with every Service counted (the counter rule is one more
// expression on the first packet's path).
func BenchmarkFirstPacketCounters(b *testing.B) {
	for _, counted := range []bool{false, true} {
		b.Run(fmt.Sprintf("services=10000/counted=%v", counted), func(b *testing.B) { benchFirstPacket(b, 10000, counted) })
	}
}
