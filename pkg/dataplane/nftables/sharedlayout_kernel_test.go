//go:build kernel

package nftables

// A prototype, in raw netlink, of a table whose number of chains does not grow with the
// number of Services (docs/benchmarks-nftables.md, "A table with a bounded number of
// chains"), measured against the backend's table of today in the same run.
//
// Every nf_tables commit walks every chain of the namespace, so with a chain per
// Service no transaction is cheaper than O(Services). In the prototype a plain Service
// (the bulk at scale) has no chain of its own:
//
//	services:        ip daddr . meta l4proto . th dport @proto-cluster-ips goto proto-select
//	proto-select:    jump proto-round            (R times)
//	                 goto proto-fallback
//	proto-round:     dnat ip addr . port to ip daddr . meta l4proto . th dport .
//	                     numgen random mod 2^k offset k*1000000 map @proto-endpoints   (k = 0..20)
//	proto-fallback:  the same with "mod 1": slot 0 of each k
//
// A Service with N endpoints fills the slots k*1000000 + 0..N-1 of the map, k being
// ceil(log2 N): only its own k's rule can hit, with probability N/2^k > 1/2; a miss
// (an empty slot) tries the next rule, then the next round. After R rounds, the fallback
// takes slot 0: probability below 2^-R. Every endpoint change is map elements.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

const (
	protoMaxK        = 20
	protoSlotStride  = 1000000
	protoClusterIPs  = "proto-cluster-ips"
	protoEndpointMap = "proto-endpoints"
	protoSelect      = "proto-select"
	protoRound       = "proto-round"
	protoFallback    = "proto-fallback"
)

// protoRounds is R; SLUICE_PROTO_ROUNDS overrides it.
func protoRounds() int {
	if v, err := strconv.Atoi(os.Getenv("SLUICE_PROTO_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return 16
}

// protoLayouts returns the layouts BenchmarkSharedLayout measures: SLUICE_PROTO_LAYOUTS
// ("today,shared" by default; "shared" alone for more iterations of the prototype).
func protoLayouts() []string {
	if v := os.Getenv("SLUICE_PROTO_LAYOUTS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"today", "shared"}
}

// protoSelectDNAT is "dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen
// random mod 2^k offset k*stride map @set" (mod 1 with fallback).
type protoSelectDNAT struct {
	set      string
	k        int
	fallback bool
}

func (d protoSelectDNAT) modulus() uint32 {
	if d.fallback {
		return 1
	}
	return 1 << d.k
}

func (d protoSelectDNAT) render(f *family, b *strings.Builder) {
	fmt.Fprintf(b, "dnat %s addr . port to %s daddr . meta l4proto . th dport . numgen random mod %d offset %d map @%s",
		f.name, f.name, d.modulus(), d.k*protoSlotStride, d.set)
}

func (d protoSelectDNAT) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs,
		loadAddr(f, daddr, 1, uint32(f.addrLn)),
		loadL4Proto(f.regProtoAfterAddr),
		loadDport(f.regPortAfterAddr),
		&expr.Numgen{Register: f.regPortAfterAddr + 1, Modulus: d.modulus(), Type: unix.NFT_NG_RANDOM, Offset: uint32(d.k * protoSlotStride)},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: d.set},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.natFamily(),
			RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: f.regMapPort, RegProtoMax: f.regMapPort, Specified: true})
}

