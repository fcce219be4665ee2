package conntrack

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/errtest"
)

// Conventions: node 192.168.0.2; ClusterIPs 172.30.0.x; endpoints 10.0.x.y; port 53 → 5353.

// fakeSysctls is an in-memory /proc/sys or /sys/module; names in readOnly refuse writes
// as a read-only mount does.
type fakeSysctls struct {
	values   map[string]string
	readOnly map[string]bool
	writes   *[]string
}

func (f fakeSysctls) Get(name string) (int, error) {
	v, ok := f.values[name]
	if !ok {
		return 0, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return strconv.Atoi(v)
}

func (f fakeSysctls) Set(name string, value int) error {
	if f.readOnly[name] {
		return &os.PathError{Op: "open", Path: name, Err: syscall.EROFS}
	}
	f.values[name] = strconv.Itoa(value)
	*f.writes = append(*f.writes, fmt.Sprintf("%s=%d", name, value))
	return nil
}

func TestApplySysctls(t *testing.T) {
	const max, hash = sysctlMax, moduleParameterHashsize
	for _, tc := range []struct {
		name     string
		s        Settings
		cpus     int
		files    map[string]string
		readOnly []string
		tolerant bool
		want     map[string]string
		writes   int
		warnings []string
		wantErr  string
	}{
		{name: "upstream defaults on 2 CPUs: the minimum wins", cpus: 2,
			s:     Settings{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour},
			files: map[string]string{max: "65536", hash: "16384"},
			want: map[string]string{max: "131072", hash: "32768",
				sysctlTCPEstablished: "86400", sysctlTCPCloseWait: "3600"},
			writes: 4},
		{name: "per-core value wins on many CPUs", cpus: 16, s: Settings{MaxPerCore: 32768, Min: 131072},
			files: map[string]string{max: "65536", hash: "16384"}, want: map[string]string{max: "524288", hash: "131072"}, writes: 2},
		{name: "capped at 1M", cpus: 128, s: Settings{MaxPerCore: 32768, Min: 131072},
			files: map[string]string{max: "65536", hash: "16384"}, want: map[string]string{max: "1048576", hash: "262144"}, writes: 2},
		{name: "never lowered", cpus: 2, s: Settings{MaxPerCore: 32768, Min: 131072},
			files: map[string]string{max: "2000000", hash: "500000"}, want: map[string]string{max: "2000000", hash: "500000"}, writes: 0},
		{name: "hashsize raised even when max is already high", cpus: 2, s: Settings{MaxPerCore: 32768, Min: 131072},
			files: map[string]string{max: "262144", hash: "1024"}, want: map[string]string{max: "262144", hash: "32768"}, writes: 1},
		{name: "zero leaves everything alone", cpus: 2, s: Settings{},
			files: map[string]string{max: "1", hash: "1"}, want: map[string]string{max: "1", hash: "1"}, writes: 0},
		{name: "liberal and UDP timeouts", cpus: 2, s: Settings{TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute},
			files: map[string]string{}, want: map[string]string{sysctlTCPBeLiberal: "1",
				sysctlUDPTimeout: "30", sysctlUDPStreamTimeout: "120"}, writes: 3},
		{name: "values already set are not written", cpus: 2, s: Settings{TCPCloseWaitTimeout: time.Hour},
			files: map[string]string{sysctlTCPCloseWait: "3600"}, writes: 0},
		{name: "values already set on a read-only /proc/sys: no write, no error", cpus: 2,
			s:        Settings{MaxPerCore: 32768, Min: 131072, TCPCloseWaitTimeout: time.Hour},
			files:    map[string]string{max: "131072", hash: "32768", sysctlTCPCloseWait: "3600"},
			readOnly: []string{max, hash, sysctlTCPCloseWait}, writes: 0},
		{name: "read-only /sys is an error naming the hash size", cpus: 2, s: Settings{MaxPerCore: 32768, Min: 131072},
			files: map[string]string{max: "65536", hash: "16384"}, readOnly: []string{hash}, wantErr: "read-only"},
		{name: "read-only /proc/sys is an error", cpus: 2, s: Settings{TCPEstablishedTimeout: time.Hour},
			files: map[string]string{sysctlTCPEstablished: "86400"}, readOnly: []string{sysctlTCPEstablished}, wantErr: sysctlTCPEstablished + "=3600"},
		{name: "tolerant: every refused write is a warning, the rest is applied", cpus: 2, tolerant: true,
			s:        Settings{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: time.Hour, TCPCloseWaitTimeout: time.Hour},
			files:    map[string]string{max: "65536", hash: "16384", sysctlTCPEstablished: "86400", sysctlTCPCloseWait: "60"},
			readOnly: []string{max, hash, sysctlTCPEstablished},
			want:     map[string]string{max: "65536", hash: "16384", sysctlTCPEstablished: "86400", sysctlTCPCloseWait: "3600"},
			writes:   1, warnings: []string{max + "=131072", hash + "=32768", sysctlTCPEstablished + "=3600"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var writes, warnings []string
			readOnly := map[string]bool{}
			for _, name := range tc.readOnly {
				readOnly[name] = true
			}
			var sysctls, params hostnet.Sysctls = fakeSysctls{values: tc.files, readOnly: readOnly, writes: &writes},
				fakeSysctls{values: tc.files, readOnly: readOnly, writes: &writes}
			if tc.tolerant {
				warn := func(name string, value int, err error) {
					if !hostnet.IsNotWritable(err) {
						t.Errorf("warned about %v", err)
					}
					warnings = append(warnings, fmt.Sprintf("%s=%d", name, value))
				}
				sysctls, params = hostnet.Tolerant{Sysctls: sysctls, Warn: warn}, hostnet.Tolerant{Sysctls: params, Warn: warn}
			}
			err := applySysctls(context.Background(), tc.s, Kernel{Sysctls: sysctls, ModuleParameters: params}, tc.cpus)
			if errtest.Want(t, err, tc.wantErr) {
				return
			}
			for k, v := range tc.want {
				if tc.files[k] != v {
					t.Errorf("%s = %q, want %q", k, tc.files[k], v)
				}
			}
			if len(writes) != tc.writes {
				t.Errorf("writes = %q, want %d", writes, tc.writes)
			}
			if !slices.Equal(warnings, tc.warnings) {
				t.Errorf("warnings = %q, want %q", warnings, tc.warnings)
			}
		})
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func udpService(ns, name, clusterIP string, nodePort int32, eps ...model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		Name:         model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: "dns", Protocol: model.UDP},
		ClusterIP:    netip.MustParseAddr(clusterIP),
		Port:         53,
		NodePort:     nodePort,
		AllEndpoints: eps,
	}
}

func endpoint(ip string, serving bool) model.Endpoint {
	return model.Endpoint{IP: netip.MustParseAddr(ip), Port: 5353, Ready: serving, Serving: serving}
}

func state(ports ...*model.ServicePort) *model.NodeState {
	st := model.NewNodeState(model.IPv4, model.NodeInfo{Name: "node1"})
	for _, p := range ports {
		st.SetService(p.Name.NamespacedName, append(st.PortsOf(p.Name.NamespacedName), p), nil)
	}
	return st
}

func changedServices(names ...string) model.Changes {
	s := sets.New[types.NamespacedName]()
	for _, n := range names {
		ns, name, _ := strings.Cut(n, "/")
		s.Insert(types.NamespacedName{Namespace: ns, Name: name})
	}
	return model.Changes{Services: s}
}

func flow(proto uint8, origSrc, origDst, replySrc string) *Flow {
	return &Flow{Protocol: proto, Orig: Tuple{Src: ap(origSrc), Dst: ap(origDst)},
		Reply: Tuple{Src: ap(replySrc), Dst: ap(origSrc)}}
}

const udp, sctp, tcpProto = unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_TCP

func TestStaleEntries(t *testing.T) {
	lb := udpService("ns", "lb", "172.30.0.10", 30053, endpoint("10.0.1.1", true), endpoint("10.0.1.2", false))
	lb.LoadBalancerVIPs = []netip.Addr{netip.MustParseAddr("5.6.7.8")}
	lb.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.168.99.1")}
	zero := udpService("ns", "zero", "172.30.0.11", 30054)
	sc := udpService("ns", "sctp", "172.30.0.12", 0, endpoint("10.0.1.5", true))
	sc.Name.Protocol = model.SCTP
	unchanged := udpService("ns", "unchanged", "172.30.0.13", 0, endpoint("10.0.1.6", true))
	st := state(lb, zero, sc, unchanged)
	p := newPlan(st, changedServices("ns/lb", "ns/zero", "ns/sctp"), []netip.Addr{netip.MustParseAddr("192.168.0.2")})

	for _, tc := range []struct {
		name  string
		f     *Flow
		stale bool
	}{
		{"ClusterIP to a serving endpoint stays", flow(udp, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.1:5353"), false},
		{"ClusterIP to a gone endpoint goes", flow(udp, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.99:5353"), true},
		{"ClusterIP to a not-serving endpoint goes", flow(udp, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.2:5353"), true},
		{"LoadBalancer IP to a gone endpoint goes", flow(udp, "203.0.113.1:4000", "5.6.7.8:53", "10.0.1.99:5353"), true},
		{"externalIP to a gone endpoint goes", flow(udp, "203.0.113.1:4000", "192.168.99.1:53", "10.0.1.99:5353"), true},
		{"NodePort on a node address to a gone endpoint goes", flow(udp, "203.0.113.1:4000", "192.168.0.2:30053", "10.0.1.99:5353"), true},
		{"NodePort on a node address to a serving endpoint stays", flow(udp, "203.0.113.1:4000", "192.168.0.2:30053", "10.0.1.1:5353"), false},
		{"same port on another host stays", flow(udp, "10.0.2.9:4000", "198.51.100.7:30053", "198.51.100.7:30053"), false},
		{"scaled to zero: everything to the ClusterIP goes", flow(udp, "10.0.2.9:4000", "172.30.0.11:53", "10.0.1.7:5353"), true},
		{"scaled to zero: NodePort on a node address goes", flow(udp, "203.0.113.1:4000", "192.168.0.2:30054", "10.0.1.7:5353"), true},
		{"sent while there were no endpoints (not DNATed) goes", flow(udp, "10.0.2.9:4000", "172.30.0.11:53", "172.30.0.11:53"), true},
		{"SCTP to a gone endpoint goes", flow(sctp, "10.0.2.9:4000", "172.30.0.12:53", "10.0.1.99:5353"), true},
		{"SCTP to a serving endpoint stays", flow(sctp, "10.0.2.9:4000", "172.30.0.12:53", "10.0.1.5:5353"), false},
		{"TCP is never touched", flow(tcpProto, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.99:5353"), false},
		{"other protocol on the same frontend is not this Service", flow(sctp, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.99:5353"), false},
		{"unchanged Service is left alone", flow(udp, "10.0.2.9:4000", "172.30.0.13:53", "10.0.1.99:5353"), false},
		{"unrelated flow stays", flow(udp, "10.0.2.9:4000", "10.0.1.1:5353", "10.0.1.1:5353"), false},
	} {
		if got := p.stale(tc.f); got != tc.stale {
			t.Errorf("%s: stale = %v, want %v", tc.name, got, tc.stale)
		}
	}
	if full := newPlan(st, model.Changes{Full: true}, nil); !full.stale(flow(udp, "10.0.2.9:4000", "172.30.0.13:53", "10.0.1.99:5353")) {
		t.Errorf("a full sync does not cover every Service")
	}
}

// fakeTable is a conntrack table in memory.
type fakeTable struct {
	flows []*Flow
	walks map[uint8]int
}

func (f *fakeTable) Walk(_ context.Context, _ model.IPFamily, proto uint8, visit func(*Flow) bool) (int, error) {
	f.walks[proto]++
	n := 0
	kept := f.flows[:0]
	for _, fl := range f.flows {
		if fl.Protocol == proto && visit(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.flows = kept
	return n, nil
}

func TestReconcileWalksOnlyWhatChanged(t *testing.T) {
	tcpSvc := udpService("ns", "web", "172.30.0.20", 0, endpoint("10.0.1.1", true))
	tcpSvc.Name.Protocol = model.TCP
	dns := udpService("ns", "dns", "172.30.0.10", 0, endpoint("10.0.1.1", true))
	st := state(tcpSvc, dns)
	table := &fakeTable{walks: map[uint8]int{}, flows: []*Flow{
		flow(udp, "10.0.2.9:4000", "172.30.0.10:53", "10.0.1.99:5353"),
		flow(udp, "10.0.2.9:4001", "172.30.0.10:53", "10.0.1.1:5353"),
	}}
	r := NewReconciler(model.IPv4, withFlowTable(table), WithLocalAddresses(func() ([]netip.Addr, error) { return nil, nil }))

	// The first sync of a TCP Service programs a new frontend: one TCP walk, for the
	// entries that reached it before its rules (none here).
	if n, err := r.Reconcile(context.Background(), st, changedServices("ns/web")); err != nil || n != 0 || table.walks[tcpProto] != 1 || table.walks[udp] != 0 {
		t.Fatalf("new TCP Service: deleted %d, err %v, walks %v; want one TCP walk", n, err, table.walks)
	}
	// Its later changes (endpoints) walk nothing.
	if n, err := r.Reconcile(context.Background(), st, changedServices("ns/web")); err != nil || n != 0 || table.walks[tcpProto] != 1 || table.walks[udp] != 0 {
		t.Fatalf("TCP-only change of a known frontend: deleted %d, err %v, walks %v; want no walk", n, err, table.walks)
	}
	n, err := r.Reconcile(context.Background(), st, changedServices("ns/dns"))
	if err != nil || n != 1 || table.walks[udp] != 1 || table.walks[sctp] != 0 || table.walks[tcpProto] != 1 {
		t.Fatalf("deleted %d, err %v, walks %v; want 1 deleted in one UDP walk", n, err, table.walks)
	}
	if len(table.flows) != 1 || table.flows[0].Reply.Src != ap("10.0.1.1:5353") {
		t.Fatalf("left %v", table.flows)
	}
}

func TestUnansweredTCPEntries(t *testing.T) {
	web := udpService("ns", "web", "172.30.0.20", 30080, endpoint("10.0.1.1", true))
	web.Name.Protocol, web.Port = model.TCP, 80
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.168.99.1")}
	web.LoadBalancerVIPs = []netip.Addr{netip.MustParseAddr("5.6.7.8")}
	old := udpService("ns", "old", "172.30.0.21", 0, endpoint("10.0.1.2", true))
	old.Name.Protocol, old.Port = model.TCP, 80
	r := NewReconciler(model.IPv4)
	if fresh := r.newTCPFrontends(state(old), changedServices("ns/old")); len(fresh) != 1 {
		t.Fatalf("first sync of ns/old: new frontends %v, want its ClusterIP", fresh)
	}
	fresh := r.newTCPFrontends(state(web, old), changedServices("ns/web", "ns/old"))
	if len(fresh) != 3 {
		t.Fatalf("new frontends %v, want web's ClusterIP, external IP and load-balancer IP", fresh)
	}
	unanswered := func(f *Flow) *Flow { f.Replied = false; return f }
	answered := func(f *Flow) *Flow { f.Replied = true; return f }
	for _, tc := range []struct {
		name string
		f    *Flow
		want bool
	}{
		{"SYN to a new ClusterIP before its rules goes", unanswered(flow(tcpProto, "10.0.2.9:4000", "172.30.0.20:80", "172.30.0.20:80")), true},
		{"SYN to a new external IP before its rules goes", unanswered(flow(tcpProto, "203.0.113.1:4000", "192.168.99.1:80", "192.168.99.1:80")), true},
		{"SYN to a new load-balancer IP before its rules goes", unanswered(flow(tcpProto, "203.0.113.1:4000", "5.6.7.8:80", "5.6.7.8:80")), true},
		{"an answered un-NATed connection stays (a host that really has the address)", answered(flow(tcpProto, "203.0.113.1:4000", "192.168.99.1:80", "192.168.99.1:80")), false},
		{"a DNATed connection attempt stays", unanswered(flow(tcpProto, "10.0.2.9:4000", "172.30.0.20:80", "10.0.1.1:5353")), false},
		{"a known frontend is not walked", unanswered(flow(tcpProto, "10.0.2.9:4000", "172.30.0.21:80", "172.30.0.21:80")), false},
		{"another port of the address stays", unanswered(flow(tcpProto, "10.0.2.9:4000", "172.30.0.20:81", "172.30.0.20:81")), false},
		{"NodePorts are the node's own stack's (it resets)", unanswered(flow(tcpProto, "203.0.113.1:4000", "192.168.0.2:30080", "192.168.0.2:30080")), false},
	} {
		if got := unansweredTCP(tc.f, fresh); got != tc.want {
			t.Errorf("%s: unansweredTCP = %v, want %v", tc.name, got, tc.want)
		}
	}
	if again := r.newTCPFrontends(state(web, old), changedServices("ns/web")); len(again) != 0 {
		t.Errorf("an endpoint change of ns/web: new frontends %v, want none", again)
	}
	// A deleted and recreated Service's frontends are new again, also through a full sync.
	r.newTCPFrontends(state(old), changedServices("ns/web"))
	if back := r.newTCPFrontends(state(web, old), model.Changes{Full: true}); len(back) != 3 {
		t.Errorf("recreated ns/web in a full sync: new frontends %v, want its 3", back)
	}
}

// ctMessage builds a ctnetlink message as the kernel sends it.
func ctMessage(family uint8, proto uint8, origSrc, origDst, replySrc, replyDst netip.AddrPort) []byte {
	tuple := func(typ int, src, dst netip.AddrPort) *nl.RtAttr {
		t := nl.NewRtAttr(typ|unix.NLA_F_NESTED, nil)
		ip := t.AddRtAttr(ctaTupleIP|unix.NLA_F_NESTED, nil)
		if family == unix.AF_INET6 {
			ip.AddRtAttr(ctaIPv6Src, src.Addr().AsSlice())
			ip.AddRtAttr(ctaIPv6Dst, dst.Addr().AsSlice())
		} else {
			ip.AddRtAttr(ctaIPv4Src, src.Addr().AsSlice())
			ip.AddRtAttr(ctaIPv4Dst, dst.Addr().AsSlice())
		}
		p := t.AddRtAttr(ctaTupleProto|unix.NLA_F_NESTED, nil)
		p.AddRtAttr(ctaProtoNum, []byte{proto})
		sp, dp := make([]byte, 2), make([]byte, 2)
		sp[0], sp[1] = byte(src.Port()>>8), byte(src.Port())
		dp[0], dp[1] = byte(dst.Port()>>8), byte(dst.Port())
		p.AddRtAttr(ctaProtoSrcPort, sp)
		p.AddRtAttr(ctaProtoDstPort, dp)
		return t
	}
	msg := (&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0}).Serialize()
	msg = append(msg, tuple(ctaTupleOrig, origSrc, origDst).Serialize()...)
	msg = append(msg, tuple(ctaTupleReply, replySrc, replyDst).Serialize()...)
	status := nl.NewRtAttr(3, nl.Uint32Attr(0x1a8))
	return append(msg, status.Serialize()...)
}

func TestParseFlow(t *testing.T) {
	for _, tc := range []struct {
		family uint8
		proto  uint8
		orig   [2]string
		reply  [2]string
	}{
		{unix.AF_INET, udp, [2]string{"10.0.2.9:4000", "172.30.0.10:53"}, [2]string{"10.0.1.1:5353", "10.0.2.9:4000"}},
		{unix.AF_INET, sctp, [2]string{"10.0.2.9:4000", "172.30.0.12:7777"}, [2]string{"10.0.1.5:7777", "10.0.2.9:4000"}},
		{unix.AF_INET6, udp, [2]string{"[fd00::9]:4000", "[fd00:172::10]:53"}, [2]string{"[fd00::1]:5353", "[fd00::9]:4000"}},
	} {
		t.Run(fmt.Sprintf("%d/%d", tc.family, tc.proto), func(t *testing.T) {
			msg := ctMessage(tc.family, tc.proto, ap(tc.orig[0]), ap(tc.orig[1]), ap(tc.reply[0]), ap(tc.reply[1]))
			f, ok := parseFlow(msg)
			if !ok {
				t.Fatalf("parseFlow failed")
			}
			want := Flow{Protocol: tc.proto, Orig: Tuple{ap(tc.orig[0]), ap(tc.orig[1])}, Reply: Tuple{ap(tc.reply[0]), ap(tc.reply[1])}}
			if f != want {
				t.Errorf("parseFlow = %+v, want %+v", f, want)
			}
		})
	}
	// The message's status (0x1a8: confirmed, NATed) has no IPS_SEEN_REPLY; with it, the
	// flow is answered.
	msg := ctMessage(unix.AF_INET, tcpProto, ap("10.0.2.9:4000"), ap("172.30.0.20:80"), ap("10.0.1.1:8080"), ap("10.0.2.9:4000"))
	binary.BigEndian.PutUint32(msg[len(msg)-4:], 0x1a8|ipsSeenReply)
	if f, ok := parseFlow(msg); !ok || !f.Replied {
		t.Errorf("a flow with IPS_SEEN_REPLY: parsed %v, Replied %v; want answered", ok, f.Replied)
	}
	if _, ok := parseFlow([]byte{1, 2}); ok {
		t.Errorf("short message parsed")
	}
}
