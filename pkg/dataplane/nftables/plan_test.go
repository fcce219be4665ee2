package nftables

import (
	"flag"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

var update = flag.Bool("update", false, "rewrite golden files")

var epoch = time.Unix(1_700_000_000, 0)

// planner test harness: a model that plans and "applies" (commits every group).
type fakeKernel struct {
	cfg   *layoutConfig
	state *tableState
	now   time.Time
	// deleteChainsNow as on kernels since 6.2.
	deleteChainsNow bool
}

func newFakeKernel(cfg dataplane.Config) *fakeKernel {
	return &fakeKernel{cfg: testLayout(cfg, testServiceCIDR), state: newTableState(), now: epoch, deleteChainsNow: true}
}

func (k *fakeKernel) plan(ns *model.NodeState, ch model.Changes) *Plan {
	k.cfg.serviceCIDRs = ns.ServiceCIDRs
	if counting := anyCounted(ns); counting != k.cfg.countPackets {
		// As the backend: the packet counters' fixed part comes with a full plan.
		k.cfg.countPackets, ch.Full = counting, true
	}
	if ch.Full {
		// A full plan starts from a read of the kernel, which has the endpoint map
		// elements the model keeps only in the records.
		for name, s := range k.state.sets {
			if isEndpointMap(name) {
				s.intervals = intervalElems{}
			}
		}
		for _, r := range k.state.services {
			for _, sl := range r.slots {
				if s := k.state.sets[sl.set]; s != nil {
					for i, ep := range sl.eps {
						v := endpointValue(k.cfg.f, ep.AddrPort())
						lo, hi := blockRange(sl.base, i, len(sl.eps))
						s.intervals.add(lo, false, []byte(v[1:]))
						s.intervals.add(hi, true, nil)
					}
				}
			}
		}
		for name, s := range k.state.sets {
			if isEndpointMap(name) {
				s.intervals.sort()
			}
		}
	}
	in := &planInput{
		cfg: k.cfg, nodeIP: testNodeIP, localAddrs: testLocalAddrs,
		desired: ns, full: ch.Full, changed: ch.Services, state: k.state, prevRecords: k.state.services,
		deleteChainsNow: k.deleteChainsNow, now: k.now,
	}
	return plan(in)
}

// apply plans and commits the plan as if the kernel took every group.
func (k *fakeKernel) apply(ns *model.NodeState, ch model.Changes) *Plan {
	p := k.plan(ns, ch)
	if p.replace {
		k.state = newTableState()
	}
	for _, g := range p.groups {
		k.state.commit(g, k.now)
	}
	return p
}

// golden compares got, without its empty endpoint maps (withoutEmptyEndpointMaps), with
// testdata/name.
func golden(t *testing.T, name, got string) {
	t.Helper()
	fixture.Golden(t, name, withoutEmptyEndpointMaps(got), *update)
}

// withoutEmptyEndpointMaps drops from an nft script the "add map" of every endpoint map no
// other line names: most of the 256 maps a full plan creates hold nothing in a test of a
// few Services, and the golden files show what the Services use. (The kernel test that
// loads a golden file with nft loads the whole script, Render's, instead.)
func withoutEmptyEndpointMaps(script string) string {
	lines := strings.SplitAfter(script, "\n")
	named := map[string]int{}
	for _, l := range lines {
		for _, f := range strings.Fields(l) {
			f = strings.TrimPrefix(f, "@")
			if isEndpointMap(f) {
				named[f]++
			}
		}
	}
	var b strings.Builder
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 4 && f[0] == "add" && f[1] == "map" && isEndpointMap(f[4]) && named[f[4]] == 1 {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

// planVariant is a configuration the golden tests (and the kernel tests that load the
// golden files with nft) cover.
type planVariant struct {
	name   string
	family model.IPFamily
	edit   func(*dataplane.Config)
	// counted counts every Service's traffic (--traffic-counters=all).
	counted bool
}

// state is the variant's desired state: the examples, counted or not.
func (v planVariant) state() *model.NodeState {
	if v.counted {
		return withCounters(examples(v.family))
	}
	return examples(v.family)
}

func (v planVariant) config() dataplane.Config {
	cfg := testConfig(v.family)
	if v.edit != nil {
		v.edit(&cfg)
	}
	return cfg
}

var planVariants = []planVariant{
	{name: "ipv4", family: model.IPv4},
	{name: "ipv6", family: model.IPv6},
	{name: "ipv4-counted", family: model.IPv4, counted: true},
	{name: "ipv6-counted", family: model.IPv6, counted: true},
	{name: "ipv4-masquerade-all-nodeports-everywhere", family: model.IPv4, edit: func(c *dataplane.Config) {
		c.MasqueradeAll = true
		c.NodePortAddresses = dataplane.NodePortAddresses{MatchAll: true}
	}},
	{name: "ipv4-bridge-interface", family: model.IPv4, edit: func(c *dataplane.Config) {
		c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}
	}},
	{name: "ipv4-interface-prefix", family: model.IPv4, edit: func(c *dataplane.Config) {
		c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}
	}},
	{name: "ipv4-no-local-detector", family: model.IPv4, edit: func(c *dataplane.Config) {
		c.LocalDetector = dataplane.LocalDetector{}
		c.NodePortAddresses.CIDRs = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}
	}},
}

