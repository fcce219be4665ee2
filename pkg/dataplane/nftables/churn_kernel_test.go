//go:build kernel

package nftables

import (
	"fmt"
	"math/rand"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestEndpointChurnKeepsSyncing replays the benchmark's churn (issue 14): endpoints added
// to and removed from random ten-endpoint Services and single-endpoint Services moved,
// many Services sharing each endpoint map, partial syncs interleaved with full resyncs.
// Every sync must succeed, and a full read after each must find the endpoint maps as
// the Services want them.
func TestEndpointChurnKeepsSyncing(t *testing.T) {
	resetTable(t)
	const services = 1500
	f := model.IPv4
	b := newTestBackend(t, testConfig(f))
	rng := rand.New(rand.NewSource(14))
	next := 0
	newEP := func() string {
		next++
		return fmt.Sprintf("10.%d.%d.%d:8080", 100+next/65536, (next/256)%256, next%256)
	}
	eps := make([][]string, services)
	var ports []*model.ServicePort
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i)}
	}
	port := func(i int) *model.ServicePort {
		cip := fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
		return svc(name(i).Namespace, name(i).Name, "http", model.TCP, cip, 80).endpoints(eps[i]...).build()
	}
	for i := range eps {
		n := 10
		if i%10 == 0 {
			n = 1
		}
		for j := 0; j < n; j++ {
			eps[i] = append(eps[i], newEP())
		}
		ports = append(ports, port(i))
	}
	ns := nodeState(f, ports...)
	mustApply(t, b, ns, model.Changes{Full: true})

	for sync := 0; sync < 60; sync++ {
		var ch model.Changes
		var names []string
		for k := 0; k < 20; k++ {
			i := rng.Intn(services)
			switch {
			case i%10 == 0: // move the single endpoint
				eps[i] = []string{newEP()}
			case len(eps[i]) >= 10 && (len(eps[i]) > 10 || rng.Intn(2) == 0):
				j := rng.Intn(len(eps[i]))
				eps[i] = append(eps[i][:j:j], eps[i][j+1:]...)
			default:
				eps[i] = append(eps[i], newEP())
			}
			ns.SetService(name(i), []*model.ServicePort{port(i)}, nil)
			names = append(names, name(i).String())
		}
		ch = changed(names...)
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
	}
}
