package dataplane

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// TrafficCounterCollector exports the traffic counters of the backends that count
// (sluice_service_new_connections_total, …_packets_total, …_bytes_total) by reading them
// on scrape. A read uses the backend's own kernel handle and never waits for a sync.
//
// The series it exports are monotonic even when a kernel counter restarts from zero (a
// chain rewritten by a change of its Service's spec, a restart of the table): a value
// below the last one read is taken as a new counter, and added. What the kernel counted
// between the last read and such a restart is lost; an endpoint change never restarts
// a counter (see the backends' READMEs).
//
// Reads are bounded in time, whatever the number of counted Services or how often the
// endpoint is scraped: a read that took cheapRead or longer is not repeated until
// readSpacing times its duration has passed, and scrapes in between get the totals it
// read. Slow reads (a legacy iptables read copies the whole nat table: seconds at 10 000
// Services) then take at most about a tenth of one core; reads of milliseconds, as
// nftables mode's, are repeated on every scrape.
type TrafficCounterCollector struct {
	readers []TrafficCounterReader
	logger  klog.Logger
	now     func() time.Time

	mu sync.Mutex
	// last is the raw value last read per reader and series; total the exported sum.
	last  []map[CounterSeries]TrafficCount
	total map[CounterSeries]*TrafficCount
	// readAt is when the last read started and readTook how long it took; latest is what
	// it returned.
	readAt   time.Time
	readTook time.Duration
	latest   []TrafficCount
}

const (
	// cheapRead is the read time under which every scrape reads: such reads take at most
	// a thirtieth of a core at Prometheus' usual scrape interval (30 s), and a test that
	// reads right after sending traffic, in a small cluster, always sees it.
	cheapRead = time.Second
	// readSpacing is how many times its own duration a slower read is reused for: with
	// 10, reads take at most a tenth of the time.
	readSpacing = 10
)

var (
	newConnectionsDesc = prometheus.NewDesc("sluice_service_new_connections_total",
		"New connections per Service port and path (cluster, external, local), for Services whose traffic is counted (annotation sluice.dev/traffic-counters, --traffic-counters).",
		counterLabels, nil)
	packetsDesc = prometheus.NewDesc("sluice_service_packets_total",
		"Packets clients sent to a Service port (original direction), per path, for Services whose traffic is counted, in nftables and iptables mode (see their READMEs).",
		counterLabels, nil)
	bytesDesc = prometheus.NewDesc("sluice_service_bytes_total",
		"Bytes (IP header included) clients sent to a Service port (original direction), per path, for Services whose traffic is counted, in nftables and iptables mode (see their READMEs).",
		counterLabels, nil)
	counterLabels = []string{"namespace", "service", "port", "protocol", "path"}
)

// NewTrafficCounterCollector returns a collector over the backends that can read
// counters (one per IP family; their counts of a dual-stack Service are added).
func NewTrafficCounterCollector(logger klog.Logger, readers ...TrafficCounterReader) *TrafficCounterCollector {
	c := &TrafficCounterCollector{readers: readers, logger: logger, now: time.Now, total: map[CounterSeries]*TrafficCount{}}
	c.last = make([]map[CounterSeries]TrafficCount, len(readers))
	for i := range c.last {
		c.last[i] = map[CounterSeries]TrafficCount{}
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *TrafficCounterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- newConnectionsDesc
	ch <- packetsDesc
	ch <- bytesDesc
}

// Collect implements prometheus.Collector: it reads every backend and exports the sums.
func (c *TrafficCounterCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.Read() {
		labels := []string{m.Port.Namespace, m.Port.Name, m.Port.Port, string(m.Port.Protocol), string(m.Path)}
		ch <- prometheus.MustNewConstMetric(newConnectionsDesc, prometheus.CounterValue, float64(m.NewConnections), labels...)
		if m.HasPacketsBytes {
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(m.Packets), labels...)
			ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(m.Bytes), labels...)
		}
	}
}

// Read returns the monotonic totals of the series still counted, read from every backend
// unless the last read was slow and recent (see TrafficCounterCollector). A backend whose
// read fails keeps its last totals, and is logged.
func (c *TrafficCounterCollector) Read() []TrafficCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := c.now()
	if c.readTook >= cheapRead && start.Before(c.readAt.Add(readSpacing*c.readTook)) {
		return slices.Clone(c.latest)
	}
	out := c.readAll()
	c.readAt, c.readTook, c.latest = start, c.now().Sub(start), out
	if c.readTook >= cheapRead {
		c.logger.V(2).Info("Read the traffic counters slowly; scrapes reuse this read for a while", "seconds", c.readTook.Seconds(), "reusedForSeconds", (readSpacing * c.readTook).Seconds())
	}
	return slices.Clone(out)
}

// readAll reads every backend and adds what each counted since its last read.
func (c *TrafficCounterCollector) readAll() []TrafficCount {
	live := map[CounterSeries]bool{}
	for i, r := range c.readers {
		counts, err := r.ReadTrafficCounters()
		if err != nil {
			c.logger.Error(err, "Failed to read the traffic counters")
			for s := range c.last[i] {
				live[s] = true
			}
			continue
		}
		seen := make(map[CounterSeries]TrafficCount, len(counts))
		for _, cur := range counts {
			seen[cur.CounterSeries] = cur
			live[cur.CounterSeries] = true
			prev, had := c.last[i][cur.CounterSeries]
			t := c.total[cur.CounterSeries]
			if t == nil {
				t = &TrafficCount{CounterSeries: cur.CounterSeries}
				c.total[cur.CounterSeries] = t
			}
			t.HasPacketsBytes = t.HasPacketsBytes || cur.HasPacketsBytes
			t.NewConnections += delta(prev.NewConnections, cur.NewConnections, had)
			t.Packets += delta(prev.Packets, cur.Packets, had)
			t.Bytes += delta(prev.Bytes, cur.Bytes, had)
		}
		c.last[i] = seen
	}
	out := make([]TrafficCount, 0, len(live))
	for s, t := range c.total {
		if !live[s] {
			delete(c.total, s) // no longer counted: the series ends
			continue
		}
		out = append(out, *t)
	}
	return out
}

// delta is what a counter counted since its last read; a value below the last one is a
// counter that restarted from zero.
func delta(prev, cur uint64, had bool) uint64 {
	if !had || cur < prev {
		return cur
	}
	return cur - prev
}
