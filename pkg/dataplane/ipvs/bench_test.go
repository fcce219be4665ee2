package ipvs

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// BenchmarkPartialSync measures a partial sync of one changed Service among many on the fake
// kernel: the cost sluice adds on top of the kernel calls (planning over every Service's
// ipset entries and addresses).
func BenchmarkPartialSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			k := newFakeNode()
			be, err := New(context.Background(), testConfig(model.IPv4), Settings{}, withFake(k))
			if err != nil {
				b.Fatal(err)
			}
			ports := make([]*model.ServicePort, n)
			for i := range ports {
				ports[i] = fixture.ServicePort(fmt.Sprintf("ns/s%05d", i), "", model.TCP, fmt.Sprintf("172.30.%d.%d", i/250, i%250), 80).Endpoints(fmt.Sprintf("10.180.2.%d:8080", i%250), fmt.Sprintf("10.180.1.%d:8080@local", i%250)).Build()
			}
			state := stateOf(ports...)
			if res := be.Apply(context.Background(), state, model.Changes{Full: true}); res.Err != nil {
				b.Fatal(res.Err)
			}
			b.ResetTimer()
			for i := range b.N {
				ch := changed(fmt.Sprintf("ns/s%05d", i%n))
				if res := be.Apply(context.Background(), state, ch); res.Err != nil || len(res.Failed) > 0 {
					b.Fatal(res.Err, res.Failed)
				}
			}
		})
	}
}
