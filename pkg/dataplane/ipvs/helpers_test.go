package ipvs

// Test conventions (unit tests, fake kernel). The builders of names, changes and node
// states are the shared fixture's (pkg/dataplane/internal/fixture); the addresses are this
// package's own, as its golden files were written with them:
//
//	node        "node-a", eth0 192.168.0.2 (primary node IP) and 2001:db8::1
//	pods        10.0.0.0/8 (cluster CIDR); this node's pods are 10.244.1.x, others' 10.244.2.x
//	ClusterIPs  172.30.0.0/16
//	externalIPs 192.168.99.0/24, LoadBalancer IPs 5.6.7.0/24
//	endpoints   listen on 8080 (TCP) or 5353 (UDP)

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

const nodeName = "node-a"

var (
	nodeIP    = netip.MustParseAddr("192.168.0.2")
	nodeIPv6  = netip.MustParseAddr("2001:db8::1")
	podCIDR   = netip.MustParsePrefix("10.0.0.0/8")
	nodeInfo4 = model.NodeInfo{Name: nodeName, IPs: []netip.Addr{nodeIP, nodeIPv6}}
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time         { return c.t }
func (c *fakeClock) step(d time.Duration)   { c.t = c.t.Add(d) }
func newClock() *fakeClock                  { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func addr(s string) netip.Addr              { return netip.MustParseAddr(s) }
func addrPort(s string) netip.AddrPort      { return netip.MustParseAddrPort(s) }
func nn(s string) types.NamespacedName      { return fixture.Name(s) }
func changed(names ...string) model.Changes { return fixture.Changed(names...) }

// withFake makes New use the fake kernel: Linux 6.1 with IPVS, the nft flavour of iptables.
func withFake(k *fakeKernel) Option {
	return func(o *options) {
		o.supported = func() (bool, error) { return true, nil }
		o.kernel = func() (hostnet.KernelVersion, error) { return hostnet.KernelVersion{Major: 6, Minor: 1, Patch: 0}, nil }
		o.ipvs, o.links, o.sets, o.ipt, o.sysctl = fakeIPVS{k}, fakeLinks{k}, fakeIPSets{k}, fakeIPTables{k: k}, fakeSysctl{k}
		o.flavour = FlavourNFT
		o.skipLeftovers = true
	}
}

func testConfig(family model.IPFamily) dataplane.Config {
	cfg := dataplane.Config{
		Family: family, NodeName: nodeName, MasqueradeBit: 14,
		NodePortAddresses: dataplane.NodePortAddresses{MatchAll: true},
		SyncPeriod:        30 * time.Second,
	}
	if family == model.IPv4 {
		cfg.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{podCIDR}}
	}
	return cfg
}

// newFakeNode returns a fake kernel with the node's interfaces.
func newFakeNode() *fakeKernel {
	k := newFakeKernel()
	k.links["eth0"] = []netip.Addr{nodeIP, nodeIPv6, addr("fe80::1")}
	return k
}

// newTestBackend builds a backend for IPv4 on k with a fake clock.
func newTestBackend(t *testing.T, k *fakeKernel, settings Settings, opts ...Option) (*Backend, *fakeClock) {
	t.Helper()
	clock := newClock()
	b, err := New(context.Background(), testConfig(model.IPv4), settings, append([]Option{withFake(k), WithClock(clock.now)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b, clock
}

// mustApply applies and fails the test on any failure.
func mustApply(t *testing.T, b *Backend, state *model.NodeState, ch model.Changes) dataplane.Result {
	t.Helper()
	res := b.Apply(context.Background(), state, ch)
	if res.Err != nil {
		t.Fatalf("Apply: %v", res.Err)
	}
	if len(res.Failed) > 0 {
		t.Fatalf("Apply: failed Services: %v", res.Failed)
	}
	return res
}

// --- building desired state ---------------------------------------------------------------

type portOpt func(*model.ServicePort)

// svcPort builds one TCP port of a ClusterIP Service: name "ns/name", clusterIP:port.
func svcPort(name, clusterIP string, port int32, opts ...portOpt) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{NamespacedName: nn(name), Protocol: model.TCP},
		Type:      model.TypeClusterIP,
		ClusterIP: addr(clusterIP),
		Port:      port,
	}
	for _, o := range opts {
		o(sp)
	}
	sp.HasAnyEndpoints = len(sp.ClusterEndpoints) > 0 || len(sp.LocalEndpoints) > 0 || sp.HasAnyEndpoints
	return sp
}

func udp(sp *model.ServicePort)  { sp.Name.Protocol = model.UDP }
func sctp(sp *model.ServicePort) { sp.Name.Protocol = model.SCTP }

func portName(n string) portOpt { return func(sp *model.ServicePort) { sp.Name.Port = n } }

func nodePort(p int32) portOpt {
	return func(sp *model.ServicePort) { sp.NodePort, sp.Type = p, model.TypeNodePort }
}

func externalIPs(ips ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, ip := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, addr(ip))
		}
	}
}

func lbIPs(ips ...string) portOpt {
	return func(sp *model.ServicePort) {
		sp.Type = model.TypeLoadBalancer
		for _, ip := range ips {
			sp.LoadBalancerVIPs = append(sp.LoadBalancerVIPs, addr(ip))
		}
	}
}

func sourceRanges(cidrs ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, c := range cidrs {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(c))
		}
	}
}

func affinity(seconds int32) portOpt {
	return func(sp *model.ServicePort) { sp.AffinityTimeoutSeconds = seconds }
}

func scheduler(s string) portOpt { return func(sp *model.ServicePort) { sp.Scheduler = s } }

func healthCheck(p int32) portOpt { return func(sp *model.ServicePort) { sp.HealthCheckNodePort = p } }

func externalLocal(sp *model.ServicePort) { sp.ExternalPolicyLocal = true }
func internalLocal(sp *model.ServicePort) { sp.InternalPolicyLocal = true }

// endpoints adds ready endpoints ("ip:port"); those in 10.180.1.0/24 are this node's. They
// become the Cluster endpoints, and the local ones the Local endpoints.
func endpoints(eps ...string) portOpt {
	return func(sp *model.ServicePort) {
		for _, s := range eps {
			ap := addrPort(s)
			ep := model.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true,
				IsLocal: netip.MustParsePrefix("10.180.1.0/24").Contains(ap.Addr())}
			if ep.IsLocal {
				ep.NodeName = nodeName
				sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
			}
			sp.AllEndpoints = append(sp.AllEndpoints, ep)
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
		}
	}
}

// stateOf builds an IPv4 NodeState holding the ports, grouped by Service.
func stateOf(ports ...*model.ServicePort) *model.NodeState {
	return stateOfFamily(model.IPv4, ports...)
}

func stateOfFamily(f model.IPFamily, ports ...*model.ServicePort) *model.NodeState {
	return fixture.NodeState(f, nodeInfo4, ports...)
}
