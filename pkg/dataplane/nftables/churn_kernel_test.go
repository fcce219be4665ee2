//go:build kernel

package nftables

import (
	"fmt"
	"math/rand"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestEndpointChurnKeepsSyncing replays the benchmark's churn (issue 14): endpoints added
// to and removed from random ten-endpoint Services and single-endpoint Services moved,
// 1 500 Services sharing the 256 endpoint maps, 20 changes per sync, partial syncs
// interleaved with full resyncs. Every sync must succeed, a read after each must find
// the table as the backend's model says, and real packets to a few probe Services among
// the churned ones must reach their current endpoints.
func TestEndpointChurnKeepsSyncing(t *testing.T) {
	const services, syncs, changesPerSync = 1500, 60, 20
	f := model.IPv4
	resetTable(t)
	tp := newTopology(t, f)
	pods := []string{"pod-a", "pod-b", "pod-c"}
	podEP := map[string]string{}
	for i, name := range pods {
		ip := fmt.Sprintf("10.180.0.%d", i+1)
		tp.addPod(name, ip)
		podEP[ip+":8080"] = name
	}
	b := newTestBackend(t, testConfig(f))
	rng := rand.New(rand.NewSource(14))

	next := 0
	newEP := func() string {
		next++
		return fmt.Sprintf("10.%d.%d.%d:8080", 100+next/65536, (next/256)%256, next%256)
	}
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
	}
	clusterIP := func(i int) string { return fmt.Sprintf("172.30.%d.%d", i/250, i%250+1) }
	eps := make([][]string, services)
	port := func(i int) *model.ServicePort {
		return svc(name(i).Namespace, name(i).Name, "http", model.TCP, clusterIP(i), 80).Endpoints(eps[i]...).Build()
	}
	// Probes: single-endpoint Services moving between the pods, and a Service whose
	// endpoints are a changing subset of them.
	singleProbes := []int{0, 10, 20, 30}
	const multiProbe = 1
	isProbe := func(i int) bool { return i == multiProbe || i < 40 && i%10 == 0 }
	randomPods := func(min int) []string {
		var out []string
		for len(out) < min {
			out = nil
			for ip := range podEP {
				if rng.Intn(2) == 0 {
					out = append(out, ip)
				}
			}
		}
		return out
	}

	var ports []*model.ServicePort
	for i := range eps {
		switch {
		case i == multiProbe:
			eps[i] = randomPods(1)
		case isProbe(i):
			eps[i] = randomPods(1)[:1]
		case i%10 == 0:
			eps[i] = []string{newEP()}
		default:
			for j := 0; j < 10; j++ {
				eps[i] = append(eps[i], newEP())
			}
		}
		ports = append(ports, port(i))
	}
	ns := nodeState(f, ports...)
	mustApply(t, b, ns, model.Changes{Full: true})

	for sync := 0; sync < syncs; sync++ {
		names := []string{name(multiProbe).String()}
		eps[multiProbe] = randomPods(1)
		ns.SetService(name(multiProbe), []*model.ServicePort{port(multiProbe)}, nil)
		for k := 0; k < changesPerSync; k++ {
			i := rng.Intn(services)
			switch {
			case i == multiProbe:
				continue
			case isProbe(i):
				eps[i] = randomPods(1)[:1]
			case i%10 == 0: // move the single endpoint
				eps[i] = []string{newEP()}
			case len(eps[i]) > 10 || len(eps[i]) == 10 && rng.Intn(2) == 0:
				j := rng.Intn(len(eps[i]))
				eps[i] = append(eps[i][:j:j], eps[i][j+1:]...)
			default:
				eps[i] = append(eps[i], newEP())
			}
			ns.SetService(name(i), []*model.ServicePort{port(i)}, nil)
			names = append(names, name(i).String())
		}
		ch := changed(names...)
		ch.Full = sync%4 == 3
		res := b.Apply(t.Context(), ns, ch)
		if res.Err != nil || len(res.Failed) > 0 {
			t.Fatalf("sync %d (full %v): err %v, failed %v", sync, ch.Full, res.Err, res.Failed)
		}
		st, _, err := readState(b.c, b.f, nil)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if d := driftOf(b.state, st); d.Total() > 0 {
			t.Fatalf("sync %d (full %v): the kernel differs from the model: %+v", sync, ch.Full, *d)
		}

		for _, i := range append(singleProbes, multiProbe) {
			want := map[string]bool{}
			for _, ep := range eps[i] {
				want[podEP[ep]] = true
			}
			for try := 0; try < 2; try++ {
				r, err := tp.tcp(tp.client, netip.Addr{}, netip.MustParseAddrPort(clusterIP(i)+":80"), quick)
				if err != nil {
					t.Fatalf("sync %d: Service %d (endpoints %v): %v", sync, i, eps[i], err)
				}
				if !want[r.pod] {
					t.Fatalf("sync %d: Service %d (endpoints %v) answered by %s", sync, i, eps[i], r.pod)
				}
			}
		}
	}
}
