package ipvs

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// renderWorld has a Service of every kind the backend programs differently.
func renderWorld(f model.IPFamily) *model.NodeState {
	if f == model.IPv6 {
		state := stateOfFamily(model.IPv6,
			fixture.ServicePort("ns/web6", "http", model.TCP, "fd00:172:30::10", 80).Endpoints("[fd00:10::2]:8080", "[fd00:10::3]:8080").Build(),
			fixture.ServicePort("ns/np6", "", model.TCP, "fd00:172:30::11", 80).NodePort(30600).Affinity(600).Endpoints("[fd00:10::4]:8080").Build(),
			fixture.ServicePort("ns/lb6", "", model.TCP, "fd00:172:30::12", 443).NodePort(30643).LoadBalancer("2001:db8:1::7").SourceRanges("2001:db8:77::/64").Endpoints("[fd00:10::5]:8443").Build(),
		)
		return state
	}
	return stateOf(
		fixture.ServicePort("ns/web", "http", model.TCP, "172.30.0.10", 80).Endpoints("10.180.1.2:8080@local", "10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/dns", "", model.UDP, "172.30.0.13", 53).Scheduler("mh").Endpoints("10.180.2.6:5353").Build(),
		fixture.ServicePort("ns/np", "", model.TCP, "172.30.0.11", 80).NodePort(30080).Affinity(10800).Endpoints("10.180.2.4:8080").Build(),
		fixture.ServicePort("ns/sctp", "", model.SCTP, "172.30.0.14", 7777).NodePort(30777).Endpoints("10.180.2.7:7777").Build(),
		fixture.ServicePort("ns/lb", "", model.TCP, "172.30.0.12", 443).NodePort(30443).LoadBalancer("5.6.7.7").SourceRanges("198.51.100.0/24").ExternalIPs("192.168.99.9").Endpoints("10.180.2.5:8443").Build(),
		fixture.ServicePort("ns/local", "", model.TCP, "172.30.0.15", 80).NodePort(30081).LoadBalancer("5.6.7.8").ExternalLocal().HealthCheckNodePort(32000).Endpoints("10.180.2.8:8080").Build(),
		fixture.ServicePort("ns/empty", "", model.TCP, "172.30.0.16", 80).Build(),
		// Wants the externalIP ns/lb holds: the first by name keeps it.
		fixture.ServicePort("ns/second", "", model.TCP, "172.30.0.17", 443).ExternalIPs("192.168.99.9").Endpoints("10.180.2.9:8443").Build(),
	)
}

// fakeCall is how the fake kernel logs the call an operation makes.
func fakeCall(o op, family model.IPFamily) string {
	switch o.kind {
	case opCreateLink:
		return "create-link " + dummyDevice
	case opCreateSet:
		return "create-set " + ipsetName(o.set, family)
	case opAddVS:
		return "add-vs " + o.vs.String()
	case opAddRS:
		return "add-rs " + o.vs.String() + " " + o.rs.String()
	case opBindAddr:
		return "add-addr " + dummyDevice + " " + o.addr.String()
	case opAddEntry:
		return "add-entry " + ipsetName(o.set, family) + " " + o.entry.String()
	}
	return "unexpected on an empty node: " + o.String()
}

