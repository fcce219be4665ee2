package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// fromScratch returns the rules a full sync of st writes on an empty kernel.
func fromScratch(t *testing.T, cfg dataplane.Config, flavour Flavour, st *model.NodeState) map[string][]string {
	t.Helper()
	b, k, _ := newTestBackend(t, cfg, flavour)
	mustApply(t, b, st, full())
	return ruleSet(k)
}

func diffRuleSets(want, got map[string][]string) string {
	var out []string
	keys := slices.Sorted(maps.Keys(want))
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		w, g := want[k], got[k]
		if !slices.Equal(w, g) {
			out = append(out, fmt.Sprintf("%s:\n  want %q\n  got  %q", k, w, g))
		}
	}
	return strings.Join(out, "\n")
}

// TestPartialSyncsConvergeToFullSync walks a Service through every kind of change with
// partial syncs and checks after each step that the kernel holds exactly what a full sync
// from scratch would have written.
func TestPartialSyncsConvergeToFullSync(t *testing.T) {
	for _, flavour := range []Flavour{FlavourLegacy, FlavourNFT} {
		t.Run(string(flavour), func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			b, k, w := featureBackend(t, flavour)

			steps := []struct {
				name    string
				change  func()
				changed []string
			}{
				{"endpoint replaced", func() {
					w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.1.1:80@local", "10.180.2.99:80").Build())
				}, []string{"ns1/svc1"}},
				{"scaled to zero", func() { w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Build()) }, []string{"ns1/svc1"}},
				{"scaled up from zero", func() {
					w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.2.1:80").Build())
				}, []string{"ns1/svc1"}},
				{"became a LoadBalancer with source ranges and Local policy", func() {
					w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).NodePort(3099).LoadBalancer("5.6.7.99").ExternalLocal().HealthCheckNodePort(30099).SourceRanges("10.9.0.0/16").Endpoints("10.180.1.1:80@local", "10.180.2.1:80").Build())
				}, []string{"ns1/svc1"}},
				{"local endpoint went away", func() {
					w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).NodePort(3099).LoadBalancer("5.6.7.99").ExternalLocal().HealthCheckNodePort(30099).SourceRanges("10.9.0.0/16").Endpoints("10.180.2.1:80").Build())
				}, []string{"ns1/svc1"}},
				{"affinity added", func() {
					w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Affinity(60).Endpoints("10.180.2.1:80").Build())
				}, []string{"ns1/svc1"}},
				{"two Services at once, one deleted", func() {
					w.remove("ns3", "svc3")
					w.set(fixture.APIService("ns2/svc2", "p80", model.TCP, "172.30.0.42", 80).NodePort(3002).Endpoints("10.180.1.2:80@local").Build())
				}, []string{"ns3/svc3", "ns2/svc2"}},
				{"new Service", func() {
					w.add(fixture.APIService("ns20/new", "p80", model.TCP, "172.30.0.120", 80).ExternalIPs("192.168.99.20").Endpoints("10.180.2.120:80").Build())
				}, []string{"ns20/new"}},
				{"no-op change", func() {}, []string{"ns20/new"}},
			}
			for _, step := range steps {
				step.change()
				st := w.state(model.IPv4)
				res := mustApply(t, b, st, changed(step.changed...))
				if res.Full {
					t.Fatalf("%s: sync was full (%s), want partial", step.name, b.LastStats().Reason)
				}
				assertConsistent(t, k)
				if d := diffRuleSets(fromScratch(t, cfg, flavour, st), ruleSet(k)); d != "" {
					t.Fatalf("%s: kernel differs from a full sync:\n%s", step.name, d)
				}
			}
		})
	}
}