// protoStaticOps returns the ops creating the prototype's table: the fixed part of
// today's table without the endpoint maps, plus the shared selection chains.
func protoStaticOps(c *layoutConfig, rounds int) []op {
	f := c.f
	out := []op{{kind: opAddTable, name: kubeProxyTable, comment: tableComment}}
	for _, d := range staticSets(c) {
		if isEndpointMap(d.name) {
			continue
		}
		out = append(out, op{kind: opAddSet, name: d.name, set: &d})
	}
	out = append(out,
		op{kind: opAddSet, name: protoClusterIPs, set: &setDef{name: protoClusterIPs,
			keyType: concatType(f.addrType, typeInetProto, typeInetService), keyLen: uint32(f.addrLn) + 8}},
		op{kind: opAddSet, name: protoEndpointMap, set: &setDef{name: protoEndpointMap, flags: unix.NFT_SET_MAP,
			keyType:  concatType(f.addrType, typeInetProto, typeInetService, typeInteger),
			keyLen:   uint32(f.addrLn) + 12,
			dataType: concatType(f.addrType, typeInetService), dataLen: uint32(f.addrLn) + 4}},
	)
	chains := staticChains(c)
	var round, fallback, sel []rule
	for k := 0; k <= protoMaxK; k++ {
		round = append(round, rule{terms: []term{protoSelectDNAT{set: protoEndpointMap, k: k}}})
		fallback = append(fallback, rule{terms: []term{protoSelectDNAT{set: protoEndpointMap, k: k, fallback: true}}})
	}
	for i := 0; i < rounds; i++ {
		sel = append(sel, rule{terms: []term{jumpTo(protoRound)}})
	}
	sel = append(sel, rule{terms: []term{gotoChain(protoFallback)}})
	chains = append(chains,
		chainDef{name: protoRound, rules: round},
		chainDef{name: protoFallback, rules: fallback},
		chainDef{name: protoSelect, rules: sel})
	for i := range chains {
		if chains[i].name == servicesChain {
			chains[i].rules = append(chains[i].rules, rule{terms: []term{addrProtoPortLookup{set: protoClusterIPs}, gotoChain(protoSelect)}})
		}
	}
	var rules []op
	for _, ch := range chains {
		out = append(out, op{kind: opAddChain, name: ch.name, base: ch.base, comment: ch.comment})
		for _, r := range ch.rules {
			rules = append(rules, op{kind: opAddRule, name: ch.name, rule: compileRule(f, r)})
		}
	}
	return append(out, rules...)
}

// protoK is the tag of a Service with n endpoints: the smallest k with 2^k >= n.
func protoK(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

func protoSlotKey(f *family, svc netip.AddrPort, k, slot int) string {
	b := []byte(keyAddrProtoPort(f, svc.Addr(), unix.IPPROTO_TCP, svc.Port()))
	// numgen leaves a host-order number in its register.
	b = binary.NativeEndian.AppendUint32(b, uint32(k*protoSlotStride+slot))
	return string(b)
}

// protoService is one plain Service of the prototype: its address and endpoints.
type protoService struct {
	addr netip.AddrPort
	eps  []netip.AddrPort
}

// protoSlots returns the select map elements of s (values only when withValues).
func protoSlots(f *family, s protoService, withValues bool) []elemDef {
	k := protoK(len(s.eps))
	out := make([]elemDef, 0, len(s.eps))
	for i, ep := range s.eps {
		e := elemDef{set: protoEndpointMap, key: protoSlotKey(f, s.addr, k, i)}
		if withValues {
			e.value = endpointValue(f, ep)
		}
		out = append(out, e)
	}
	return out
}

// protoSender sends ops in batches of at most 4 MiB.
type protoSender struct {
	tb    testing.TB
	be    *Backend
	f     *family
	enc   *encoder
	msgs  int
	bytes int
}

func (s *protoSender) add(ops ...op) {
	if s.enc == nil {
		s.enc = newEncoder(s.f)
	}
	for i := range ops {
		s.enc.encodeOp(&ops[i], 0)
		if s.enc.size() > defaultBatchLimits.bytes {
			s.flush()
			s.enc = newEncoder(s.f)
		}
	}
}

func (s *protoSender) flush() {
	if s.enc == nil || s.enc.count == 0 {
		return
	}
	s.msgs += s.enc.count
	s.bytes += s.enc.size()
	errs, err := s.be.c.sendBatch(s.enc.b.buf, s.enc.count)
	if err != nil || len(errs) > 0 {
		s.tb.Fatalf("batch: %v %v", err, errs)
	}
	s.enc = nil
}

// send sends ops as one transaction.
func (s *protoSender) send(ops ...op) {
	s.add(ops...)
	s.flush()
}

// kmemBytes is the kernel memory charged to this process's memory cgroup (cgroup v1),
// or -1: nf_tables objects are allocated with GFP_KERNEL_ACCOUNT.
func kmemBytes() int64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] == "memory" {
			v, err := os.ReadFile("/sys/fs/cgroup/memory" + parts[2] + "/memory.kmem.usage_in_bytes")
			if err != nil {
				return -1
			}
			n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// settledKmem waits for the kernel's deferred frees (RCU) before reading kmemBytes.
func settledKmem() int64 {
	runtime.GC()
	time.Sleep(300 * time.Millisecond)
	return kmemBytes()
}

// protoScale returns n plain Services (ClusterIPs as scaleState's) with eps endpoints.
func protoScale(n, eps int) []protoService {
	out := make([]protoService, n)
	for i := range out {
		out[i].addr = netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)), 80)
		for j := 0; j < eps; j++ {
			k := i*eps + j
			out[i].eps = append(out[i].eps, netip.MustParseAddrPort(fmt.Sprintf("10.%d.%d.%d:8080", 100+k/65536, (k/256)%256, k%256)))
		}
	}
	return out
}

