// Package countertest helps the backends' tests of traffic counters (issue 13).
package countertest

import (
	"maps"
	"slices"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Counted returns a copy of ns in which every port of the named Services ("ns/name";
// every Service when none is named) is Counted, and the others are not.
func Counted(ns *model.NodeState, only ...string) *model.NodeState {
	out := ns.Clone()
	for name := range ns.ServiceNames() {
		counted := len(only) == 0 || slices.Contains(only, name.String())
		var ports []*model.ServicePort
		for _, sp := range ns.PortsOf(name) {
			cp := *sp
			cp.Counted = counted
			ports = append(ports, &cp)
		}
		out.SetService(name, ports, nil)
	}
	return out
}

// NewConnections maps each series read to its new connections.
func NewConnections(counts []dataplane.TrafficCount) map[dataplane.CounterSeries]uint64 {
	out := make(map[dataplane.CounterSeries]uint64, len(counts))
	for _, c := range counts {
		out[c.CounterSeries] = c.NewConnections
	}
	return out
}

// Equal reports whether two maps of counts hold the same series and values.
func Equal(got, want map[dataplane.CounterSeries]uint64) bool {
	return maps.Equal(got, want)
}

// Want fails the test unless r reads exactly want (new connections per series).
func Want(t testing.TB, r dataplane.TrafficCounterReader, want map[dataplane.CounterSeries]uint64) {
	t.Helper()
	counts, err := r.ReadTrafficCounters()
	if err != nil {
		t.Fatalf("ReadTrafficCounters: %v", err)
	}
	if got := NewConnections(counts); !Equal(got, want) {
		t.Fatalf("new connections: %v, want %v", got, want)
	}
}

// Packets reads r's counters, logs every series, and returns the packets and bytes of the
// series that count them.
func Packets(t testing.TB, r dataplane.TrafficCounterReader) map[dataplane.CounterSeries]dataplane.TrafficCount {
	t.Helper()
	counts, err := r.ReadTrafficCounters()
	if err != nil {
		t.Fatalf("ReadTrafficCounters: %v", err)
	}
	out := map[dataplane.CounterSeries]dataplane.TrafficCount{}
	for _, c := range counts {
		t.Logf("%s/%s %s %s: %d new connections, %d packets, %d bytes", c.Port.NamespacedName, c.Port.Port, c.Port.Protocol, c.Path, c.NewConnections, c.Packets, c.Bytes)
		if c.HasPacketsBytes {
			out[c.CounterSeries] = dataplane.TrafficCount{Packets: c.Packets, Bytes: c.Bytes}
		}
	}
	return out
}
