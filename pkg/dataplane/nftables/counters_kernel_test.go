//go:build kernel

package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// countedAddrs are the addresses of TestTrafficCounters per family: the two counted
// Services' ClusterIPs, the node address for NodePorts, and the endpoints.
type countedAddrs struct {
	web, np, plain, node string
	podA, podB, podC     string
}

func countedFixture(f model.IPFamily) countedAddrs {
	if f == model.IPv6 {
		return countedAddrs{web: "fd00:172:30::30", np: "fd00:172:30::31", plain: "fd00:172:30::32", node: "2001:db8::1",
			podA: "fd00:10:180::1", podB: "fd00:10:180::2", podC: "fd00:10:180::3"}
	}
	return countedAddrs{web: "172.30.0.30", np: "172.30.0.31", plain: "172.30.0.32", node: "192.168.0.2",
		podA: "10.180.0.1", podB: "10.180.0.2", podC: "10.180.0.3"}
}

func epStr(f model.IPFamily, ip string, port int, local bool) string {
	s := netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String()
	if local {
		s += "@local"
	}
	return s
}

// TestTrafficCounters: N connections through a counted ClusterIP and M through a
// counted NodePort show up as N and M new connections on their paths; an endpoint
// change (a partial sync) and a full resync keep the counts; a Service not counted has
// no counter and its chains are as without the feature.
func TestTrafficCounters(t *testing.T) {
	for _, f := range model.Families {
		t.Run(f.String(), func(t *testing.T) {
			a := countedFixture(f)
			resetTable(t)
			tp := newTopology(t, f)
			tp.addPod("pod-a", a.podA)
			tp.addPod("pod-b", a.podB)
			tp.addPod("pod-c", a.podC)
			web := func(eps ...string) *model.ServicePort {
				sp := svc("t", "web", "http", model.TCP, a.web, 80).Endpoints(eps...).Build()
				sp.Counted = true
				return sp
			}
			np := svc("t", "np", "http", model.TCP, a.np, 80).NodePort(30090).Endpoints(epStr(f, a.podB, 80, true)).Build()
			np.Counted = true
			plain := svc("t", "plain", "http", model.TCP, a.plain, 80).Endpoints(epStr(f, a.podA, 80, true)).Build()

			b := newTestBackend(t, testConfig(f), WithLocalAddresses(hostnet.InterfaceAddrs))
			ns := nodeState(f, web(epStr(f, a.podA, 80, true), epStr(f, a.podB, 80, true)), np, plain)
			mustApply(t, b, ns, model.Changes{Full: true})

			const nWeb, nNodePort, nPlain = 7, 5, 3
			connect := func(n int, to netip.AddrPort) {
				t.Helper()
				for i := 0; i < n; i++ {
					if _, err := tp.tcp(tp.client, netip.Addr{}, to, quick); err != nil {
						t.Fatalf("connection %d to %v: %v", i, to, err)
					}
				}
			}
			webAP := netip.AddrPortFrom(netip.MustParseAddr(a.web), 80)
			connect(nWeb, webAP)
			connect(nNodePort, netip.AddrPortFrom(netip.MustParseAddr(a.node), 30090))
			connect(nPlain, netip.AddrPortFrom(netip.MustParseAddr(a.plain), 80))

			webCluster := series("t/web", "http", dataplane.PathCluster)
			npExternal := series("t/np", "http", dataplane.PathExternal)
			npCluster := series("t/np", "http", dataplane.PathCluster)
			want := map[dataplane.CounterSeries]uint64{webCluster: nWeb, npExternal: nNodePort, npCluster: nNodePort}
			countertest.Want(t, b, want)

			// An endpoint change is a partial sync of element operations: the counted chain
			// is not rewritten and keeps its counts.
			ns.SetService(types.NamespacedName{Namespace: "t", Name: "web"},
				[]*model.ServicePort{web(epStr(f, a.podA, 80, true), epStr(f, a.podB, 80, true), epStr(f, a.podC, 80, true))}, nil)
			mustApply(t, b, ns, changed("t/web"))
			countertest.Want(t, b, want)
			connect(2, webAP)
			want[webCluster] += 2
			countertest.Want(t, b, want)

			// A full resync compares the chains without the counters' values: nothing is
			// rewritten, nothing restarts.
			mustApply(t, b, ns, model.Changes{Full: true})
			countertest.Want(t, b, want)

			// The collector exports the same, summed over what it reads.
			c := dataplane.NewTrafficCounterCollector(klog.Background(), b)
			if got := countertest.NewConnections(c.Read()); !countertest.Equal(got, want) {
				t.Errorf("collector: %v, want %v", got, want)
			}
		})
	}
}

func series(svcName, port string, path dataplane.CounterPath) dataplane.CounterSeries {
	ns, name, _ := strings.Cut(svcName, "/")
	return dataplane.CounterSeries{Port: model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: model.TCP}, Path: path}
}
