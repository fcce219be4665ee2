package iptables

// Test conventions (as upstream's proxier tests). The address plan and the builders of
// Services, EndpointSlices and changes are the shared fixture's
// (pkg/dataplane/internal/fixture): node "node-a" with 192.168.0.2 and 2001:db8::1 (and
// 127.0.0.1, ::1 local), cluster CIDR 10.0.0.0/8 and fd00:10::/64, this node's pods
// 10.180.1.x, others' 10.180.2.x (on "node-b"), ClusterIPs 172.30.0.0/16 and
// fd00:172:30::/112, externalIPs 192.168.99.0/24, LoadBalancer IPs 5.6.7.0/24. The tests
// build API objects (fixture.APIService) and compute the node's state with model.Compute,
// as the daemon does. Masquerade bit 14 (mark 0x004000).

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

const testNodeName = fixture.NodeName

var (
	testNodeIPv4 = fixture.NodeIPv4
	testNodeIPv6 = fixture.NodeIPv6
	testNode     = model.NodeInfo{Name: testNodeName, IPs: []netip.Addr{testNodeIPv4, testNodeIPv6},
		PodCIDRs: []netip.Prefix{fixture.LocalPodsv4, fixture.ClusterCIDRv6}}
	testLocalAddrs = []netip.Addr{testNodeIPv4, testNodeIPv6, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
)

func testConfig(family model.IPFamily) dataplane.Config {
	cidr := fixture.ClusterCIDR(family)
	return dataplane.Config{
		Family:             family,
		NodeName:           testNodeName,
		MasqueradeBit:      14,
		LocalhostNodePorts: true,
		NodePortAddresses:  dataplane.NodePortAddresses{MatchAll: true},
		LocalDetector:      dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{cidr}},
		SyncPeriod:         30 * time.Second,
	}
}

// testClock is a settable clock.
type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

// newTestBackend returns a backend on a fake kernel.
func newTestBackend(t testing.TB, cfg dataplane.Config, flavour Flavour, opts ...Option) (*Backend, *fakeKernel, *testClock) {
	t.Helper()
	k := newFakeKernel(flavour)
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	base := []Option{
		withCommander(k), WithFlavour(flavour), withEditor(k), WithSysctls(fakeSysctl{}), withNFAcct(noNFAcct{}),
		withProbe(fakeProbe{}), withSaveListing(), WithoutLeftoverCleanup(), WithClock(clock.now),
		WithLocalAddresses(func() ([]netip.Addr, error) { return testLocalAddrs, nil }),
	}
	b, err := New(context.Background(), cfg, append(base, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b, k, clock
}

// world is the cluster's objects; state computes one family's NodeState from them.
type world struct {
	services []*v1.Service
	slices   []*discoveryv1.EndpointSlice
}

func (w *world) add(s *v1.Service, sl *discoveryv1.EndpointSlice) {
	w.services = append(w.services, s)
	if sl != nil {
		w.slices = append(w.slices, sl)
	}
}

// set replaces a Service and its slice.
func (w *world) set(s *v1.Service, sl *discoveryv1.EndpointSlice) {
	w.remove(s.Namespace, s.Name)
	w.add(s, sl)
}

func (w *world) remove(ns, name string) {
	w.services = slices.DeleteFunc(w.services, func(s *v1.Service) bool { return s.Namespace == ns && s.Name == name })
	w.slices = slices.DeleteFunc(w.slices, func(s *discoveryv1.EndpointSlice) bool {
		return s.Namespace == ns && s.Labels[discoveryv1.LabelServiceName] == name
	})
}

func (w *world) state(family model.IPFamily) *model.NodeState {
	return model.Compute(w.services, w.slices, testNode, nil, model.Options{Families: []model.IPFamily{family}})[family]
}

func full() model.Changes                   { return fixture.Full() }
func changed(names ...string) model.Changes { return fixture.Changed(names...) }

func mustApply(t testing.TB, b *Backend, st *model.NodeState, ch model.Changes) dataplane.Result {
	t.Helper()
	return fixture.MustApply(t, b, st, ch)
}

// assertConsistent checks invariants of a kernel after any sync: every jump goes to an
// existing chain, every per-Service chain is referenced, and the nodeports jump is the
// last rule of nat KUBE-SERVICES.
func assertConsistent(t testing.TB, k *fakeKernel) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for tname, table := range k.tables {
		referenced := map[string]bool{}
		for cname, ch := range table.chains {
			for _, r := range ch.rules {
				tgt := xtables.TargetOf(r.args)
				if tgt == "" || isStandardTarget(tgt) {
					continue
				}
				if _, ok := table.chains[tgt]; !ok {
					t.Errorf("%s: %s jumps to missing chain %s", tname, cname, tgt)
				}
				referenced[tgt] = true
			}
		}
		for cname := range table.chains {
			if xtables.IsServiceChain(cname) && !referenced[cname] {
				t.Errorf("%s: chain %s is not referenced", tname, cname)
			}
		}
	}
	if ch, ok := k.tables[tableNAT].chains[chainServices]; ok && len(ch.rules) > 0 {
		last := ch.rules[len(ch.rules)-1]
		if xtables.TargetOf(last.args) != chainNodePorts {
			t.Errorf("nat KUBE-SERVICES: last rule is %q, not the jump to KUBE-NODEPORTS", last.spec)
		}
	}
}

// ruleSet returns every chain's rules of both tables, each chain's rules sorted when the
// order does not matter (the top-level chains, written in a different order by partial
// syncs), for comparing kernels.
func ruleSet(k *fakeKernel) map[string][]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string][]string{}
	for tname, table := range k.tables {
		for cname, ch := range table.chains {
			var rules []string
			for _, r := range ch.rules {
				rules = append(rules, strings.Join(r.args, " "))
			}
			if !xtables.IsServiceChain(cname) {
				slices.Sort(rules)
			}
			out[tname+"/"+cname] = rules
		}
	}
	return out
}

type (
	netipAddrT  = netip.Addr
	netipPrefix = netip.Prefix
)

func netipAddr(s string) netip.Addr    { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// scaleState builds n ClusterIP Services (ns<i/100>/svc<i>, port 80/TCP) with eps ready
// endpoints each on other nodes, directly as model values (benchmarks need 10 000 fast).
func scaleState(n, eps int) *model.NodeState {
	st := model.NewNodeState(model.IPv4, testNode)
	for i := 0; i < n; i++ {
		name := types.NamespacedName{Namespace: "ns" + strconv.Itoa(i/100), Name: "svc" + strconv.Itoa(i)}
		sp := &model.ServicePort{
			Name:            model.ServicePortName{NamespacedName: name, Port: "p80", Protocol: model.TCP},
			Type:            model.TypeClusterIP,
			ClusterIP:       netip.AddrFrom4([4]byte{172, byte(16 + i>>16), byte(i >> 8), byte(i)}),
			Port:            80,
			HasAnyEndpoints: eps > 0,
		}
		for e := 0; e < eps; e++ {
			j := i*eps + e
			sp.AllEndpoints = append(sp.AllEndpoints, model.Endpoint{
				IP: netip.AddrFrom4([4]byte{10, byte(j >> 16), byte(j >> 8), byte(j)}), Port: 8080,
				Ready: true, Serving: true, NodeName: fixture.OtherNode,
			})
		}
		sp.ClusterEndpoints = sp.AllEndpoints
		st.SetService(name, []*model.ServicePort{sp}, nil)
	}
	return st
}