// protoServiceOps returns the ops adding the Services.
func protoServiceOps(f *family, svcs []protoService) []op {
	var cips, dispatch, slots []elemDef
	for _, s := range svcs {
		cips = append(cips, elemDef{set: clusterIPsSet, key: keyAddr(f, s.addr.Addr())})
		dispatch = append(dispatch, elemDef{set: protoClusterIPs, key: keyAddrProtoPort(f, s.addr.Addr(), unix.IPPROTO_TCP, s.addr.Port())})
		slots = append(slots, protoSlots(f, s, true)...)
	}
	return []op{
		{kind: opAddElements, name: clusterIPsSet, elems: cips},
		{kind: opAddElements, name: protoClusterIPs, elems: dispatch},
		{kind: opAddElements, name: protoEndpointMap, elems: slots},
	}
}

// protoChange is one kind of single-endpoint change: the transactions that take a
// Service from state a to b and back.
type protoChange struct {
	name string
	a, b []netip.AddrPort
}

func protoEps(n, base int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = netip.MustParseAddrPort(fmt.Sprintf("10.%d.%d.%d:8080", 200+base/65536, (base/256)%256, base%256+i))
	}
	return out
}

func protoChanges() []protoChange {
	tenMinusMiddle := slices.Delete(protoEps(10, 1536), 3, 4)
	return []protoChange{
		{"move-in-10", protoEps(10, 0), append(protoEps(9, 0), netip.MustParseAddrPort("10.251.0.1:8080"))},
		{"add-remove-10-11", protoEps(10, 256), protoEps(11, 256)},
		{"remove-middle-10-9", protoEps(10, 1536), tenMinusMiddle},
		{"move-only-endpoint", protoEps(1, 512), protoEps(1, 768)},
		{"first-last-endpoint-0-1", nil, protoEps(1, 1024)},
		{"one-two-endpoints-1-2", protoEps(1, 1280), protoEps(2, 1280)},
		{"power-of-two-16-17", protoEps(16, 1792), protoEps(17, 1792)},
	}
}