// TestOneEndpointChangeWritesTheSameLinesAtAnyScale is the partial-sync proof: moving one
// endpoint of one Service writes the same small restore input with 100 and with 10 000
// Services.
func TestOneEndpointChangeWritesTheSameLinesAtAnyScale(t *testing.T) {
	lines := map[int]int{}
	for _, n := range []int{100, 10000} {
		st := scaleState(n, 3)
		b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
		mustApply(t, b, st, full())

		name := types.NamespacedName{Namespace: "ns0", Name: "svc0"}
		st2 := st.Clone()
		ports := st.PortsOf(name)
		sp := *ports[0]
		sp.AllEndpoints = slices.Clone(sp.AllEndpoints)
		sp.AllEndpoints[0].IP = netipAddr("10.255.255.1")
		sp.ClusterEndpoints = slices.Clone(sp.AllEndpoints)
		st2.SetService(name, []*model.ServicePort{&sp}, nil)

		before := len(k.restores)
		mustApply(t, b, st2, changed("ns0/svc0"))
		if got := len(k.restores) - before; got != 1 {
			t.Fatalf("%d Services: %d restores, want 1", n, got)
		}
		in := k.restores[len(k.restores)-1]
		lines[n] = strings.Count(in, "\n")
		if n == 100 {
			t.Logf("restore input for one endpoint change:\n%s", in)
		}
		assertConsistent(t, k)
	}
	if lines[100] != lines[10000] {
		t.Errorf("one endpoint change wrote %d lines with 100 Services and %d with 10 000", lines[100], lines[10000])
	}
	if lines[100] > 25 {
		t.Errorf("one endpoint change wrote %d lines, want at most 25", lines[100])
	}
}

