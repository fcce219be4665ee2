//go:build kernel

package iptables

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
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

// tcpPayload is what each connection of connectSending writes.
const tcpPayload = 1000

// connectSending opens n TCP connections from ns to addr, each writing tcpPayload bytes
// and reading the server's answer (it answers and closes without reading).
func connectSending(t *testing.T, n int, ns, addr string) {
	t.Helper()
	for i := 0; i < n; i++ {
		var c net.Conn
		err := netnstest.Do(ns, func() error {
			var err error
			c, err = net.DialTimeout("tcp", addr, 2*time.Second)
			return err
		})
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, addr, err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, werr := c.Write(make([]byte, tcpPayload))
		_, _ = c.Read(make([]byte, 100))
		_ = c.Close()
		if werr != nil {
			t.Fatalf("connection %d to %s: writing: %v", i, addr, werr)
		}
	}
}

// datagrams sends n UDP datagrams of "hello\n" (6 bytes) from ns to addr; each must be
// answered.
func datagrams(t *testing.T, n int, ns, addr string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := dial(ns, "udp", addr, 2*time.Second); err != nil {
			t.Fatalf("datagram %d to %s: %v", i, addr, err)
		}
	}
}

// packetWant is what one series must count: at least conns TCP connections' packets (a
// SYN, the handshake's ACK and the payload's segment, each with an IP header of ipHeader
// bytes and a TCP header of at least 20), or exactly datagrams UDP datagrams of 6 bytes.
// counterTraffic is the first traffic of a counter test, sent from one namespace: n
// connections (each sending data) to web's ClusterIP and m to its NodePort, and k datagrams
// to dns's ClusterIP; ipHeader is the family's header size for checkPackets.
type counterTraffic struct {
	from                       string
	web, dns                   string // Services of namespace "ns"
	clusterIP, nodePort, dnsIP string
	n, m, k                    int
	ipHeader                   uint64
}

// send makes the traffic and checks what it counts: n+m new connections on web's cluster
// path and m on its external one, k on dns's, and their packets. It returns web's cluster
// series, the new connections and packets expected per series, and the packet counts read.
func (c counterTraffic) send(t *testing.T, b *Backend) (dataplane.CounterSeries, map[dataplane.CounterSeries]uint64,
	map[dataplane.CounterSeries]packetWant, map[dataplane.CounterSeries]dataplane.TrafficCount) {
	t.Helper()
	connectSending(t, c.n, c.from, c.clusterIP)
	connectSending(t, c.m, c.from, c.nodePort)
	datagrams(t, c.k, c.from, c.dnsIP)
	cluster, external := counterSeries(c.web, dataplane.PathCluster), counterSeries(c.web, dataplane.PathExternal)
	dns := counterSeries(c.dns, dataplane.PathCluster)
	dns.Port.Protocol = model.UDP
	n, m, k := uint64(c.n), uint64(c.m), uint64(c.k)
	want := map[dataplane.CounterSeries]uint64{cluster: n + m, external: m, dns: k}
	countertest.Want(t, b, want)
	// A NodePort's packets count on "external" only; the ClusterIP's on "cluster".
	wantPkts := map[dataplane.CounterSeries]packetWant{cluster: {conns: n}, external: {conns: m}, dns: {datagrams: k}}
	last := countertest.Packets(t, b)
	checkPackets(t, last, wantPkts, c.ipHeader, nil)
	return cluster, want, wantPkts, last
}

type packetWant struct {
	conns, datagrams uint64
}

