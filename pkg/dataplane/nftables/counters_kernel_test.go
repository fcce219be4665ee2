//go:build kernel

package nftables

import (
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
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
			dns := svc("t", "web", "dns", model.UDP, a.web, 80).Endpoints(epStr(f, a.podA, 80, true)).Build()
			dns.Counted = true

			b := newTestBackend(t, testConfig(f), WithLocalAddresses(hostnet.InterfaceAddrs))
			ns := nodeState(f, web(epStr(f, a.podA, 80, true), epStr(f, a.podB, 80, true)), dns, np, plain)
			mustApply(t, b, ns, model.Changes{Full: true})

			const nWeb, nNodePort, nPlain, nDNS = 7, 5, 3, 4
			connect := func(n int, to netip.AddrPort) {
				t.Helper()
				for i := 0; i < n; i++ {
					if err := sendTCP(tp.client, to, payloadBytes); err != nil {
						t.Fatalf("connection %d to %v: %v", i, to, err)
					}
				}
			}
			webAP := netip.AddrPortFrom(netip.MustParseAddr(a.web), 80)
			connect(nWeb, webAP)
			connect(nNodePort, netip.AddrPortFrom(netip.MustParseAddr(a.node), 30090))
			connect(nPlain, netip.AddrPortFrom(netip.MustParseAddr(a.plain), 80))
			for i := 0; i < nDNS; i++ {
				if _, err := tp.udp(tp.client, netip.Addr{}, webAP, quick); err != nil {
					t.Fatalf("datagram %d to %v: %v", i, webAP, err)
				}
			}

			webCluster := series("t/web", "http", dataplane.PathCluster)
			npExternal := series("t/np", "http", dataplane.PathExternal)
			npCluster := series("t/np", "http", dataplane.PathCluster)
			dnsCluster := series("t/web", "dns", dataplane.PathCluster)
			dnsCluster.Port.Protocol = model.UDP
			want := map[dataplane.CounterSeries]uint64{webCluster: nWeb, npExternal: nNodePort, npCluster: nNodePort, dnsCluster: nDNS}
			countertest.Want(t, b, want)

			// Packets and bytes: every packet the clients sent, on the path of the address
			// they sent it to. A TCP connection sends at least its SYN, the handshake's ACK
			// and one segment with the payload, each with an IP and a 20-byte TCP header;
			// a UDP exchange here is one datagram of 2 bytes ("hi"), exactly.
			ipHeader := uint64(20)
			if f == model.IPv6 {
				ipHeader = 40
			}
			minimum := map[dataplane.CounterSeries]dataplane.TrafficCount{
				webCluster: {Packets: 3 * nWeb, Bytes: nWeb * payloadBytes},
				npExternal: {Packets: 3 * nNodePort, Bytes: nNodePort * payloadBytes},
			}
			exact := map[dataplane.CounterSeries]dataplane.TrafficCount{
				dnsCluster: {Packets: nDNS, Bytes: nDNS * (ipHeader + 8 + 2)},
				npCluster:  {}, // a NodePort's packets count on "external" only
			}
			last := wantPackets(t, b, minimum, exact, ipHeader+20, nil)

			// An endpoint change is a partial sync of element operations: the counted chain
			// is not rewritten and keeps its counts.
			ns.SetService(types.NamespacedName{Namespace: "t", Name: "web"},
				[]*model.ServicePort{web(epStr(f, a.podA, 80, true), epStr(f, a.podB, 80, true), epStr(f, a.podC, 80, true)), dns}, nil)
			mustApply(t, b, ns, changed("t/web"))
			countertest.Want(t, b, want)
			last = wantPackets(t, b, minimum, exact, ipHeader+20, last)
			connect(2, webAP)
			want[webCluster] += 2
			countertest.Want(t, b, want)
			minimum[webCluster] = dataplane.TrafficCount{Packets: 3 * (nWeb + 2), Bytes: (nWeb + 2) * payloadBytes}
			last = wantPackets(t, b, minimum, exact, ipHeader+20, last)

			// A full resync compares the chains without the counters' values: nothing is
			// rewritten, nothing restarts.
			mustApply(t, b, ns, model.Changes{Full: true})
			countertest.Want(t, b, want)
			wantPackets(t, b, minimum, exact, ipHeader+20, last)

			// The collector exports the same, summed over what it reads.
			c := dataplane.NewTrafficCounterCollector(klog.Background(), b)
			if got := countertest.NewConnections(c.Read()); !countertest.Equal(got, want) {
				t.Errorf("collector: %v, want %v", got, want)
			}
		})
	}
}