// TestFailingServiceIsLeftOutAndOthersProgrammed injects a rule the kernel refuses for one
// Service, in both flavours' words (nft names the line, legacy only the COMMIT), during a
// full and a partial sync.
func TestFailingServiceIsLeftOutAndOthersProgrammed(t *testing.T) {
	bad := types.NamespacedName{Namespace: "ns3", Name: "svc3"}
	for _, flavour := range []Flavour{FlavourLegacy, FlavourNFT} {
		t.Run(string(flavour), func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			w := featureWorld()
			b, k, _ := newTestBackend(t, cfg, flavour)
			reject := func(table, chain string, r *fakeRule) bool {
				return strings.Contains(r.spec, "10.180.2.3:80") || strings.Contains(r.spec, "10.180.2.33:80")
			}
			k.rejectAtCommit = reject

			// Full sync: svc3 fails, everything else is there.
			res := b.Apply(context.Background(), w.state(model.IPv4), full())
			if res.Err != nil {
				t.Fatalf("Apply: %v", res.Err)
			}
			if len(res.Failed) != 1 || res.Failed[bad] == nil {
				t.Fatalf("Failed = %v, want only %v", res.Failed, bad)
			}
			assertConsistent(t, k)
			env := &traceEnv{k: k, localAddrs: testLocalAddrs}
			runPacketFlowTests(t, env, []packetFlowTest{
				{name: "other Service works", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1"}, output: "10.180.1.1:80, 10.180.2.1:80"},
				{name: "failed Service is not programmed", pkt: packet{src: podHere, dst: a("172.30.0.43"), dport: 80, iif: "veth1"}, output: "local"},
			})

			// The next sync retries it (the loop marks it changed): still failing, still
			// alone, and partial.
			w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.2.77:80").Build())
			res = b.Apply(context.Background(), w.state(model.IPv4), changed("ns3/svc3", "ns1/svc1"))
			if res.Err != nil || res.Full || len(res.Failed) != 1 || res.Failed[bad] == nil {
				t.Fatalf("retry: Err=%v Full=%v Failed=%v", res.Err, res.Full, res.Failed)
			}
			runPacketFlowTests(t, env, []packetFlowTest{
				{name: "changed Service programmed", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1"}, output: "10.180.2.77:80"},
			})

			// Fixed (the kernel accepts it now): programmed by the next partial sync.
			k.rejectAtCommit = nil
			res = mustApply(t, b, w.state(model.IPv4), changed("ns3/svc3"))
			if res.Full {
				t.Fatalf("recovery sync was full")
			}
			runPacketFlowTests(t, env, []packetFlowTest{
				{name: "recovered", pkt: packet{src: podHere, dst: a("172.30.0.43"), dport: 80, iif: "veth1"}, output: "10.180.2.3:80"},
			})

			// A working Service whose update the kernel refuses keeps its last good rules,
			// through the partial sync that failed and through full syncs (which the sync
			// loop gives its last good version while it waits for its retry).
			lastGood := w.state(model.IPv4)
			k.rejectAtCommit = func(table, chain string, r *fakeRule) bool { return strings.Contains(r.spec, "10.180.2.33:80") }
			w.set(fixture.APIService("ns3/svc3", "p80", model.TCP, "172.30.0.43", 80).NodePort(3003).Endpoints("10.180.2.33:80").Build())
			res = b.Apply(context.Background(), w.state(model.IPv4), changed("ns3/svc3"))
			if res.Err != nil || res.Failed[bad] == nil {
				t.Fatalf("update: Err=%v Failed=%v", res.Err, res.Failed)
			}
			assertConsistent(t, k)
			runPacketFlowTests(t, env, []packetFlowTest{
				{name: "failed update keeps the last good rules", pkt: packet{src: podHere, dst: a("172.30.0.43"), dport: 80, iif: "veth1"}, output: "10.180.2.3:80"},
				{name: "others untouched", pkt: packet{src: podHere, dst: a("172.30.0.41"), dport: 80, iif: "veth1"}, output: "10.180.2.77:80"},
			})
			if d := diffRuleSets(fromScratch(t, cfg, flavour, lastGood), ruleSet(k)); d != "" {
				t.Fatalf("kernel differs from a full sync of the last good version:\n%s", d)
			}
			mustApply(t, b, lastGood, full())
			if d := diffRuleSets(fromScratch(t, cfg, flavour, lastGood), ruleSet(k)); d != "" {
				t.Fatalf("after a full sync of the last good version:\n%s", d)
			}
			// A full sync that tries the new version again keeps the old one too.
			res = b.Apply(context.Background(), w.state(model.IPv4), full())
			if res.Err != nil || res.Failed[bad] == nil {
				t.Fatalf("full retry: Err=%v Failed=%v", res.Err, res.Failed)
			}
			if d := diffRuleSets(fromScratch(t, cfg, flavour, lastGood), ruleSet(k)); d != "" {
				t.Fatalf("a full sync refused the update and did not keep the last good version:\n%s", d)
			}
			assertConsistent(t, k)
		})
	}
}

// TestHalfTakenUpdateIsWrittenBack: the kernel takes a Service's nat rules and refuses its
// filter rules (tables commit one by one): the nat rules are written back to the last good
// version, so that no Service is left with halves of two versions.
func TestHalfTakenUpdateIsWrittenBack(t *testing.T) {
	bad := types.NamespacedName{Namespace: "ns3", Name: "svc3"}
	for _, flavour := range []Flavour{FlavourLegacy, FlavourNFT} {
		t.Run(string(flavour), func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			b, k, w := featureBackend(t, flavour)
			lastGood := w.state(model.IPv4)

			// svc3 loses its endpoints: its nat chains go, a filter REJECT comes, and the
			// kernel refuses that REJECT.
			k.rejectAtCommit = func(table, chain string, r *fakeRule) bool {
				return table == tableFilter && strings.Contains(r.spec, "172.30.0.43")
			}
			w.set(fixture.APIService("ns3/svc3", "p80", model.TCP, "172.30.0.43", 80).NodePort(3003).Build())
			res := b.Apply(context.Background(), w.state(model.IPv4), changed("ns3/svc3"))
			if res.Err != nil || len(res.Failed) != 1 || res.Failed[bad] == nil {
				t.Fatalf("Err=%v Failed=%v", res.Err, res.Failed)
			}
			assertConsistent(t, k)
			if d := diffRuleSets(fromScratch(t, cfg, flavour, lastGood), ruleSet(k)); d != "" {
				t.Fatalf("kernel differs from the last good version:\n%s", d)
			}
			env := &traceEnv{k: k, localAddrs: testLocalAddrs}
			runPacketFlowTests(t, env, []packetFlowTest{
				{name: "last good rules", pkt: packet{src: a("10.180.1.99"), dst: a("172.30.0.43"), dport: 80, iif: "veth1"}, output: "10.180.2.3:80"},
			})

			// Fixed: the retry programs the update.
			k.rejectAtCommit = nil
			mustApply(t, b, w.state(model.IPv4), changed("ns3/svc3"))
			if d := diffRuleSets(fromScratch(t, cfg, flavour, w.state(model.IPv4)), ruleSet(k)); d != "" {
				t.Fatalf("after the retry:\n%s", d)
			}
		})
	}
}