// testLocalAddrs are the node addresses the planner tests (and the kernel tests loading
// their golden files) see.
var testLocalAddrs = []netip.Addr{testNodeIP, testNodeIPv6, netip.MustParseAddr("127.0.0.1")}

func TestFullPlanGolden(t *testing.T) {
	for _, v := range planVariants {
		t.Run(v.name, func(t *testing.T) {
			k := newFakeKernel(v.config())
			p := k.apply(v.state(), model.Changes{Full: true})
			golden(t, "full-"+v.name+".nft", p.String())
		})
	}
}

func TestConvergedTablePlansNothing(t *testing.T) {
	for _, f := range model.Families {
		k := newFakeKernel(testConfig(f))
		ns := examples(f)
		k.apply(ns, model.Changes{Full: true})
		if p := k.plan(ns, model.Changes{Full: true}); !p.Empty() {
			t.Errorf("%v: full plan over a converged table:\n%s", f, p)
		}
		all := changed("ns1/svc1", "ns2/svc2", "ns4/svc4", "ns5/svc5", "ns6/svc6", "gone/svc")
		if p := k.plan(ns, all); !p.Empty() {
			t.Errorf("%v: partial plan of unchanged Services:\n%s", f, p)
		}
	}
}

// TestOneEndpointChangeCostsTheSameAtAnyScale: a partial sync's plan depends on what
// changed, not on how many Services exist.
func TestOneEndpointChangeCostsTheSameAtAnyScale(t *testing.T) {
	var plans []string
	var counts []int
	for _, n := range []int{100, 10000} {
		k := newFakeKernel(testConfig(model.IPv4))
		ns := scaleState(model.IPv4, n, 10)
		start := time.Now()
		k.apply(ns, model.Changes{Full: true})
		t.Logf("%d Services: full plan %v", n, time.Since(start))

		// Move one endpoint of one Service.
		target := types.NamespacedName{Namespace: "ns7", Name: "svc7"}
		sp := *ns.PortsOf(target)[0]
		sp.ClusterEndpoints = append(sp.ClusterEndpoints[:9:9], model.Endpoint{
			IP: netip.MustParseAddr("10.250.0.1"), Port: 8080, Ready: true, Serving: true})
		ns.SetService(target, []*model.ServicePort{&sp}, nil)
		start = time.Now()
		p := k.apply(ns, changed("ns7/svc7"))
		t.Logf("%d Services: one-endpoint plan %v, %d operations", n, time.Since(start), p.Len())
		plans = append(plans, slotNumbers.ReplaceAllString(p.String(), "{ RANGE"))
		counts = append(counts, p.Len())
	}
	if counts[0] != counts[1] || plans[0] != plans[1] {
		t.Errorf("one-endpoint change: %d operations with 100 Services, %d with 10000:\n%s\n---\n%s", counts[0], counts[1], plans[0], plans[1])
	}
	golden(t, "one-endpoint-change.nft", plans[0])
}