// TestRenderIsWhatAFullSyncDoesOnAnEmptyNode: the operations Render prints are the calls
// the backend's first full sync makes on an empty (fake) node, in the same order, and its
// iptables-restore input is the one the backend fed.
func TestRenderIsWhatAFullSyncDoesOnAnEmptyNode(t *testing.T) {
	extra := addr("192.168.99.50") // a second address of the node, inside 192.168.99.0/24
	tests := []struct {
		name     string
		family   model.IPFamily
		cfg      func(*dataplane.Config)
		settings Settings
		opts     RenderOptions
		node     func(*fakeKernel)
	}{
		{name: "IPv4 defaults", family: model.IPv4},
		{name: "IPv6", family: model.IPv6},
		{name: "masqueradeAll, no detector, scheduler, excludeCIDRs", family: model.IPv4,
			cfg:      func(c *dataplane.Config) { c.MasqueradeAll = true; c.LocalDetector = dataplane.LocalDetector{} },
			settings: Settings{Scheduler: "lc", ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/30"), netip.MustParsePrefix("fd00::/8")}}},
		{name: "nodePortAddresses and a further local address", family: model.IPv4,
			cfg: func(c *dataplane.Config) {
				c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.99.0/24")}}
			},
			opts: RenderOptions{LocalAddresses: []netip.Addr{nodeIP, nodeIPv6, extra, addr("127.0.0.1"), addr("::1")}},
			node: func(k *fakeKernel) { k.links["eth1"] = []netip.Addr{extra} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.family)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			state := renderWorld(tc.family)

			k := newFakeNode()
			if tc.node != nil {
				tc.node(k)
			}
			opts := []Option{withFake(k), WithClock(newClock().now), WithoutLeftoverCleanup()}
			if tc.family == model.IPv6 {
				opts = append(opts, func(o *options) { o.ipt = fakeIPTables{k: k, v6: true} })
			}
			b, err := New(context.Background(), cfg, tc.settings, opts...)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			before := len(k.calls)
			res := b.Apply(context.Background(), state, model.Changes{Full: true})
			if res.Err != nil {
				t.Fatalf("Apply: %v", res.Err)
			}
			calls := k.calls[before:]

			r, err := renderSync(state, cfg, tc.settings, tc.opts)
			if err != nil {
				t.Fatalf("renderSync: %v", err)
			}
			var want []string
			for _, o := range r.plan.setup {
				want = append(want, fakeCall(o, tc.family))
			}
			for _, so := range r.plan.services {
				for _, o := range so.ops {
					want = append(want, fakeCall(o, tc.family))
				}
			}
			for _, o := range r.plan.adds {
				want = append(want, fakeCall(o, tc.family))
			}
			want = append(want, "restore")
			for _, o := range r.plan.deletes {
				want = append(want, fakeCall(o, tc.family))
			}
			if diff := cmp.Diff(want, calls); diff != "" {
				t.Errorf("rendered operations differ from the backend's calls (-render +backend):\n%s", diff)
			}
			if diff := cmp.Diff(k.restores[len(k.restores)-1], string(r.restore)); diff != "" {
				t.Errorf("rendered restore input differs from the backend's (-backend +render):\n%s", diff)
			}
			// The conflict is reported by both.
			if tc.family == model.IPv4 {
				if err := res.Failed[nn("ns/second")]; err == nil {
					t.Errorf("the backend did not fail ns/second: %v", res.Failed)
				}
				text := r.String()
				if !strings.Contains(text, "# ns/second\n#   left out: 192.168.99.9:443/TCP (port ns/second) is already used by Service ns/lb\n") {
					t.Errorf("Render does not name the conflict:\n%s", text)
				}
			}
		})
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	state := renderWorld(model.IPv4)
	type badInput struct {
		fixture.BadRenderInput
		settings Settings
	}
	var cases []badInput
	for _, c := range fixture.BadRenderInputs(state) {
		cases = append(cases, badInput{BadRenderInput: c})
	}
	cases = append(cases,
		badInput{BadRenderInput: fixture.BadRenderInput{Name: "mark bit", State: state, Config: func(c *dataplane.Config) { c.MasqueradeBit = 40 }, Want: "masquerade bit 40"}},
		badInput{BadRenderInput: fixture.BadRenderInput{Name: "scheduler", State: state, Config: func(*dataplane.Config) {}, Want: `"fastest" is not an IPVS scheduler`},
			settings: Settings{Scheduler: "fastest"}})
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			cfg := testConfig(model.IPv4)
			tc.Config(&cfg)
			if _, err := Render(tc.State, cfg, tc.settings, RenderOptions{}); err == nil || !strings.Contains(err.Error(), tc.Want) {
				t.Errorf("Render: %v, want an error containing %q", err, tc.Want)
			}
		})
	}
}