// TestFaultyServiceOption checks the kernel-test hook: the extra rule is a MASQUERADE in a
// chain reachable from PREROUTING.
func TestFaultyServiceOption(t *testing.T) {
	bad := types.NamespacedName{Namespace: "ns1", Name: "svc1"}
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy, withFaultyServices(bad))
	k.rejectAtCommit = func(table, chain string, r *fakeRule) bool {
		return xtables.TargetOf(r.args) == "MASQUERADE" && chain != chainPostrouting
	}
	res := b.Apply(context.Background(), featureWorld().state(model.IPv4), full())
	if res.Err != nil || len(res.Failed) != 1 || res.Failed[bad] == nil {
		t.Fatalf("Err=%v Failed=%v", res.Err, res.Failed)
	}
	assertConsistent(t, k)
}

// TestDriftIsRepairedByAFullSync deletes a rule behind the backend's back: the next
// partial sync's -D fails, and the backend falls back to a full sync in the same Apply.
func TestDriftIsRepairedByAFullSync(t *testing.T) {
	cfg := testConfig(model.IPv4)
	b, k, w := featureBackend(t, FlavourLegacy)
	// Someone removes svc1's ClusterIP rule.
	k.mu.Lock()
	ch := k.tables[tableNAT].chains[chainServices]
	ch.rules = slices.DeleteFunc(ch.rules, func(r *fakeRule) bool { return strings.Contains(r.spec, "172.30.0.41") })
	k.mu.Unlock()

	// The next change of svc1 deletes that rule: the -D fails.
	w.set(fixture.APIService("ns1/svc1", "p80", model.TCP, "172.30.0.141", 80).ExternalIPs("192.168.99.1").Endpoints("10.180.2.1:80").Build())
	res := mustApply(t, b, w.state(model.IPv4), changed("ns1/svc1"))
	if !res.Full {
		t.Fatalf("drift was not answered by a full sync")
	}
	if d := diffRuleSets(fromScratch(t, cfg, FlavourLegacy, w.state(model.IPv4)), ruleSet(k)); d != "" {
		t.Fatalf("kernel differs from a full sync:\n%s", d)
	}
}

// featureBackend returns a backend of flavour f over a fake kernel, with featureWorld
// programmed in IPv4 by a full sync.
func featureBackend(t *testing.T, f Flavour) (*Backend, *fakeKernel, *world) {
	t.Helper()
	w := featureWorld()
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), f)
	mustApply(t, b, w.state(model.IPv4), full())
	return b, k, w
}

// TestFlushedTablesAreRewritten: a firewall reload flushes everything; the missing canary
// makes the next sync full and the rules come back.
func TestFlushedTablesAreRewritten(t *testing.T) {
	b, k, w := featureBackend(t, FlavourNFT)
	want := ruleSet(k)

	res := mustApply(t, b, w.state(model.IPv4), changed())
	if res.Full {
		t.Fatalf("sync without changes was full")
	}
	k.flush()
	res = mustApply(t, b, w.state(model.IPv4), changed())
	if !res.Full || b.LastStats().Reason != "canary chain missing" {
		t.Fatalf("after a flush: Full=%v reason=%q", res.Full, b.LastStats().Reason)
	}
	if d := diffRuleSets(want, ruleSet(k)); d != "" {
		t.Fatalf("rules not restored:\n%s", d)
	}
	assertConsistent(t, k)

	var resynced int
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Monitor(ctx, time.Millisecond, func() { resynced++; cancel() }); close(done) }()
	k.flush()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Monitor did not notice the flush")
	}
	if resynced != 1 {
		t.Fatalf("Monitor asked for %d resyncs, want 1", resynced)
	}
}

