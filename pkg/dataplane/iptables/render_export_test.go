package iptables

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/countertest"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// commandLog is the fake kernel's ruleEditor that also writes down, as iptables command
// lines, the chains and rules the backend adds imperatively.
type commandLog struct {
	*fakeKernel
	program string
	lines   []string
}

func (c *commandLog) NewChain(table, chain string) error {
	err := c.fakeKernel.NewChain(table, chain)
	if err == nil {
		c.lines = append(c.lines, c.program+" -t "+table+" -N "+chain)
	}
	return err
}

func (c *commandLog) Insert(table, chain string, pos int, spec ...string) error {
	err := c.fakeKernel.Insert(table, chain, pos, spec...)
	if err == nil {
		c.lines = append(c.lines, c.program+" -t "+table+" -I "+chain+" "+itoa(pos)+" "+shellArgs(spec))
	}
	return err
}

// splitRender separates Render's output into its command comments and the restore input.
func splitRender(t *testing.T, text string) (commands []string, restore string) {
	t.Helper()
	var b strings.Builder
	for _, l := range splitLines(text) {
		if cmd, ok := strings.CutPrefix(l, "#   "); ok {
			commands = append(commands, cmd)
			continue
		}
		if strings.HasPrefix(l, "#") {
			continue
		}
		b.WriteString(l + "\n")
	}
	return commands, b.String()
}

// TestRenderIsWhatAFullSyncProgramsOnAnEmptyKernel: Render shows, for every configuration,
// exactly the commands and the restore input that the backend's first full sync runs
// against an empty kernel, in both flavours.
func TestRenderIsWhatAFullSyncProgramsOnAnEmptyKernel(t *testing.T) {
	tests := []struct {
		name   string
		family model.IPFamily
		cfg    func(*dataplane.Config)
		opts   RenderOptions
		// backend are the options that give the backend the node facts opts describe.
		backend []Option
		// counted: every Service's traffic counted (the packet counters in mangle).
		counted bool
	}{
		{name: "IPv4 defaults", family: model.IPv4},
		{name: "IPv6", family: model.IPv6},
		{name: "IPv4, every Service counted", family: model.IPv4, counted: true},
		{name: "IPv6, every Service counted", family: model.IPv6, counted: true},
		{name: "nodePortAddresses, interface prefix, masqueradeAll", family: model.IPv4,
			cfg: func(c *dataplane.Config) {
				c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{mustPrefix("192.168.0.0/24"), mustPrefix("127.0.0.0/8")}}
				c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalInterfaceNamePrefix, Interface: "veth"}
				c.MasqueradeAll = true
			}},
		{name: "nodePortAddresses with explicit local addresses", family: model.IPv4,
			cfg: func(c *dataplane.Config) {
				c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{mustPrefix("192.168.0.0/16")}}
			},
			opts: RenderOptions{LocalAddresses: []netip.Addr{netipAddr("192.168.7.7"), netipAddr("192.168.0.2"), netipAddr("10.9.9.9")}},
			backend: []Option{WithLocalAddresses(func() ([]netip.Addr, error) {
				return []netip.Addr{netipAddr("192.168.7.7"), netipAddr("192.168.0.2"), netipAddr("10.9.9.9")}, nil
			})}},
		{name: "no local detector, localhost NodePorts off", family: model.IPv4,
			cfg: func(c *dataplane.Config) { c.LocalDetector = dataplane.LocalDetector{}; c.LocalhostNodePorts = false }},
		{name: "tcp_be_liberal", family: model.IPv4, opts: RenderOptions{TCPBeLiberal: true},
			backend: []Option{WithSysctls(fakeSysctl{sysctlTCPBeLiberal: 1})}},
		{name: "nfacct", family: model.IPv4, opts: RenderOptions{NFAcct: true},
			backend: []Option{withNFAcct(scriptedNFAcct{})}},
	}
	for _, tc := range tests {
		for _, flavour := range []Flavour{FlavourLegacy, FlavourNFT} {
			t.Run(tc.name+"/"+string(flavour), func(t *testing.T) {
				cfg := testConfig(tc.family)
				if tc.cfg != nil {
					tc.cfg(&cfg)
				}
				state := featureWorld().state(tc.family)
				if tc.counted {
					state = countertest.Counted(state)
				}

				k := newFakeKernel(flavour)
				program := "iptables"
				if tc.family == model.IPv6 {
					program = "ip6tables"
				}
				log := &commandLog{fakeKernel: k, program: program}
				b, _, _ := newTestBackend(t, cfg, flavour, append([]Option{withCommander(k), withEditor(log)}, tc.backend...)...)
				mustApply(t, b, state, full())
				if len(k.restores) != 1 {
					t.Fatalf("the full sync ran %d restores, want 1", len(k.restores))
				}

				text, err := Render(state, cfg, tc.opts)
				if err != nil {
					t.Fatalf("Render: %v", err)
				}
				commands, restore := splitRender(t, text)
				if restore != k.restores[0] {
					t.Errorf("Render's restore input differs from the full sync's:\n%s", lineDiff(k.restores[0], restore))
				}
				if got, want := strings.Join(commands, "\n"), strings.Join(log.lines, "\n"); got != want {
					t.Errorf("Render's commands differ from what the full sync ran:\n%s", lineDiff(want, got))
				}
			})
		}
	}
}

// TestRenderRestoreInputIsTheGoldenFullSync ties Render to the reviewed golden ruleset.
func TestRenderRestoreInputIsTheGoldenFullSync(t *testing.T) {
	text, err := Render(featureWorld().state(model.IPv4), testConfig(model.IPv4), RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, restore := splitRender(t, text)
	want, err := os.ReadFile(filepath.Join("testdata", "full-ipv4.golden"))
	if err != nil {
		t.Fatal(err)
	}
	if restore != string(want) {
		t.Errorf("Render differs from testdata/full-ipv4.golden:\n%s", lineDiff(string(want), restore))
	}
	if !strings.HasPrefix(text, "# Before the restore") || !strings.Contains(text, "#   iptables -t nat -I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n") {
		t.Errorf("Render does not show the jump rules:\n%s", text)
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	state := featureWorld().state(model.IPv4)
	cases := append(fixture.BadRenderInputs(state),
		fixture.BadRenderInput{Name: "mark bit", State: state, Config: func(c *dataplane.Config) { c.MasqueradeBit = 32 }, Want: "masquerade bit 32"})
	fixture.WantRenderRefusals(t, testConfig(model.IPv4), cases, func(st *model.NodeState, cfg dataplane.Config) error {
		_, err := Render(st, cfg, RenderOptions{})
		return err
	})
}
