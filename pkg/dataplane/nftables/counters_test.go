package nftables

import (
	"net/netip"
	"strings"
	"testing"

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
// rewrites its path chains, adds the counter first, and touches nothing else; a
// converged counted table plans nothing (the counter's values are not configuration).
func TestCountersOnlyChangeTheCountedServicesChains(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	k.apply(examples(model.IPv4), model.Changes{Full: true})
	on := withCounters(examples(model.IPv4), "ns2/svc2")
	p := k.apply(on, changed("ns2/svc2"))
	got := p.String()
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		if !strings.Contains(line, "ns2/svc2") {
			t.Errorf("counting ns2/svc2 changed something else: %s", line)
		}
	}
	names := chainNamesFor(on.PortsOf(types.NamespacedName{Namespace: "ns2", Name: "svc2"})[0].Name)
	for _, chain := range []string{names.cluster, names.local, names.external} {
		if !strings.Contains(got, "add rule ip kube-proxy "+chain+" counter\n") {
			t.Errorf("no counter rule in %s:\n%s", chain, got)
		}
	}
	if p := k.plan(on, model.Changes{Full: true}); !p.Empty() {
		t.Errorf("full plan over a converged counted table:\n%s", p)
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
	want := []dataplane.ChainPath{{Chain: names.cluster, Path: dataplane.PathCluster}, {Chain: names.local, Path: dataplane.PathLocal}, {Chain: names.external, Path: dataplane.PathExternal}}
	if len(got) != len(want) {
		t.Fatalf("countedChains = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("countedChains[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	sp1 := ns.PortsOf(types.NamespacedName{Namespace: "ns1", Name: "svc1"})[0] // ClusterIP only
	if got := countedChains(sp1); len(got) != 1 || got[0].Path != dataplane.PathCluster {
		t.Errorf("ClusterIP Service: countedChains = %v", got)
	}
}
