package dataplane

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Traffic counters (issue 13): a Service port the model marks Counted gets a counter in
// each of its per-path chains; the backend reads them on demand, off the sync goroutine.

// CounterPath names the chain of a Service port a counter sits in: where a new
// connection went.
type CounterPath string

const (
	// PathCluster: the connection's endpoint was picked among the Cluster-policy
	// endpoints (the Service's ClusterIP under internalTrafficPolicy Cluster, and external
	// traffic under externalTrafficPolicy Cluster or short-circuited under Local).
	PathCluster CounterPath = "cluster"
	// PathLocal: the endpoint was picked among this node's endpoints (Local policy).
	PathLocal CounterPath = "local"
	// PathExternal: the connection arrived at an external address of the Service (a
	// NodePort, a LoadBalancer IP or an external IP), before its policy chose a path.
	PathExternal CounterPath = "external"
)

// CounterSeries identifies one counter: a Service port and a path.
type CounterSeries struct {
	Port model.ServicePortName
	Path CounterPath
}

// TrafficCount is one counter as read from the kernel.
type TrafficCount struct {
	CounterSeries
	// NewConnections is the number of connections that took the path.
	NewConnections uint64
	// Packets and Bytes are every packet of those connections the counter saw (see the
	// backend's README for which ones), when the backend counts them; ok false otherwise.
	Packets, Bytes  uint64
	HasPacketsBytes bool
}

// TrafficCounterReader is a backend that can read its traffic counters. Reads must be
// safe from any goroutine while Apply runs, and must not wait for an Apply to finish.
type TrafficCounterReader interface {
	ReadTrafficCounters() ([]TrafficCount, error)
}

// ChainPath is one counted chain of a Service port.
type ChainPath struct {
	Chain string
	Path  CounterPath
	// EveryPacket: the chain's counter sees every packet of the path's connections that
	// the backend counts (its packets and bytes are the series' Packets and Bytes), not
	// only their first packet (whose count is NewConnections).
	EveryPacket bool
}

// ChainCount is the counter of one counted chain as read from the kernel.
type ChainCount struct{ Packets, Bytes uint64 }

// CounterIndex maps the backend's counted chains to their series. The sync goroutine
// updates it after each Apply, in time proportional to the Services changed; a reader
// takes its lock only to copy or look up, never during kernel I/O.
type CounterIndex struct {
	mu        sync.Mutex
	byChain   map[string]chainSeries
	byService map[types.NamespacedName][]string
}

// Update brings the index in line with desired: every Service on a full sync, the
// changed ones otherwise. chainsOf returns the counted chains of a Counted port.
func (x *CounterIndex) Update(desired *model.NodeState, changes model.Changes, full bool, chainsOf func(*model.ServicePort) []ChainPath) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if full || x.byChain == nil {
		x.byChain = map[string]chainSeries{}
		x.byService = map[types.NamespacedName][]string{}
		for _, sp := range desired.Services {
			if sp.Counted {
				x.addLocked(sp, chainsOf)
			}
		}
		return
	}
	for name := range changes.Services {
		for _, chain := range x.byService[name] {
			delete(x.byChain, chain)
		}
		delete(x.byService, name)
		for _, sp := range desired.PortsOf(name) {
			if sp.Counted {
				x.addLocked(sp, chainsOf)
			}
		}
	}
}

func (x *CounterIndex) addLocked(sp *model.ServicePort, chainsOf func(*model.ServicePort) []ChainPath) {
	for _, cp := range chainsOf(sp) {
		x.byChain[cp.Chain] = chainSeries{CounterSeries{Port: sp.Name, Path: cp.Path}, cp.EveryPacket}
		x.byService[sp.Name.NamespacedName] = append(x.byService[sp.Name.NamespacedName], cp.Chain)
	}
}

// Len returns the number of counted chains.
func (x *CounterIndex) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byChain)
}

// Chains returns the counted chains (a copy).
func (x *CounterIndex) Chains() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, 0, len(x.byChain))
	for c := range x.byChain {
		out = append(out, c)
	}
	return out
}

// chainSeries is what a counted chain counts.
type chainSeries struct {
	CounterSeries
	everyPacket bool
}

// Resolve turns raw per-chain counts into one TrafficCount per series, dropping chains
// not (or no longer) counted: a first-packet chain's packets are the series' new
// connections, an every-packet chain's packets and bytes its Packets and Bytes.
func (x *CounterIndex) Resolve(raw map[string]ChainCount) []TrafficCount {
	x.mu.Lock()
	defer x.mu.Unlock()
	bySeries := make(map[CounterSeries]*TrafficCount, len(raw))
	out := make([]TrafficCount, 0, len(raw))
	for chain, c := range raw {
		s, ok := x.byChain[chain]
		if !ok {
			continue
		}
		t := bySeries[s.CounterSeries]
		if t == nil {
			// out never grows past its capacity (a series per chain at most): t stays valid.
			out = append(out, TrafficCount{CounterSeries: s.CounterSeries})
			t = &out[len(out)-1]
			bySeries[s.CounterSeries] = t
		}
		if s.everyPacket {
			t.Packets += c.Packets
			t.Bytes += c.Bytes
			t.HasPacketsBytes = true
		} else {
			t.NewConnections += c.Packets
		}
	}
	return out
}
