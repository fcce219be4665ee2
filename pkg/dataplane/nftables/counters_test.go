package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// withCounters returns ns with the given Services' ports Counted (every Service when
// none is named).
func withCounters(ns *model.NodeState, only ...string) *model.NodeState {
	return countertest.Counted(ns, only...)
}

// TestCountersOnlyChangeTheCountedServicesChains: turning counters on for one Service
// (another one counted already) rewrites its path chains, adds the counter first, adds
// its packet counter chains and elements, and touches nothing else; a converged counted
// table plans nothing (the counter's values are not configuration).
func TestCountersOnlyChangeTheCountedServicesChains(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	k.apply(withCounters(examples(model.IPv4), "ns1/svc1"), model.Changes{Full: true})
	on := withCounters(examples(model.IPv4), "ns1/svc1", "ns2/svc2")
	p := k.apply(on, changed("ns2/svc2"))
	got := p.String()
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		if !strings.Contains(line, "ns2/svc2") {
			t.Errorf("counting ns2/svc2 changed something else: %s", line)
		}
	}
	sp := on.PortsOf(types.NamespacedName{Namespace: "ns2", Name: "svc2"})[0]
	names := chainNamesFor(sp.Name)
	internal, external := packetChains(sp)
	for _, chain := range []string{names.cluster, names.local, names.external, internal.Chain, external.Chain} {
		if !strings.Contains(got, "add rule ip kube-proxy "+chain+" counter\n") {
			t.Errorf("no counter rule in %s:\n%s", chain, got)
		}
	}
	if p := k.plan(on, model.Changes{Full: true}); !p.Empty() {
		t.Errorf("full plan over a converged counted table:\n%s", p)
	}
}

// TestPacketCountersComeAndGoWithTheFirstAndLastCountedService: the packet counters'
// fixed part (two maps, a rule pair in each pre-DNAT chain) exists only while a Service
// is counted; once none is, the table is again what it is without the feature.
func TestPacketCountersComeAndGoWithTheFirstAndLastCountedService(t *testing.T) {
	plain := examples(model.IPv4)
	k := newFakeKernel(testConfig(model.IPv4))
	k.apply(plain, model.Changes{Full: true})
	on := withCounters(plain, "ns2/svc2")
	got := k.apply(on, changed("ns2/svc2")).String()
	for _, want := range []string{
		"add map ip kube-proxy " + packetCountersMap + " ",
		"add map ip kube-proxy " + packetCountersNodePortMap + " ",
		"add rule ip kube-proxy filter-prerouting-pre-dnat ip daddr . meta l4proto . th dport vmap @" + packetCountersMap + "\n",
		"add rule ip kube-proxy filter-output-pre-dnat ip daddr @nodeport-ips meta l4proto . th dport vmap @" + packetCountersNodePortMap + "\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the first counted Service did not add %q:\n%s", want, got)
		}
	}
	off := k.apply(withCounters(plain, "none"), changed("ns2/svc2")).String()
	for _, gone := range []string{"delete set ip kube-proxy " + packetCountersMap + "\n", "delete set ip kube-proxy " + packetCountersNodePortMap + "\n"} {
		if !strings.Contains(off, gone) {
			t.Errorf("the last counted Service gone, no %q:\n%s", gone, off)
		}
	}
	fresh := newFakeKernel(testConfig(model.IPv4))
	fresh.apply(plain, model.Changes{Full: true})
	if got, want := sortedKeys(k.state.sets), sortedKeys(fresh.state.sets); !slices.Equal(got, want) {
		t.Errorf("sets after counting stopped differ from a table that never counted:\n%s", cmp.Diff(want, got))
	}
	if len(k.state.chains) != len(fresh.state.chains) {
		t.Errorf("%d chains after counting stopped, %d in a table that never counted", len(k.state.chains), len(fresh.state.chains))
	}
	for name, c := range fresh.state.chains {
		if got := k.state.chains[name]; got == nil || got.fp != c.fp {
			t.Errorf("chain %s after counting stopped is not the one of a table that never counted", name)
		}
	}
}

// TestCountedEndpointChangeKeepsTheChain: an endpoint change of a counted Service is
// element operations only; the chain holding the counter is not rewritten, so the
// kernel keeps its counts.
func TestCountedEndpointChangeKeepsTheChain(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	ns := withCounters(examples(model.IPv4))
	k.apply(ns, model.Changes{Full: true})
	name := types.NamespacedName{Namespace: "ns4", Name: "svc4"}
	sp := *ns.PortsOf(name)[0]
	sp.ClusterEndpoints = append(sp.ClusterEndpoints[:len(sp.ClusterEndpoints):len(sp.ClusterEndpoints)],
		model.Endpoint{IP: netip.MustParseAddr("10.180.0.9"), Port: 80, Ready: true, Serving: true})
	sp.AllEndpoints = sp.ClusterEndpoints
	ns.SetService(name, []*model.ServicePort{&sp}, nil)
	p := k.apply(ns, changed("ns4/svc4"))
	if p.Empty() {
		t.Fatal("the endpoint change planned nothing")
	}
	for _, g := range p.groups {
		for _, o := range g.ops {
			if o.kind == opAddRule || o.kind == opFlushChain || o.kind == opDeleteChain || o.kind == opAddChain {
				t.Errorf("endpoint change of a counted Service touches a chain: %s", p)
			}
		}
	}
}

func TestCountedChainsArePathChains(t *testing.T) {
	ns := examples(model.IPv4)
	sp := ns.PortsOf(types.NamespacedName{Namespace: "ns2", Name: "svc2"})[0] // NodePort, eTP Local
	names := chainNamesFor(sp.Name)
	got := countedChains(sp)
	internal, external := packetChains(sp)
	want := []dataplane.ChainPath{{Chain: names.cluster, Path: dataplane.PathCluster}, {Chain: names.local, Path: dataplane.PathLocal},
		{Chain: "count-cluster-" + servicePortNameBase(sp.Name), Path: dataplane.PathCluster, EveryPacket: true},
		{Chain: names.external, Path: dataplane.PathExternal},
		{Chain: "count-external-" + servicePortNameBase(sp.Name), Path: dataplane.PathExternal, EveryPacket: true}}
	if internal != want[2] || external != want[4] {
		t.Errorf("packetChains = %v, %v", internal, external)
	}
	if len(got) != len(want) {
		t.Fatalf("countedChains = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("countedChains[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	sp1 := ns.PortsOf(types.NamespacedName{Namespace: "ns1", Name: "svc1"})[0] // ClusterIP only
	if got := countedChains(sp1); len(got) != 2 || got[0].Path != dataplane.PathCluster || got[1].Path != dataplane.PathCluster || !got[1].EveryPacket {
		t.Errorf("ClusterIP Service: countedChains = %v", got)
	}
}