// checkPackets checks got against want (series absent from want count nothing) and
// against the previous read, which no count may fall below.
func checkPackets(t *testing.T, got map[dataplane.CounterSeries]dataplane.TrafficCount, want map[dataplane.CounterSeries]packetWant,
	ipHeader uint64, last map[dataplane.CounterSeries]dataplane.TrafficCount) {
	t.Helper()
	for s, w := range want {
		g := got[s]
		switch {
		case w.datagrams > 0:
			if e := (dataplane.TrafficCount{Packets: w.datagrams, Bytes: w.datagrams * (ipHeader + 8 + 6)}); g != e {
				t.Errorf("%v: %d packets, %d bytes; want exactly %d, %d", s, g.Packets, g.Bytes, e.Packets, e.Bytes)
			}
		case g.Packets < 3*w.conns || g.Bytes < w.conns*tcpPayload+g.Packets*(ipHeader+20):
			t.Errorf("%v: %d packets, %d bytes; want at least %d packets and %d bytes of payload plus %d per packet",
				s, g.Packets, g.Bytes, 3*w.conns, w.conns*tcpPayload, ipHeader+20)
		}
	}
	for s, g := range got {
		if _, ok := want[s]; !ok && (g.Packets != 0 || g.Bytes != 0) {
			t.Errorf("%v counted %d packets, want none", s, g.Packets)
		}
	}
	for s, l := range last {
		if g := got[s]; g.Packets < l.Packets || g.Bytes < l.Bytes {
			t.Errorf("%v went down: %+v after %+v", s, g, l)
		}
	}
}

// mangleHolds reports whether a flavour's mangle table of family holds anything of the
// packet counters.
func mangleHolds(t *testing.T, f Flavour, family model.IPFamily) bool {
	t.Helper()
	prog := "iptables-"
	if family == model.IPv6 {
		prog = "ip6tables-"
	}
	return strings.Contains(run(t, prog+string(f)+"-save", "-t", "mangle"), "SLUICE-")
}

// TestKernelTrafficCounters: N connections through a counted ClusterIP and M through
// its NodePort count N+M on the cluster path and M on the external path, in both
// flavours; their packets and bytes count on the path of the address used (at least
// what TCP must send; UDP datagrams exactly); an endpoint change rewrites KUBE-SVC (a
// partial sync) and a full sync rewrites every chain, and both keep the counts, and so
// does a restart of sluice; the last counted Service gone takes the counters out of
// mangle and nat.
func TestKernelTrafficCounters(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			top := newTopology(t)
			b := newKernelBackend(t, f)
			w := &world{}
			a, bb := kPodA+":80@local", kPodB+":80"
			w.add(fixture.APIService("ns/web", "p80", model.TCP, "172.30.0.10", 80).NodePort(30001).Endpoints(a, bb).Build())
			w.add(fixture.APIService("ns/plain", "p80", model.TCP, "172.30.0.11", 80).Endpoints(a).Build())
			w.add(fixture.APIService("ns/dns", "p80", model.UDP, "172.30.0.12", 80).Endpoints(bb).Build())
			// web and dns are counted: plain shows a Service without counters beside them.
			counted := []string{"ns/web", "ns/dns"}
			state := func() *model.NodeState { return countertest.Counted(w.kstate(), counted...) }
			kApply(t, b, state(), full())

			const n = 6
			connectSending(t, 3, top.client, "172.30.0.11:80") // plain: counts nowhere
			cluster, want, wantPkts, last := counterTraffic{
				from: top.client, web: "web", dns: "dns",
				clusterIP: "172.30.0.10:80", nodePort: kNodeIP + ":30001", dnsIP: "172.30.0.12:80",
				n: n, m: 4, k: 5, ipHeader: 20,
			}.send(t, b)

			// Endpoint change: KUBE-SVC is rewritten in a partial sync, with its counts;
			// mangle is not touched.
			w.set(fixture.APIService("ns/web", "p80", model.TCP, "172.30.0.10", 80).NodePort(30001).Endpoints(a).Build())
			if res := kApply(t, b, state(), changed("ns/web")); res.Full {
				t.Fatal("the endpoint change was a full sync")
			}
			countertest.Want(t, b, want)
			got := countertest.Packets(t, b)
			checkPackets(t, got, wantPkts, 20, last)
			connectSending(t, 2, top.client, "172.30.0.10:80")
			want[cluster] += 2
			wantPkts[cluster] = packetWant{conns: n + 2}
			countertest.Want(t, b, want)
			last = countertest.Packets(t, b)
			checkPackets(t, last, wantPkts, 20, got)

			// Another Service's change (a partial sync) and a full sync keep them.
			w.set(fixture.APIService("ns/plain", "p80", model.TCP, "172.30.0.11", 80).Endpoints(a, bb).Build())
			kApply(t, b, state(), changed("ns/plain"))
			kApply(t, b, state(), full())
			countertest.Want(t, b, want)
			got = countertest.Packets(t, b)
			checkPackets(t, got, wantPkts, 20, last)

			// A restarted sluice (a new backend, whose first sync is full) finds the
			// counter chains intact and leaves them counting.
			b = newKernelBackend(t, f)
			kApply(t, b, state(), full())
			countertest.Want(t, b, want)
			got = countertest.Packets(t, b)
			checkPackets(t, got, wantPkts, 20, last)

			c := dataplane.NewTrafficCounterCollector(klog.Background(), b)
			for _, tc := range c.Read() {
				if tc.NewConnections != want[tc.CounterSeries] {
					t.Errorf("collector: %v = %d, want %d", tc.CounterSeries, tc.NewConnections, want[tc.CounterSeries])
				}
				if !tc.HasPacketsBytes || tc.Packets != got[tc.CounterSeries].Packets {
					t.Errorf("collector: %v: %d packets (%v), want %d", tc.CounterSeries, tc.Packets, tc.HasPacketsBytes, got[tc.CounterSeries].Packets)
				}
			}

			// The last counted Service uncounted: a full sync takes the jumps and chains out.
			counted = []string{"ns/none"} // (none named would count every Service)
			res := kApply(t, b, state(), changed("ns/web", "ns/dns"))
			if !res.Full {
				t.Error("uncounting the last Service was not a full sync")
			}
			if mangleHolds(t, f, model.IPv4) {
				t.Errorf("mangle still holds packet counters:\n%s", run(t, "iptables-"+string(f)+"-save", "-t", "mangle"))
			}
			if nat := run(t, "iptables-"+string(f)+"-save", "-t", "nat"); strings.Contains(nat, "SLUICE-") {
				t.Errorf("nat still holds counter chains:\n%s", nat)
			}
			connectN(t, 1, top.client, "172.30.0.10:80")
		})
	}
}