// payloadBytes is what each TCP connection of TestTrafficCounters sends.
const payloadBytes = 1000

// sendTCP connects from namespace ns to dst, sends n bytes and closes. The test servers
// answer and close without reading, so what the client reads back is not looked at.
func sendTCP(ns string, dst netip.AddrPort, n int) error {
	var c net.Conn
	if err := netnstest.Do(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), quick)
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(quick))
	if _, err := c.Write(make([]byte, n)); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, c)
	return nil
}

// wantPackets reads b's counters and checks their packets and bytes: at least minimum
// (packets, and bytes of payload plus perPacket bytes of headers per packet counted),
// exactly exact, and nothing below the previous read (last). It returns what it read.
func wantPackets(t *testing.T, b dataplane.TrafficCounterReader, minimum, exact map[dataplane.CounterSeries]dataplane.TrafficCount,
	perPacket uint64, last map[dataplane.CounterSeries]dataplane.TrafficCount) map[dataplane.CounterSeries]dataplane.TrafficCount {
	t.Helper()
	got := countertest.Packets(t, b)
	for s, m := range minimum {
		g := got[s]
		if g.Packets < m.Packets || g.Bytes < m.Bytes+g.Packets*perPacket {
			t.Errorf("%v: %d packets, %d bytes; want at least %d packets and %d bytes of payload plus %d per packet", s, g.Packets, g.Bytes, m.Packets, m.Bytes, perPacket)
		}
	}
	for s, e := range exact {
		if g := got[s]; g != e {
			t.Errorf("%v: %d packets, %d bytes; want exactly %d, %d", s, g.Packets, g.Bytes, e.Packets, e.Bytes)
		}
	}
	for s, l := range last {
		if g := got[s]; g.Packets < l.Packets || g.Bytes < l.Bytes {
			t.Errorf("%v went down: %+v after %+v", s, g, l)
		}
	}
	return got
}

func series(svcName, port string, path dataplane.CounterPath) dataplane.CounterSeries {
	ns, name, _ := strings.Cut(svcName, "/")
	return dataplane.CounterSeries{Port: model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: model.TCP}, Path: path}
}

// TestPacketCountersSwitchOnAndOff: the first Service counted by a partial change
// brings the packet counters' fixed part with a full sync (the kernel takes it, and
// counts packets), and the last one uncounted takes it away again.
func TestPacketCountersSwitchOnAndOff(t *testing.T) {
	f := model.IPv4
	a := countedFixture(f)
	resetTable(t)
	tp := newTopology(t, f)
	tp.addPod("pod-a", a.podA)
	b := newTestBackend(t, testConfig(f), WithLocalAddresses(hostnet.InterfaceAddrs))
	plain := nodeState(f, svc("t", "web", "http", model.TCP, a.web, 80).Endpoints(epStr(f, a.podA, 80, true)).Build())
	mustApply(t, b, plain, model.Changes{Full: true})
	mustApply(t, b, plain, changed("t/web")) // a partial sync, counting off

	on := countertest.Counted(plain, "t/web")
	mustApply(t, b, on, changed("t/web"))
	if st := b.LastStats(); !st.Full || st.Reason != reasonPacketCounters {
		t.Fatalf("counting the first Service: full=%v reason %q, want a full sync for %q", st.Full, st.Reason, reasonPacketCounters)
	}
	webAP := netip.AddrPortFrom(netip.MustParseAddr(a.web), 80)
	if err := sendTCP(tp.client, webAP, payloadBytes); err != nil {
		t.Fatal(err)
	}
	counts, err := b.ReadTrafficCounters()
	if err != nil || len(counts) != 1 || counts[0].Packets < 3 || counts[0].Bytes < payloadBytes {
		t.Fatalf("after one connection: %+v, %v", counts, err)
	}

	mustApply(t, b, plain, changed("t/web"))
	if st := b.LastStats(); !st.Full || st.Reason != reasonPacketCounters {
		t.Fatalf("uncounting the last Service: full=%v reason %q", st.Full, st.Reason)
	}
	out := nftList(t, f)
	for _, gone := range []string{packetCountersMap, countClusterChainPrefix} {
		if strings.Contains(out, gone) {
			t.Errorf("%s still in the table after the last counted Service:\n%s", gone, out)
		}
	}
	if err := sendTCP(tp.client, webAP, payloadBytes); err != nil {
		t.Errorf("the Service after counting stopped: %v", err)
	}
}