// protoTransition returns the element ops that change a Service's slots from the
// endpoints `from` to `to`, as a planner would: the same k keeps the slots of endpoints
// still there, a removed endpoint's slot takes the last one; a new k re-keys them all.
// With no endpoints the Service's address is in reject-services instead.
func protoTransition(f *family, svc netip.AddrPort, from, to []netip.AddrPort) []op {
	var del, add []elemDef
	kf, kt := protoK(len(from)), protoK(len(to))
	if kf != kt || len(from) == 0 || len(to) == 0 {
		del = protoSlots(f, protoService{svc, from}, false)
		add = protoSlots(f, protoService{svc, to}, true)
	} else {
		del, add = protoSameK(f, svc, kf, from, to)
	}
	var ops []op
	reject := elemDef{set: rejectServicesSet, key: keyAddrProtoPort(f, svc.Addr(), unix.IPPROTO_TCP, svc.Port())}
	if len(from) == 0 && len(to) > 0 {
		ops = append(ops, op{kind: opDeleteElements, name: rejectServicesSet, elems: []elemDef{reject}})
	}
	ops = append(ops, elementOps(opDeleteElements, del)...)
	ops = append(ops, elementOps(opAddElements, add)...)
	if len(from) > 0 && len(to) == 0 {
		ops = append(ops, op{kind: opAddElements, name: rejectServicesSet, elems: []elemDef{reject}})
	}
	return ops
}

// protoSameK returns the element changes between two endpoint lists of the same k:
// each endpoint still there keeps its slot, new ones take the slots of removed ones,
// then the end; a hole left by a removal takes the last slot.
func protoSameK(f *family, svc netip.AddrPort, k int, from, to []netip.AddrPort) (del, add []elemDef) {
	want := map[netip.AddrPort]bool{}
	for _, ep := range to {
		want[ep] = true
	}
	have := map[netip.AddrPort]bool{}
	for _, ep := range from {
		have[ep] = true
	}
	var incoming []netip.AddrPort
	for _, ep := range to {
		if !have[ep] {
			incoming = append(incoming, ep)
		}
	}
	slots := slices.Clone(from)
	dirty := map[int]bool{}
	for i := range slots {
		if want[slots[i]] {
			continue
		}
		slots[i] = netip.AddrPort{}
		if len(incoming) > 0 {
			slots[i], incoming = incoming[0], incoming[1:]
			dirty[i] = true
		}
	}
	for _, ep := range incoming {
		slots = append(slots, ep)
		dirty[len(slots)-1] = true
	}
	for i := 0; i < len(slots); {
		if slots[i].IsValid() {
			i++
			continue
		}
		last := len(slots) - 1
		if last != i {
			slots[i], dirty[i] = slots[last], true
		} else {
			delete(dirty, i)
		}
		delete(dirty, last)
		slots = slots[:last]
	}
	for i := len(slots); i < len(from); i++ {
		del = append(del, elemDef{set: protoEndpointMap, key: protoSlotKey(f, svc, k, i)})
	}
	for i := range slots {
		if !dirty[i] {
			continue
		}
		if i < len(from) {
			del = append(del, elemDef{set: protoEndpointMap, key: protoSlotKey(f, svc, k, i)})
		}
		add = append(add, elemDef{set: protoEndpointMap, key: protoSlotKey(f, svc, k, i), value: endpointValue(f, slots[i])})
	}
	return del, add
}

// protoLoad loads the prototype table of svcs (plus targets) and returns the time and CPU.
func protoLoad(b *testing.B, be *Backend, c *layoutConfig, svcs []protoService, rounds int) (wall, user, sys time.Duration, msgs int) {
	s := &protoSender{tb: b, be: be, f: c.f}
	u0, s0 := cpuTimes()
	start := time.Now()
	s.send(protoStaticOps(c, rounds)...)
	s.add(protoServiceOps(c.f, svcs)...)
	s.flush()
	wall = time.Since(start)
	u1, s1 := cpuTimes()
	return wall, u1 - u0, s1 - s0, s.msgs
}

