package ipvs

// Test conventions (unit tests, fake kernel). The address plan and the builders of Service
// ports, node states and changes are the shared fixture's (pkg/dataplane/internal/fixture):
// node "node-a" with eth0 192.168.0.2 and 2001:db8::1, cluster CIDR 10.0.0.0/8, this
// node's pods 10.180.1.x ("ip:port@local"), others' 10.180.2.x, ClusterIPs 172.30.x.y,
// externalIPs 192.168.99.x, LoadBalancer IPs 5.6.7.x. Endpoints listen on 8080 (TCP) or
// 5353 (UDP).

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

const nodeName = fixture.NodeName

var (
	nodeIP   = fixture.NodeIPv4
	nodeIPv6 = fixture.NodeIPv6
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
		cfg.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{fixture.ClusterCIDRv4}}
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
	return fixture.MustApply(t, b, state, ch)
}

// stateOf builds an IPv4 NodeState holding the ports, grouped by Service.
func stateOf(ports ...*model.ServicePort) *model.NodeState {
	return stateOfFamily(model.IPv4, ports...)
}

func stateOfFamily(f model.IPFamily, ports ...*model.ServicePort) *model.NodeState {
	return fixture.NodeState(f, fixture.Node(), ports...)
}
