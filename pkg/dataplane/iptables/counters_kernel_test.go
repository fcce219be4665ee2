//go:build kernel

package iptables

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// connectN opens n TCP connections from ns to addr; each must be answered.
func connectN(t *testing.T, n int, ns, addr string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := dial(ns, "tcp", addr, 2*time.Second); err != nil {
			t.Fatalf("connection %d to %s: %v", i, addr, err)
		}
	}
}

func counterSeries(name string, path dataplane.CounterPath) dataplane.CounterSeries {
	return dataplane.CounterSeries{Port: model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p80", Protocol: model.TCP}, Path: path}
}

// TestKernelTrafficCounters: N connections through a counted ClusterIP and M through
// its NodePort count N+M on the cluster path and M on the external path, in both
// flavours; an endpoint change rewrites KUBE-SVC (a partial sync) and a full sync
// rewrites every chain, and both carry the counts over.
func TestKernelTrafficCounters(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			top := newTopology(t)
			b := newKernelBackend(t, f)
			w := &world{}
			a, bb := kPodA+":80@local", kPodB+":80"
			w.add(fixture.APIService("ns/web", "p80", model.TCP, "172.30.0.10", 80).NodePort(30001).Endpoints(a, bb).Build())
			w.add(fixture.APIService("ns/plain", "p80", model.TCP, "172.30.0.11", 80).Endpoints(a).Build())
			// Only web is counted: plain shows a Service without counters beside it.
			state := func() *model.NodeState { return countertest.Counted(w.kstate(), "ns/web") }
			kApply(t, b, state(), full())

			const n, m = 6, 4
			connectN(t, n, top.client, "172.30.0.10:80")
			connectN(t, m, top.client, kNodeIP+":30001")
			connectN(t, 3, top.client, "172.30.0.11:80")
			cluster, external := counterSeries("web", dataplane.PathCluster), counterSeries("web", dataplane.PathExternal)
			want := map[dataplane.CounterSeries]uint64{cluster: n + m, external: m}
			countertest.Want(t, b, want)

			// Endpoint change: KUBE-SVC is rewritten in a partial sync, with its counts.
			w.set(fixture.APIService("ns/web", "p80", model.TCP, "172.30.0.10", 80).NodePort(30001).Endpoints(a).Build())
			if res := kApply(t, b, state(), changed("ns/web")); res.Full {
				t.Fatal("the endpoint change was a full sync")
			}
			countertest.Want(t, b, want)
			connectN(t, 2, top.client, "172.30.0.10:80")
			want[cluster] += 2
			countertest.Want(t, b, want)

			// A full sync flushes and refills every chain, with the counts.
			kApply(t, b, state(), full())
			countertest.Want(t, b, want)

			c := dataplane.NewTrafficCounterCollector(klog.Background(), b)
			for _, tc := range c.Read() {
				if tc.NewConnections != want[tc.CounterSeries] {
					t.Errorf("collector: %v = %d, want %d", tc.CounterSeries, tc.NewConnections, want[tc.CounterSeries])
				}
			}
		})
	}
}

// TestKernelTrafficCountersIPv6: the same counts for an IPv6 ClusterIP and its NodePort
// on the node's address (the pod reaches itself through both, hairpinned), in both
// flavours, kept through a full sync.
func TestKernelTrafficCountersIPv6(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			pod := ipv6Pod(t)

			w := &world{}
			w.add(fixture.APIService("ns/v6", "p80", model.TCP, "fd00:172:30::10", 80).NodePort(30002).Endpoints("[fd00:10::2]:80@local").Build())
			b, err := New(context.Background(), testConfig(model.IPv6), WithFlavour(f))
			if err != nil {
				t.Fatal(err)
			}
			node := model.NodeInfo{Name: fixture.NodeName, IPs: []netip.Addr{netip.MustParseAddr("fd00:10::1")}}
			st := model.Compute(w.services, w.slices, node, nil, model.Options{Families: []model.IPFamily{model.IPv6}, TrafficCounters: model.TrafficCountersAll})[model.IPv6]
			kApply(t, b, st, full())
			const n, m = 5, 3
			connectN(t, n, pod, "[fd00:172:30::10]:80")
			connectN(t, m, pod, "[fd00:10::1]:30002")
			want := map[dataplane.CounterSeries]uint64{counterSeries("v6", dataplane.PathCluster): n + m, counterSeries("v6", dataplane.PathExternal): m}
			countertest.Want(t, b, want)
			kApply(t, b, st, full())
			countertest.Want(t, b, want)
		})
	}
}