func TestPartialPlans(t *testing.T) {
	f := model.IPv4
	base := func() []*model.ServicePort {
		return []*model.ServicePort{
			svc("ns1", "a", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80@local", "10.180.0.2:80").Build(),
			svc("ns1", "b", "p", model.TCP, "172.30.0.2", 80).Endpoints("10.180.0.1:80@local").Build(),
			svc("ns1", "c", "p", model.UDP, "172.30.0.3", 53).LoadBalancer("5.6.7.8").Endpoints("10.180.0.3:53").Build(),
		}
	}
	for _, tc := range []struct {
		name    string
		after   []*model.ServicePort
		changed []string
		want    string
	}{
		{
			name:    "a Service goes away; its hairpin element stays while another Service needs it",
			after:   base()[1:],
			changed: []string{"ns1/a"},
			want: `# ns1/a
flush chain ip kube-proxy service-<ns1/a/tcp/p>
delete element ip kube-proxy cluster-ips { 172.30.0.1 }
delete element ip kube-proxy endpoints-<<ns1/a>> { 0-524287 }
delete element ip kube-proxy endpoints-<<ns1/a>> { 524288-1048575 }
delete element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 }
delete chain ip kube-proxy service-<ns1/a/tcp/p>
`,
		},
		{
			name: "the last endpoint goes: its range goes, the Service's addresses are rejected; no rule changes",
			after: append(base()[:2],
				svc("ns1", "c", "p", model.UDP, "172.30.0.3", 53).LoadBalancer("5.6.7.8").Build()),
			changed: []string{"ns1/c"},
			want: `# ns1/c
delete element ip kube-proxy endpoints-<<ns1/c/udp>> { 0-1048575 }
add element ip kube-proxy reject-services { 172.30.0.3 . udp . 53 comment "ns1/c:p" }
add element ip kube-proxy reject-services { 5.6.7.8 . udp . 53 comment "ns1/c:p" }
`,
		},
		{
			name: "one endpoint replaced: its range rewritten",
			after: []*model.ServicePort{
				svc("ns1", "a", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80@local", "10.180.0.9:80").Build(),
				base()[1], base()[2]},
			changed: []string{"ns1/a"},
			want: `# ns1/a
delete element ip kube-proxy endpoints-<<ns1/a>> { 524288-1048575 }
add element ip kube-proxy endpoints-<<ns1/a>> { 524288-1048575 : 10.180.0.9 . 80 }
`,
		},
		{
			name: "a third endpoint: the block is split in three, no rule changes",
			after: []*model.ServicePort{
				svc("ns1", "a", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80@local", "10.180.0.2:80", "10.180.0.9:80").Build(),
				base()[1], base()[2]},
			changed: []string{"ns1/a"},
			want: `# ns1/a
delete element ip kube-proxy endpoints-<<ns1/a>> { 0-524287 }
delete element ip kube-proxy endpoints-<<ns1/a>> { 524288-1048575 }
add element ip kube-proxy endpoints-<<ns1/a>> { 0-349524 : 10.180.0.1 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 349525-699049 : 10.180.0.2 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 699050-1048575 : 10.180.0.9 . 80 }
`,
		},
		{
			name: "session affinity switched on: endpoint chains and affinity sets",
			after: []*model.ServicePort{base()[0],
				svc("ns1", "b", "p", model.TCP, "172.30.0.2", 80).Affinity(60).Endpoints("10.180.0.1:80@local").Build(),
				base()[2]},
			changed: []string{"ns1/b"},
			want: `# ns1/b
add chain ip kube-proxy endpoint-<ns1/b/tcp/p__10.180.0.1/80>
flush chain ip kube-proxy service-<ns1/b/tcp/p>
add set ip kube-proxy affinity-<ns1/b/tcp/p__10.180.0.1/80> { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }
add rule ip kube-proxy endpoint-<ns1/b/tcp/p__10.180.0.1/80> update @affinity-<ns1/b/tcp/p__10.180.0.1/80> { ip saddr }
add rule ip kube-proxy endpoint-<ns1/b/tcp/p__10.180.0.1/80> meta l4proto tcp dnat to 10.180.0.1:80
add rule ip kube-proxy service-<ns1/b/tcp/p> ip saddr @affinity-<ns1/b/tcp/p__10.180.0.1/80> goto endpoint-<ns1/b/tcp/p__10.180.0.1/80>
add rule ip kube-proxy service-<ns1/b/tcp/p> goto endpoint-<ns1/b/tcp/p__10.180.0.1/80>
delete element ip kube-proxy endpoints-<<ns1/b>> { 0-1048575 }
`,
		},
		{
			name: "from two endpoints to five: the same block, rule and chain",
			after: []*model.ServicePort{
				svc("ns1", "a", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80@local", "10.180.0.2:80",
					"10.180.0.5:80", "10.180.0.6:80", "10.180.0.7:80").Build(),
				base()[1], base()[2]},
			changed: []string{"ns1/a"},
			want: `# ns1/a
delete element ip kube-proxy endpoints-<<ns1/a>> { 0-524287 }
delete element ip kube-proxy endpoints-<<ns1/a>> { 524288-1048575 }
add element ip kube-proxy endpoints-<<ns1/a>> { 0-209714 : 10.180.0.1 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 209715-419429 : 10.180.0.2 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 419430-629144 : 10.180.0.5 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 629145-838859 : 10.180.0.6 . 80 }
add element ip kube-proxy endpoints-<<ns1/a>> { 838860-1048575 : 10.180.0.7 . 80 }
`,
		},
		{
			name: "the affinity timeout changes: the sets are replaced and every chain rewritten",
			after: []*model.ServicePort{base()[0],
				svc("ns1", "b", "p", model.TCP, "172.30.0.2", 80).Affinity(120).Endpoints("10.180.0.1:80@local").Build(),
				base()[2]},
			changed: []string{"ns1/b"},
		},
		{
			name: "two Services claim one LoadBalancer IP and port: the first one keeps it",
			after: append(base(),
				svc("ns0", "z", "p", model.UDP, "172.30.0.4", 53).LoadBalancer("5.6.7.8").Endpoints("10.180.0.4:53").Build()),
			changed: []string{"ns0/z"},
			want: `# ns0/z
add chain ip kube-proxy external-<ns0/z/udp/p>
add chain ip kube-proxy service-<ns0/z/udp/p>
add rule ip kube-proxy external-<ns0/z/udp/p> mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-<ns0/z/udp/p> goto service-<ns0/z/udp/p>
add rule ip kube-proxy service-<ns0/z/udp/p> meta l4proto udp dnat ip addr . port to numgen random mod 1048576 offset 0 map @endpoints-<<ns0/z/udp>>
add element ip kube-proxy cluster-ips { 172.30.0.4 }
add element ip kube-proxy endpoints-<<ns0/z/udp>> { 0-1048575 : 10.180.0.4 . 53 }
add element ip kube-proxy service-ips { 172.30.0.4 . udp . 53 : goto service-<ns0/z/udp/p> }
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel(testConfig(f))
			k.apply(nodeState(f, base()...), model.Changes{Full: true})
			if tc.name == "the affinity timeout changes: the sets are replaced and every chain rewritten" {
				k.apply(nodeState(f, base()[0], svc("ns1", "b", "p", model.TCP, "172.30.0.2", 80).Affinity(60).Endpoints("10.180.0.1:80@local").Build(), base()[2]), changed("ns1/b"))
			}
			after := nodeState(f, tc.after...)
			p := k.apply(after, changed(tc.changed...))
			got := p.String()
			if tc.want != "" {
				if diff := cmp.Diff(expandNames(tc.want), got); diff != "" {
					t.Errorf("plan (-want +got):\n%s", diff)
				}
			} else {
				for _, want := range []string{"delete set", "add set", "flush chain ip kube-proxy service-", "flush chain ip kube-proxy endpoint-"} {
					if !strings.Contains(got, want) {
						t.Errorf("plan lacks %q:\n%s", want, got)
					}
				}
			}
			// Whatever the partial plan did, a full plan must now find nothing to do.
			if p := k.plan(after, model.Changes{Full: true}); !p.Empty() {
				t.Errorf("full plan after the partial one is not empty:\n%s", p)
			}
		})
	}
}

func TestSecondClaimantTakesOverAnElement(t *testing.T) {
	f := model.IPv4
	z := svc("ns0", "z", "p", model.UDP, "172.30.0.4", 53).LoadBalancer("5.6.7.8").Endpoints("10.180.0.4:53").Build()
	c := svc("ns1", "c", "p", model.UDP, "172.30.0.3", 53).LoadBalancer("5.6.7.8").Endpoints("10.180.0.3:53").Build()
	k := newFakeKernel(testConfig(f))
	k.apply(nodeState(f, c, z), model.Changes{Full: true})
	// ns0/z was planned first and owns 5.6.7.8.udp.53; when it goes, ns1/c gets it.
	p := k.apply(nodeState(f, c), changed("ns0/z"))
	if !strings.Contains(p.String(), expandNames("add element ip kube-proxy service-ips { 5.6.7.8 . udp . 53 : goto external-<ns1/c/udp/p> }")) {
		t.Errorf("the remaining claimant did not take the element over:\n%s", p)
	}
	if p := k.plan(nodeState(f, c), model.Changes{Full: true}); !p.Empty() {
		t.Errorf("full plan afterwards:\n%s", p)
	}
}

func TestInvalidServiceIsLeftAloneAndReported(t *testing.T) {
	f := model.IPv4
	good := svc("ns1", "good", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80").Build()
	okBefore := svc("ns1", "flaky", "p", model.TCP, "172.30.0.2", 80).Endpoints("10.180.0.2:80").Build()
	k := newFakeKernel(testConfig(f))
	k.apply(nodeState(f, good, okBefore), model.Changes{Full: true})

	for _, bad := range []*model.ServicePort{
		svc("ns1", "flaky", "p", model.TCP, "172.30.0.2", 80).Endpoints("[fd00::1]:80").Build(),
		svc("ns1", "flaky", "p", model.TCP, "172.30.0.2", 0).Endpoints("10.180.0.2:80").Build(),
		svc("ns1", "flaky", "p", model.TCP, "fd00::2", 80).Endpoints("10.180.0.2:80").Build(),
		svc("ns1", "flaky", "p", "ICMP", "172.30.0.2", 80).Endpoints("10.180.0.2:80").Build(),
	} {
		ns := nodeState(f, good, bad)
		for _, ch := range []model.Changes{changed("ns1/flaky"), {Full: true}} {
			p := k.apply(ns, ch)
			if _, ok := p.invalid[bad.Name.NamespacedName]; !ok {
				t.Errorf("%v: bad Service not reported", bad)
			}
			if !p.Empty() {
				t.Errorf("%v (full=%v): plan touches the table:\n%s", bad, ch.Full, p)
			}
		}
	}
}

func TestLongNamesAndCommentsFit(t *testing.T) {
	long := strings.Repeat("n", 63)
	sp := svc(long, strings.Repeat("s", 63), strings.Repeat("p", 63), model.TCP, "172.30.0.1", 80).
		Affinity(10).NodePort(30000).LoadBalancer("1.2.3.4").ExternalLocal().Endpoints("10.180.0.1:80", "10.180.0.2:80").Build()
	k := newFakeKernel(testConfig(model.IPv4))
	p := k.apply(nodeState(model.IPv4, sp), model.Changes{Full: true})
	for _, g := range p.groups {
		for _, o := range g.ops {
			if len(o.name) > nameLengthMax {
				t.Errorf("name of %d bytes: %s", len(o.name), o.name)
			}
			for _, e := range o.elems {
				if len(e.comment) > commentLengthMax {
					t.Errorf("comment of %d bytes", len(e.comment))
				}
			}
		}
	}
	// An IPv6 endpoint makes the longest names; they are cut with "..." and stay unique.
	a := endpointNameBase(sp.Name, netip.MustParseAddrPort("[fd00:1234:5678:9abc:def0:1234:5678:9abc]:65535"))
	b := endpointNameBase(sp.Name, netip.MustParseAddrPort("[fd00:1234:5678:9abc:def0:1234:5678:9abd]:65535"))
	if len(endpointChainPrefix+a) > nameLengthMax || !strings.HasSuffix(a, "...") || a == b {
		t.Errorf("endpoint names %q / %q", a, b)
	}
}

func TestIncompatibleTableIsReplacedInOneTransaction(t *testing.T) {
	k := newFakeKernel(testConfig(model.IPv4))
	ns := examples(model.IPv4)
	k.apply(ns, model.Changes{Full: true})
	// Some other version made service-ips a map of another type.
	k.state.sets[serviceIPsMap].def.keyType = concatType(typeIPv4Addr, typeInetService)
	p := k.plan(ns, model.Changes{Full: true})
	if !p.replace || p.groups[0].ops[0].kind != opDeleteTable {
		t.Fatalf("want a replacement starting with delete table, got replace=%v:\n%s", p.replace, p)
	}
	if !strings.Contains(p.String(), "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80") {
		t.Errorf("the replacement does not rebuild the Services:\n%s", p)
	}
}

func TestStaleChainsWaitOnOldKernels(t *testing.T) {
	f := model.IPv4
	a := svc("ns1", "a", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80").Build()
	k := newFakeKernel(testConfig(f))
	k.deleteChainsNow = false
	k.apply(nodeState(f, a), model.Changes{Full: true})
	p := k.apply(nodeState(f), changed("ns1/a"))
	if strings.Contains(p.String(), "delete chain") || !strings.Contains(p.String(), "flush chain") {
		t.Fatalf("stale chain not just flushed:\n%s", p)
	}
	if p := k.apply(nodeState(f), changed()); strings.Contains(p.String(), "delete chain") {
		t.Fatalf("stale chain deleted at once:\n%s", p)
	}
	k.now = k.now.Add(2 * time.Second)
	p = k.apply(nodeState(f), changed())
	if !strings.Contains(p.String(), expandNames("delete chain ip kube-proxy service-<ns1/a/tcp/p>")) {
		t.Fatalf("stale chain not deleted after the delay:\n%s", p)
	}
	if len(k.state.staleChains) != 0 {
		t.Errorf("stale chains left: %v", k.state.staleChains)
	}
}

func TestNodePortAddressesChangeReplacesTheSet(t *testing.T) {
	cfg := testConfig(model.IPv4)
	k := newFakeKernel(cfg)
	ns := examples(model.IPv4)
	k.apply(ns, model.Changes{Full: true})
	k.cfg.nodePortMatchAll = true
	p := k.apply(ns, model.Changes{Full: true})
	got := p.String()
	for _, want := range []string{
		"flush chain ip kube-proxy services",
		"add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
		"delete set ip kube-proxy nodeport-ips",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("plan lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "delete set") < strings.Index(got, "add rule ip kube-proxy nodeport-endpoints-check") {
		t.Errorf("set deleted before the rules using it were replaced:\n%s", got)
	}
}

var nameToken = regexp.MustCompile(`-<([^>]+)>`)

// slotNumbers matches the slot of an endpoints-<<ns1/a>> element, which depends on the order
// blocks were allocated in.
var slotNumbers = regexp.MustCompile(`\{ [0-9]+-[0-9]+`)

// expandNames replaces "-<ns/svc/proto/port>" (and "-<...__ip/port>") in expected
// output with the hashed name, so that tests read like the names they mean.
func expandNames(s string) string {
	s = mapToken.ReplaceAllStringFunc(s, func(m string) string {
		svc := m[len("endpoints-<<") : len(m)-2]
		proto := model.TCP
		if rest, ok := strings.CutSuffix(svc, "/udp"); ok {
			svc, proto = rest, model.UDP
		}
		return endpointMapOf(chainNamesFor(model.ServicePortName{NamespacedName: nsName(svc), Port: "p", Protocol: proto}).cluster)
	})
	return nameToken.ReplaceAllStringFunc(s, func(m string) string {
		return "-" + hashAndTruncate(m[2:len(m)-1])
	})
}

// mapToken is "endpoints-<<ns/svc>>": the endpoint map of that Service's TCP port "p"
// ("endpoints-<<ns/svc/udp>>": of its UDP port "p").
var mapToken = regexp.MustCompile(`endpoints-<<[^>]+>>`)

func nsName(s string) types.NamespacedName { return fixture.Name(s) }

// TestFullPlanRewritesAChangedBlockInKernelOrder: a full sync that finds a Service's
// endpoint count changed (the churn of issue 14: the Service grew or shrank since the
// read) deletes every element of its block, in the kernel's order, in the Service's
// group, and leaves none of them to the leftovers. Deleting only the two outer
// boundaries there and the inner ones in the leftovers made the kernel answer ENOENT on
// every full sync.
func TestFullPlanRewritesAChangedBlockInKernelOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to int
	}{
		{"shrinks", 10, 9},
		{"grows", 10, 11},
		{"halves", 10, 5},
		{"loses its last endpoint", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel(testConfig(model.IPv4))
			ns := scaleState(model.IPv4, 3, tc.from)
			k.apply(ns, model.Changes{Full: true})
			target := types.NamespacedName{Namespace: "ns1", Name: "svc1"}
			old := k.state.services[target].slots[0]

			sp := *ns.PortsOf(target)[0]
			sp.ClusterEndpoints = nil
			for j := 0; j < tc.to; j++ {
				sp.ClusterEndpoints = append(sp.ClusterEndpoints, model.Endpoint{
					IP: netip.AddrFrom4([4]byte{10, 250, 0, byte(j + 1)}), Port: 8080, Ready: true, Serving: true})
			}
			ns.SetService(target, []*model.ServicePort{&sp}, nil)
			p := k.apply(ns, model.Changes{Full: true})

			var want []string
			for j := range old.eps {
				lo, hi := blockRange(old.base, j, len(old.eps))
				want = append(want, startKey(lo), endKey(hi))
			}
			var got []string
			for _, g := range p.groups {
				for _, o := range g.ops {
					if o.kind != opDeleteElements || o.name != old.set {
						continue
					}
					if g.service != target {
						t.Errorf("a group other than the Service's deletes elements of %s: %v", o.name, o.elems)
					}
					for _, e := range o.elems {
						got = append(got, e.key)
					}
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("deletes from %s (-want +got):\n%s\nplan:\n%s", old.set, diff, p)
			}
			if p := k.plan(ns, model.Changes{Full: true}); p.Len() != 0 {
				t.Errorf("the next full plan is not empty:\n%s", p)
			}
		})
	}
}
