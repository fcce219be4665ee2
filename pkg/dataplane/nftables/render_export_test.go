package nftables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// TestRenderIsTheFirstFullPlan: Render is the plan of a first full sync (the planner test
// harness, which commits what it plans as the kernel would), and so the reviewed golden
// files that nft loads (TestTablesWrittenByNftConverge). The kernel test
// TestKernelRenderIsWhatTheBackendSends compares it with a real backend's plan.
func TestRenderIsTheFirstFullPlan(t *testing.T) {
	for _, v := range planVariants {
		t.Run(v.name, func(t *testing.T) {
			state := v.state()
			got, err := Render(state, v.config(), RenderOptions{LocalAddresses: testLocalAddrs})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			want := newFakeKernel(v.config()).apply(state, model.Changes{Full: true}).String()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Render differs from the first full plan (-plan +render):\n%s", diff)
			}
			golden(t, "full-"+v.name+".nft", got)
		})
	}
}

// TestRenderDefaultsToTheNodeAddresses: without LocalAddresses, @nodeport-ips gets the
// node's IPs inside nodePortAddresses (and never a loopback address).
func TestRenderDefaultsToTheNodeAddresses(t *testing.T) {
	for _, f := range model.Families {
		state := examples(f)
		cfg := testConfig(f)
		got, err := Render(state, cfg, RenderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want, err := Render(state, cfg, RenderOptions{LocalAddresses: state.Node.IPs})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%v: default local addresses are not the node's IPs:\n%s", f, cmp.Diff(want, got))
		}
		if ip := state.Node.IPsOf(f)[0].String(); !strings.Contains(got, "nodeport-ips { "+ip+" }") {
			t.Errorf("%v: @nodeport-ips lacks the node IP %s:\n%s", f, ip, got)
		}
	}
}

func TestRenderNamesServicesItCannotProgram(t *testing.T) {
	bad := svc("ns9", "bad", "p", model.Protocol("ICMP"), "172.30.0.99", 80).Endpoints("10.180.0.9:80").Build()
	good := svc("ns1", "good", "p", model.TCP, "172.30.0.1", 80).Endpoints("10.180.0.1:80").Build()
	got, err := Render(nodeState(model.IPv4, good, bad), testConfig(model.IPv4), RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "# ns1/good\n") {
		t.Errorf("the valid Service is missing:\n%s", got)
	}
	if !strings.HasSuffix(got, "# Service ns9/bad is not programmed: port \"p\"/ICMP: unsupported protocol \"ICMP\"\n") {
		t.Errorf("the refused Service is not named at the end:\n%s", got[max(0, len(got)-300):])
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	state := examples(model.IPv4)
	cases := append(fixture.BadRenderInputs(state),
		fixture.BadRenderInput{Name: "mark bit", State: state, Config: func(c *dataplane.Config) { c.MasqueradeBit = -1 }, Want: "masquerade bit -1"})
	fixture.WantRenderRefusals(t, testConfig(model.IPv4), cases, func(st *model.NodeState, cfg dataplane.Config) error {
		_, err := Render(st, cfg, RenderOptions{})
		return err
	})
}
