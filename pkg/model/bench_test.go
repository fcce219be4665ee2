package model

import (
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

// benchCluster is n ClusterIP Services with one EndpointSlice of 10 ready endpoints each,
// spread over three nodes: the shape of the baseline in docs/baseline.md.
func benchCluster(n int) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	services := make([]*v1.Service, 0, n)
	slices := make([]*discoveryv1.EndpointSlice, 0, n)
	nodes := []string{"node-a", "node-b", "node-c"}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		ip := netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}).String()
		services = append(services, makeService(name, withClusterIPs(ip)))
		var eps []discoveryv1.Endpoint
		for j := range 10 {
			k := i*10 + j
			node := nodes[k%3]
			eps = append(eps, makeEndpoint(netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}).String(), onNode(node, "zone-a")))
		}
		sl := makeSlice(name, name+"-abcde", IPv4, 8080, eps...)
		sl.ResourceVersion = "1"
		slices = append(slices, sl)
	}
	return services, slices
}

func benchSource(services []*v1.Service, slices []*discoveryv1.EndpointSlice) *modeltest.Source {
	src := modeltest.NewSource()
	for _, s := range services {
		src.PutService(s)
	}
	for _, s := range slices {
		src.PutSlice(s)
	}
	return src
}

// benchTracker returns a tracker over src that has been told of every Service and slice
// (not drained yet).
func benchTracker(src *modeltest.Source, services []*v1.Service, slices []*discoveryv1.EndpointSlice) *Tracker {
	tr := NewTracker(TrackerConfig{Source: src, Node: testNode})
	for _, s := range services {
		tr.OnServiceAdd(s)
	}
	for _, s := range slices {
		tr.OnEndpointSliceAdd(s)
	}
	return tr
}

// BenchmarkDrainCold measures a start: every Service and slice arrives through the handlers,
// then one Drain computes the whole node (both families tracked, IPv4-only objects).
func BenchmarkDrainCold(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			services, slices := benchCluster(n)
			src := benchSource(services, slices)
			b.ReportAllocs()
			cpu := startCPUClock()
			for b.Loop() {
				tr := benchTracker(src, services, slices)
				states, _, _ := tr.Drain()
				if len(states[IPv4].Services) != n {
					b.Fatalf("%d ports", len(states[IPv4].Services))
				}
			}
			cpu.report(b)
		})
	}
}

// BenchmarkDrainOneEndpointChange measures the steady state: one endpoint of one Service
// flips readiness, then Drain and Applied. Its cost must not depend on the number of
// Services (compare services=100 with services=10000).
func BenchmarkDrainOneEndpointChange(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			services, slices := benchCluster(n)
			src := benchSource(services, slices)
			tr := benchTracker(src, services, slices)
			drainAndApply(tr)

			// Two versions of the middle Service's slice, alternated.
			cur := slices[n/2]
			other := cur.DeepCopy()
			other.ResourceVersion = "2"
			other.Endpoints[3].Conditions.Ready = new(bool)
			b.ReportAllocs()
			cpu := startCPUClock()
			for b.Loop() {
				src.PutSlice(other)
				tr.OnEndpointSliceUpdate(cur, other)
				_, changes, _ := tr.Drain()
				if changes[IPv4].Services.Len() != 1 {
					b.Fatalf("changes %v", changes[IPv4])
				}
				tr.Applied(IPv4, nil)
				tr.Applied(IPv6, nil)
				cur, other = other, cur
			}
			cpu.report(b)
		})
	}
}

// BenchmarkComputeService measures one Service with 10 endpoints in one family.
func BenchmarkComputeService(b *testing.B) {
	services, slices := benchCluster(1)
	b.ReportAllocs()
	for b.Loop() {
		ComputeService(services[0], slices, testNode, IPv4, Options{})
	}
}

// BenchmarkStateMemory reports the heap the model keeps for 10 000 Services × 10
// endpoints (the API objects excluded): the model's share of sluice's RSS.
func BenchmarkStateMemory(b *testing.B) {
	services, slices := benchCluster(10000)
	src := benchSource(services, slices)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := benchTracker(src, services, slices)
		states, _, _ := tr.Drain()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MiB")
		runtime.KeepAlive(tr)
		runtime.KeepAlive(states)
	}
}

// cpuClock measures the process's CPU time (all threads, GC included), which on a shared
// machine says more than wall time.
type cpuClock struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPUClock() cpuClock { return cpuClock{start: processCPU()} }

// report adds a cpu-ns/op metric.
func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
}