// TestStartOverUpstreamRules starts on a node where upstream kube-proxy left its rules: the
// first sync replaces them in one restore, deletes upstream's unused chains, and adds no
// duplicate jump.
func TestStartOverUpstreamRules(t *testing.T) {
	cfg := testConfig(model.IPv4)
	// What upstream would have programmed, plus a chain of a Service deleted since.
	_, k, w := featureBackend(t, FlavourLegacy)
	if f := k.restore("*nat\n:KUBE-SVC-GONEGONEGONEGONE - [0:0]\n:KUBE-SEP-GONEGONEGONEGONE - [0:0]\n" +
		"-A KUBE-SVC-GONEGONEGONEGONE -j KUBE-SEP-GONEGONEGONEGONE\n" +
		"-I KUBE-SERVICES 1 -d 172.30.9.9 -p tcp --dport 80 -j KUBE-SVC-GONEGONEGONEGONE\nCOMMIT\n"); f != nil {
		t.Fatalf("seeding: %+v", *f)
	}
	w.remove("ns2", "svc2")
	before := ruleSet(k)
	_ = before

	b, err := New(context.Background(), cfg, withCommander(k), WithFlavour(FlavourLegacy), withEditor(k),
		WithSysctls(fakeSysctl{}), withNFAcct(noNFAcct{}), withProbe(fakeProbe{}), withSaveListing(), WithoutLeftoverCleanup())
	if err != nil {
		t.Fatal(err)
	}
	n := len(k.restores)
	inserts := k.calls["Insert"]
	mustApply(t, b, w.state(model.IPv4), full())
	if got := len(k.restores) - n; got != 1 {
		t.Fatalf("start ran %d restores, want 1 (one transaction per table, no gap)", got)
	}
	if k.calls["Insert"] != inserts {
		t.Fatalf("start inserted %d jump rules over upstream's", k.calls["Insert"]-inserts)
	}
	if got := k.chainNames(tableNAT, "KUBE-SVC-GONE"); len(got) != 0 {
		t.Fatalf("upstream's stale chains survived: %v", got)
	}
	assertConsistent(t, k)
	if d := diffRuleSets(fromScratch(t, cfg, FlavourLegacy, w.state(model.IPv4)), ruleSet(k)); d != "" {
		t.Fatalf("kernel differs from a full sync:\n%s", d)
	}
}