// BenchmarkSharedLayout measures, for N plain Services x 10 endpoints (SLUICE_BENCH_SIZES,
// default 100, 1 000, 10 000, 50 000), today's table (the backend) and the prototype's in
// the same run (SLUICE_PROTO_LAYOUTS to measure one): the cold load (wall, CPU, kernel memory), every kind of single-endpoint
// change (one transaction each; today's through the backend's partial sync, whose user
// time includes its planning; the prototype's raw), and the time to connect through the
// table from a client namespace (SLUICE_PROTO_CONNECTS connections, default 2 000).
func BenchmarkSharedLayout(b *testing.B) {
	rounds := protoRounds()
	connects := 2000
	if v, err := strconv.Atoi(os.Getenv("SLUICE_PROTO_CONNECTS")); err == nil {
		connects = v
	}
	f := ipv4
	cfg := testConfig(model.IPv4)
	var tp *topology
	if connects > 0 {
		tp = newTopology(b, model.IPv4)
		tp.addPod("pod-a", "10.180.0.1")
	}
	for _, n := range commitCostSizes(100, 1000, 10000, 50000) {
		for _, layout := range protoLayouts() {
			resetTable(b)
			be := newTestBackend(b, cfg, fixedAddrs(testNodeIP))
			be.recordPlan = false
			lc := be.layout(scaleState(model.IPv4, 1, 1))
			changes := protoChanges()
			targets := make([]netip.AddrPort, len(changes))
			for i := range changes {
				targets[i] = netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", i+1)), 80)
			}
			firstPacket := netip.MustParseAddrPort("172.31.1.1:80")
			// The connect target: 10 endpoints (k = 4: some misses), on two pod ports.
			var fpEps []netip.AddrPort
			for i := 0; i < 10; i++ {
				fpEps = append(fpEps, netip.AddrPortFrom(netip.MustParseAddr("10.180.0.1"), uint16([]int{80, 8080}[i%2])))
			}

			runtime.GC()
			k0 := settledKmem()
			var wall, user, sys time.Duration
			var msgs int
			var ns *model.NodeState
			if layout == "today" {
				ns = scaleState(model.IPv4, n, 10)
				for i, c := range changes {
					ns.SetService(protoTargetName(c.name).NamespacedName, []*model.ServicePort{protoTargetPort(c.name, targets[i], c.a)}, nil)
				}
				ns.SetService(protoTargetName("first-packet").NamespacedName, []*model.ServicePort{protoTargetPort("first-packet", firstPacket, fpEps)}, nil)
				ns.ServiceCIDRs = append(ns.ServiceCIDRs, netip.MustParsePrefix("172.31.0.0/16"))
				runtime.GC()
				u0, s0 := cpuTimes()
				start := time.Now()
				mustApply(b, be, ns, model.Changes{Full: true})
				wall = time.Since(start)
				u1, s1 := cpuTimes()
				user, sys, msgs = u1-u0, s1-s0, be.LastStats().Messages
			} else {
				svcs := protoScale(n, 10)
				for i, c := range changes {
					svcs = append(svcs, protoService{targets[i], c.a})
				}
				svcs = append(svcs, protoService{firstPacket, fpEps})
				wall, user, sys, msgs = protoLoad(b, be, lc, svcs, rounds)
				// The Services without endpoints are rejected.
				s := &protoSender{tb: b, be: be, f: f}
				for i, c := range changes {
					if len(c.a) == 0 {
						s.send(op{kind: opAddElements, name: rejectServicesSet, elems: []elemDef{{set: rejectServicesSet,
							key: keyAddrProtoPort(f, targets[i].Addr(), unix.IPPROTO_TCP, 80)}}})
					}
				}
			}
			k1 := settledKmem()
			b.Run(fmt.Sprintf("services=%d/layout=%s/cold-load", n, layout), func(b *testing.B) {
				for b.Loop() {
				}
				b.ReportMetric(wall.Seconds()*1000, "wall-ms")
				b.ReportMetric(float64(user.Milliseconds()), "user-ms")
				b.ReportMetric(float64(sys.Milliseconds()), "sys-ms")
				b.ReportMetric(float64(msgs), "msgs")
				if k0 >= 0 && k1 >= 0 {
					b.ReportMetric(float64(k1-k0)/(1<<20), "kmem-MiB")
				}
			})

			for i, c := range changes {
				b.Run(fmt.Sprintf("services=%d/layout=%s/%s", n, layout, c.name), func(b *testing.B) {
					s := &protoSender{tb: b, be: be, f: f}
					forward := protoTransition(f, targets[i], c.a, c.b)
					backward := protoTransition(f, targets[i], c.b, c.a)
					k := 0
					var opsPerChange int
					u0, s0 := cpuTimes()
					for b.Loop() {
						k++
						if layout == "today" {
							list := c.a
							if k%2 == 1 {
								list = c.b
							}
							ns.SetService(protoTargetName(c.name).NamespacedName, []*model.ServicePort{protoTargetPort(c.name, targets[i], list)}, nil)
							mustApply(b, be, ns, changed(protoTargetName(c.name).NamespacedName.String()))
							opsPerChange = be.LastStats().Operations
							continue
						}
						ops := backward
						if k%2 == 1 {
							ops = forward
						}
						s.send(ops...)
						opsPerChange = 0
						for _, o := range ops {
							opsPerChange += len(o.elems)
						}
					}
					if layout == "shared" && k%2 == 1 {
						s.send(backward...)
					}
					u1, s1 := cpuTimes()
					b.ReportMetric(float64((u1-u0).Microseconds())/float64(b.N), "user-µs/op")
					b.ReportMetric(float64((s1-s0).Microseconds())/float64(b.N), "sys-µs/op")
					b.ReportMetric(float64((u1-u0+s1-s0).Microseconds())/float64(b.N), "cpu-µs/op")
					b.ReportMetric(float64(opsPerChange), "elements/op")
				})
			}
			if connects > 0 {
				protoFirstPacket(b, tp, fmt.Sprintf("services=%d/layout=%s/first-packet", n, layout), firstPacket, connects)
			}
			_ = be.Close()
		}
	}
	resetTable(b)
}