// TestKernelTrafficCountersIPv6: the same counts for an IPv6 ClusterIP and its NodePort
// on the node's address (the pod reaches itself through both, hairpinned), and packets
// and bytes with IPv6 headers, in both flavours, kept through a partial and a full sync.
func TestKernelTrafficCountersIPv6(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			pod := ipv6Pod(t)

			w := &world{}
			w.add(fixture.APIService("ns/v6", "p80", model.TCP, "fd00:172:30::10", 80).NodePort(30002).Endpoints("[fd00:10::2]:80@local").Build())
			w.add(fixture.APIService("ns/dns6", "p80", model.UDP, "fd00:172:30::11", 80).Endpoints("[fd00:10::2]:80@local").Build())
			b, err := New(context.Background(), testConfig(model.IPv6), WithFlavour(f))
			if err != nil {
				t.Fatal(err)
			}
			node := model.NodeInfo{Name: fixture.NodeName, IPs: []netip.Addr{netip.MustParseAddr("fd00:10::1")}}
			state := func() *model.NodeState {
				return model.Compute(w.services, w.slices, node, nil, model.Options{Families: []model.IPFamily{model.IPv6}, TrafficCounters: model.TrafficCountersAll})[model.IPv6]
			}
			kApply(t, b, state(), full())
			_, want, wantPkts, last := counterTraffic{
				from: pod, web: "v6", dns: "dns6",
				clusterIP: "[fd00:172:30::10]:80", nodePort: "[fd00:10::1]:30002", dnsIP: "[fd00:172:30::11]:80",
				n: 5, m: 3, k: 4, ipHeader: 40,
			}.send(t, b)

			// A partial sync of the counted Service (a second endpoint) and a full sync.
			w.set(fixture.APIService("ns/v6", "p80", model.TCP, "fd00:172:30::10", 80).NodePort(30002).Endpoints("[fd00:10::2]:80@local", "[fd00:10::3]:80").Build())
			if res := kApply(t, b, state(), changed("ns/v6")); res.Full {
				t.Fatal("the endpoint change was a full sync")
			}
			got := countertest.Packets(t, b)
			checkPackets(t, got, wantPkts, 40, last)
			kApply(t, b, state(), full())
			countertest.Want(t, b, want)
			checkPackets(t, countertest.Packets(t, b), wantPkts, 40, got)
		})
	}
}