// TestJumpRulesAreUpstreams checks the built-in chains after a first sync on an empty node:
// upstream's jumps, comments and order.
func TestJumpRulesAreUpstreams(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	want := map[string][]string{
		"filter/INPUT": {
			`-j KUBE-FIREWALL`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
			`-m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`,
		},
		"filter/FORWARD": {
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
			`-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`,
		},
		"filter/OUTPUT": {
			`-j KUBE-FIREWALL`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
			`-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		},
		"nat/PREROUTING":  {`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
		"nat/OUTPUT":      {`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
		"nat/POSTROUTING": {`-m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`},
	}
	for key, rules := range want {
		table, chain, _ := strings.Cut(key, "/")
		if got := k.rules(table, chain); !slices.Equal(got, rules) {
			t.Errorf("%s:\n got  %q\n want %q", key, got, rules)
		}
	}
	// A second full sync adds nothing.
	inserts := k.calls["Insert"]
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	if k.calls["Insert"] != inserts {
		t.Errorf("second full sync inserted jump rules again")
	}
}

// TestNFTFlavourSplitsLargeSyncs bounds the chains per restore and checks that the split
// full sync and the split partial sync end where one big restore would.
func TestNFTFlavourSplitsLargeSyncs(t *testing.T) {
	cfg := testConfig(model.IPv4)
	st := scaleState(300, 3)
	b, k, _ := newTestBackend(t, cfg, FlavourNFT, WithMaxChainsPerRestore(100))
	mustApply(t, b, st, full())
	if n := len(k.restores); n < 12 {
		t.Fatalf("full sync of 1200 chains ran %d restores, want at least 12", n)
	}
	for i, in := range k.restores {
		if n := strings.Count(in, "\n:"); n > 100+len(natTopChains)+len(filterTopChains)+4 {
			t.Fatalf("restore %d declares %d chains", i, n)
		}
	}
	assertConsistent(t, k)
	if d := diffRuleSets(fromScratch(t, cfg, FlavourLegacy, st), ruleSet(k)); d != "" {
		t.Fatalf("split full sync differs:\n%s", d)
	}
	// Every Service deleted at once: the partial sync is split too.
	empty := model.NewNodeState(model.IPv4, testNode)
	names := st.ServiceNames()
	n := len(k.restores)
	mustApply(t, b, empty, model.Changes{Services: names})
	if got := len(k.restores) - n; got < 12 {
		t.Fatalf("deleting 300 Services ran %d restores, want at least 12", got)
	}
	if got := append(k.chainNames(tableNAT, "KUBE-SVC-"), k.chainNames(tableNAT, "KUBE-SEP-")...); len(got) != 0 {
		t.Fatalf("chains left: %d %v", len(got), got)
	}
}

// TestPeriodicAndNodeWideFullSyncs: an hour after the last full sync, and when the node's
// NodePort addresses change, the sync is full.
func TestPeriodicAndNodeWideFullSyncs(t *testing.T) {
	cfg := testConfig(model.IPv4)
	cfg.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netipPrefix{mustPrefix("192.168.0.0/16")}}
	addrs := testLocalAddrs
	w := featureWorld()
	b, _, clock := newTestBackend(t, cfg, FlavourLegacy, WithLocalAddresses(func() ([]netipAddrT, error) { return addrs, nil }))
	mustApply(t, b, w.state(model.IPv4), full())
	if res := mustApply(t, b, w.state(model.IPv4), changed()); res.Full {
		t.Fatalf("unexpected full sync: %s", b.LastStats().Reason)
	}
	clock.t = clock.t.Add(61 * time.Minute)
	if res := mustApply(t, b, w.state(model.IPv4), changed()); !res.Full || b.LastStats().Reason != "periodic" {
		t.Fatalf("after an hour: full=%v reason=%q", res.Full, b.LastStats().Reason)
	}
	addrs = append(slices.Clone(addrs), netipAddr("192.168.1.7"))
	if res := mustApply(t, b, w.state(model.IPv4), changed()); !res.Full || b.LastStats().Reason != "node-wide rules changed" {
		t.Fatalf("after a new node address: full=%v reason=%q", res.Full, b.LastStats().Reason)
	}
}

func TestCleanupRemovesEverythingButKubeletsChains(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	// Someone else's chain and rule survive too.
	if f := k.restore("*filter\n:CNI-FORWARD - [0:0]\n-A FORWARD -j CNI-FORWARD\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"); f != nil {
		t.Fatal(*f)
	}
	if err := cleanup(context.Background(), model.IPv4, k, kernelProbe{k}); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, table := range []string{tableNAT, tableFilter, tableMangle} {
		for _, c := range k.chainNames(table, "KUBE-") {
			if c != chainKubeletFirewall && c != "KUBE-KUBELET-CANARY" {
				t.Errorf("%s: chain %s left", table, c)
			}
		}
	}
	for _, c := range []string{"INPUT", "FORWARD", "OUTPUT"} {
		for _, r := range k.rules(tableFilter, c) {
			if strings.Contains(r, "KUBE-") && !strings.Contains(r, chainKubeletFirewall) {
				t.Errorf("filter %s: rule %q left", c, r)
			}
		}
	}
	if got := k.rules(tableFilter, "FORWARD"); !slices.Contains(got, "-j CNI-FORWARD") {
		t.Errorf("someone else's rule was removed: %q", got)
	}
	if got := k.rules(tableFilter, "INPUT"); !slices.Contains(got, "-j KUBE-FIREWALL") {
		t.Errorf("kubelet's jump was removed: %q", got)
	}
}

func TestRouteLocalnetOnlyWithLocalhostNodePorts(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*dataplane.Config)
		want bool
	}{
		{"default", func(*dataplane.Config) {}, true},
		{"option off", func(c *dataplane.Config) { c.LocalhostNodePorts = false }, false},
		{"nodePortAddresses without loopback", func(c *dataplane.Config) {
			c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netipPrefix{mustPrefix("192.168.0.0/16")}}
		}, false},
		{"IPv6", func(c *dataplane.Config) { c.Family = model.IPv6 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			tc.cfg(&cfg)
			sys := fakeSysctl{}
			newTestBackend(t, cfg, FlavourLegacy, WithSysctls(sys))
			if got := sys[sysctlRouteLocalnet] == 1; got != tc.want {
				t.Errorf("route_localnet set = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTCPBeLiberalDropsTheInvalidRule(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy, WithSysctls(fakeSysctl{sysctlTCPBeLiberal: 1}))
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	for _, r := range k.rules(tableFilter, chainForward) {
		if strings.Contains(r, "INVALID") {
			t.Fatalf("INVALID drop rule written with tcp_be_liberal: %q", r)
		}
	}
}

// lockedKernel fails every restore as iptables-legacy does when another program holds the
// xtables lock past --wait.
type lockedKernel struct{ *fakeKernel }

func (l lockedKernel) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	if strings.HasSuffix(name, "-restore") {
		return nil, []byte("Another app is currently holding the xtables lock. Stopped waiting after 30s.\n"), xtables.ErrExit
	}
	return l.fakeKernel.Run(ctx, name, args, stdin)
}

func TestLockTimeoutBlamesNoService(t *testing.T) {
	k := newFakeKernel(FlavourLegacy)
	b, err := New(context.Background(), testConfig(model.IPv4), withCommander(lockedKernel{k}), WithFlavour(FlavourLegacy),
		withEditor(k), WithSysctls(fakeSysctl{}), withNFAcct(noNFAcct{}), withProbe(fakeProbe{}), withSaveListing(), WithoutLeftoverCleanup())
	if err != nil {
		t.Fatal(err)
	}
	res := b.Apply(context.Background(), featureWorld().state(model.IPv4), full())
	if res.Err == nil || len(res.Failed) != 0 {
		t.Fatalf("Err=%v Failed=%v; want a sync failure and no Service blamed", res.Err, res.Failed)
	}
	if !strings.Contains(res.Err.Error(), "xtables lock") {
		t.Errorf("error does not say why: %v", res.Err)
	}
}

// Every chain the backend writes is the iptables mode's by xtables' ownership rule, which
// leftover removal and Cleanup go by.
func TestEveryChainWrittenIsTheIPTablesModes(t *testing.T) {
	b, k, _ := newTestBackend(t, testConfig(model.IPv4), FlavourLegacy)
	mustApply(t, b, featureWorld().state(model.IPv4), full())
	for _, table := range []string{tableNAT, tableFilter, tableMangle} {
		for _, c := range k.chainNames(table, "KUBE-") {
			if c != chainKubeletFirewall && !xtables.IPTablesModeChain(table, c) {
				t.Errorf("%s: chain %s is not the iptables mode's", table, c)
			}
		}
	}
	for _, p := range []string{prefixClusterPolicy, prefixLocalPolicy, prefixExternal, prefixFirewall, prefixEndpoint} {
		if !slices.Contains(xtables.ServiceChainPrefixes, p) {
			t.Errorf("prefix %s is not in xtables.ServiceChainPrefixes", p)
		}
	}
}