func protoTargetName(c string) model.ServicePortName {
	return model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "target", Name: c}, Port: "http", Protocol: model.TCP}
}

func protoTargetPort(c string, addr netip.AddrPort, eps []netip.AddrPort) *model.ServicePort {
	var list []string
	for _, ep := range eps {
		list = append(list, ep.String())
	}
	return svc("target", c, "http", model.TCP, addr.Addr().String(), int32(addr.Port())).Endpoints(list...).Build()
}

// protoFirstPacket connects to dst from a client namespace, one connection after the
// other, and reports the p50 and p99 of the time to connect.
func protoFirstPacket(b *testing.B, tp *topology, name string, dst netip.AddrPort, connects int) {
	var samples []time.Duration
	u0, s0 := cpuTimes()
	err := netnstest.Do(tp.client, func() error {
		d := net.Dialer{Timeout: quick}
		for i := 0; i < connects; i++ {
			start := time.Now()
			c, err := d.Dial("tcp", dst.String())
			if err != nil {
				return err
			}
			samples = append(samples, time.Since(start))
			_ = c.Close()
		}
		return nil
	})
	u1, s1 := cpuTimes()
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(samples)
	b.Run(name, func(b *testing.B) {
		for b.Loop() {
		}
		b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64((u1-u0+s1-s0).Microseconds())/float64(len(samples)), "cpu-µs/connect")
	})
}

