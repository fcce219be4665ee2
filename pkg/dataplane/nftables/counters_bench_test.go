//go:build kernel

package nftables

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/netnstest"

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

// BenchmarkCountersOnOff measures what counting every Service costs the traffic, at
// 10 000 Services x 10 endpoints, in one run that switches counting off and on for all
// of them in rounds, so the machine's load weighs on both states alike (the figures of
// BenchmarkFirstPacketCounters come from two runs a minute apart, and on a shared
// machine their difference was within the noise). Per round and state it times TCP
// connects to a ClusterIP (the first packet passes the path chain's counter and the
// packet-counter map) and UDP round trips on one established flow (a later packet pays
// only the packet-counter map lookup before DNAT). Run with -benchtime=1x.
func BenchmarkCountersOnOff(b *testing.B) {
	const rounds, connects, roundTrips = 6, 300, 1000
	resetTable(b)
	tp := newTopology(b, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	be := newTestBackend(b, testConfig(model.IPv4), fixedAddrs(testNodeIP))
	off := scaleState(model.IPv4, 10000, 10)
	tcpPort := svc("t", "target", "http", model.TCP, "172.31.0.1", 80).Endpoints("10.180.0.1:80").Build()
	udpPort := svc("t", "target", "dns", model.UDP, "172.31.0.1", 80).Endpoints("10.180.0.1:80").Build()
	off.SetService(tcpPort.Name.NamespacedName, []*model.ServicePort{tcpPort, udpPort}, nil)
	off.ServiceCIDRs = append(off.ServiceCIDRs, netip.MustParsePrefix("172.31.0.0/16"))
	on := withCounters(off)
	samples := map[bool]*counterCostSamples{false: {}, true: {}}
	for b.Loop() {
		for round := range 2 * rounds {
			counted := round%2 == 1
			state := off
			if counted {
				state = on
			}
			mustApply(b, be, state, model.Changes{Full: true})
			if err := samples[counted].measure(tp.client, connects, roundTrips); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, counted := range []bool{false, true} {
		s := samples[counted]
		b.ReportMetric(s.connect.quantile(0.5), fmt.Sprintf("connect-p50-µs/counted=%v", counted))
		b.ReportMetric(s.connect.quantile(0.99), fmt.Sprintf("connect-p99-µs/counted=%v", counted))
		b.ReportMetric(s.roundTrip.quantile(0.5), fmt.Sprintf("udp-rtt-p50-µs/counted=%v", counted))
		b.ReportMetric(s.roundTrip.quantile(0.99), fmt.Sprintf("udp-rtt-p99-µs/counted=%v", counted))
	}
	b.ReportMetric(samples[true].connect.quantile(0.5)/samples[false].connect.quantile(0.5), "connect-p50-on/off")
	b.ReportMetric(samples[true].roundTrip.quantile(0.5)/samples[false].roundTrip.quantile(0.5), "udp-rtt-p50-on/off")
}

// durations is a set of timings in microseconds.
type durations []float64

func (d durations) quantile(q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// counterCostSamples collects one state's timings over all its rounds.
type counterCostSamples struct{ connect, roundTrip durations }

// measure times n TCP connects and m UDP round trips on one flow from namespace client
// to the target Service.
func (s *counterCostSamples) measure(client string, n, m int) error {
	return netnstest.Do(client, func() error {
		d := net.Dialer{Timeout: quick}
		for range n {
			start := time.Now()
			c, err := d.Dial("tcp", "172.31.0.1:80")
			if err != nil {
				return fmt.Errorf("tcp connect: %w", err)
			}
			s.connect = append(s.connect, float64(time.Since(start).Nanoseconds())/1e3)
			_ = c.Close()
		}
		c, err := d.Dial("udp", "172.31.0.1:80")
		if err != nil {
			return fmt.Errorf("udp: %w", err)
		}
		defer c.Close()
		buf := make([]byte, 64)
		for range m {
			start := time.Now()
			if _, err := c.Write([]byte("x")); err != nil {
				return fmt.Errorf("udp write: %w", err)
			}
			_ = c.SetReadDeadline(time.Now().Add(quick))
			if _, err := c.Read(buf); err != nil {
				return fmt.Errorf("udp read: %w", err)
			}
			s.roundTrip = append(s.roundTrip, float64(time.Since(start).Nanoseconds())/1e3)
		}
		return nil
	})
}