// TestSharedLayoutPrototypeForwards sends real connections through the prototype's
// tables, the IPv4 and the IPv6 one loaded side by side (dual-stack), through a series
// of single-endpoint changes each made of map elements only: 3 endpoints (k = 2, a
// quarter of the slots empty), one more, one less in the middle, down a power of two
// (every slot re-keyed), one, none (rejected), one again. After each, exactly the
// Service's endpoints answer (60 connections: the chance that one of 4 endpoints never
// answers is below 1e-6), and a neighbour Service keeps answering from its own.
func TestSharedLayoutPrototypeForwards(t *testing.T) {
	resetTable(t)
	t.Cleanup(func() { resetTable(t) })
	tp := newTopology(t, model.IPv4)
	type stack struct {
		f                 *family
		svc, neighbour    netip.AddrPort
		a, b, c, d, spare netip.AddrPort
		names             map[netip.AddrPort]string
		sender            *protoSender
	}
	var stacks []*stack
	for _, fam := range []struct {
		f              model.IPFamily
		podIP          func(i int) string
		svc, neighbour string
	}{
		{model.IPv4, func(i int) string { return fmt.Sprintf("10.180.0.%d", i) }, "172.30.0.10", "172.30.0.11"},
		{model.IPv6, func(i int) string { return fmt.Sprintf("fd00:10:180::%d", i) }, "fd00:172:30::10", "fd00:172:30::11"},
	} {
		s := &stack{f: familyOf(fam.f), names: map[netip.AddrPort]string{},
			svc: ap(fam.svc, 80), neighbour: ap(fam.neighbour, 80)}
		eps := []*netip.AddrPort{&s.a, &s.b, &s.c, &s.d, &s.spare}
		for i, ep := range eps {
			name := fmt.Sprintf("%s-%c", fam.f, 'a'+i)
			p := tp.addPod(name, fam.podIP(i+1))
			*ep = netip.AddrPortFrom(p.ip, 80)
			s.names[*ep] = name
		}
		be := newTestBackend(t, testConfig(fam.f), WithLocalAddresses(hostnet.InterfaceAddrs))
		s.sender = &protoSender{tb: t, be: be, f: s.f}
		s.sender.send(protoStaticOps(be.layout(nodeState(fam.f)), protoRounds())...)
		s.sender.send(protoServiceOps(s.f, []protoService{{s.svc, []netip.AddrPort{s.a, s.b, s.c}}, {s.neighbour, []netip.AddrPort{s.spare}}})...)
		stacks = append(stacks, s)
	}

	// answering connects 60 times to dst and returns the pods that answered.
	answering := func(dst netip.AddrPort) (map[string]bool, error) {
		got := map[string]bool{}
		for i := 0; i < 60; i++ {
			r, err := tp.tcp(tp.client, netip.Addr{}, dst, quick)
			if err != nil {
				return got, err
			}
			got[r.pod] = true
		}
		return got, nil
	}
	check := func(step string, s *stack, dst netip.AddrPort, want []netip.AddrPort) {
		t.Helper()
		got, err := answering(dst)
		if len(want) == 0 {
			if !errors.Is(err, errRejected) {
				t.Fatalf("%s: %v %v: %v (answered by %v), want rejected", step, s.f.model, dst, err, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: %v %v: %v (answered by %v)", step, s.f.model, dst, err, got)
		}
		wantNames := map[string]bool{}
		for _, ep := range want {
			wantNames[s.names[ep]] = true
		}
		if !maps.Equal(got, wantNames) {
			t.Fatalf("%s: %v %v answered by %v, want %v", step, s.f.model, dst, got, wantNames)
		}
	}

	for _, s := range stacks {
		steps := []struct {
			name string
			eps  []netip.AddrPort
		}{
			{"three endpoints", []netip.AddrPort{s.a, s.b, s.c}},
			{"one more", []netip.AddrPort{s.a, s.b, s.c, s.d}},
			{"one less in the middle", []netip.AddrPort{s.a, s.c, s.d}},
			{"down a power of two", []netip.AddrPort{s.c, s.d}},
			{"one", []netip.AddrPort{s.d}},
			{"none", nil},
			{"one again", []netip.AddrPort{s.b}},
		}
		for i, step := range steps {
			if i > 0 {
				s.sender.send(protoTransition(s.f, s.svc, steps[i-1].eps, step.eps)...)
			}
			check(step.name, s, s.svc, step.eps)
		}
		check("neighbour", s, s.neighbour, []netip.AddrPort{s.spare})
	}
}
