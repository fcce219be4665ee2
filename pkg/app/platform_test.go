package app

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// recordedSetup records the mode setup steps --init-only runs.
type recordedSetup struct {
	iptables []dataplane.Config
	ipvs     []ipvs.Settings
	err      error
}

func (r *recordedSetup) steps() modeSetupSteps {
	return modeSetupSteps{
		iptables: func(_ context.Context, cfg dataplane.Config) error {
			r.iptables = append(r.iptables, cfg)
			return r.err
		},
		ipvs: func(_ context.Context, s ipvs.Settings) error { r.ipvs = append(r.ipvs, s); return r.err },
	}
}

func TestInitOnlyDoesTheConfiguredModesSetup(t *testing.T) {
	dual := []model.IPFamily{model.IPv4, model.IPv6}
	ipvsConfig := config.IPVSSettings{Scheduler: "mh", StrictARP: true, TCPTimeout: 900 * time.Second}
	for _, tc := range []struct {
		name              string
		effective         config.Effective
		wantIPTables      int
		wantLocalhostIPv4 bool
		wantIPVS          bool
	}{
		{name: "iptables: each family, localhost NodePorts on IPv4",
			effective:    config.Effective{Mode: dataplane.ModeIPTables, LocalhostNodePorts: true},
			wantIPTables: 2, wantLocalhostIPv4: true},
		{name: "iptables without localhost NodePorts",
			effective:    config.Effective{Mode: dataplane.ModeIPTables, LocalhostNodePorts: false},
			wantIPTables: 2},
		{name: "iptables with nodePortAddresses primary and no Node: NodePorts everywhere",
			effective:    config.Effective{Mode: dataplane.ModeIPTables, LocalhostNodePorts: true, NodePortAddresses: []string{"primary"}},
			wantIPTables: 2, wantLocalhostIPv4: true},
		{name: "ipvs: its settings, once",
			effective: config.Effective{Mode: dataplane.ModeIPVS, LocalhostNodePorts: true, IPVS: ipvsConfig},
			wantIPVS:  true},
		{name: "nftables: nothing beyond platformSetup",
			effective: config.Effective{Mode: dataplane.ModeNFTables, LocalhostNodePorts: true}},
		{name: "recording: nothing",
			effective: config.Effective{Mode: dataplane.ModeRecording}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recordedSetup
			if err := modeSetup(context.Background(), tc.effective.Mode, &tc.effective, dual, r.steps()); err != nil {
				t.Fatal(err)
			}
			if len(r.iptables) != tc.wantIPTables {
				t.Fatalf("iptables setup ran for %d families, want %d", len(r.iptables), tc.wantIPTables)
			}
			for _, cfg := range r.iptables {
				want := tc.wantLocalhostIPv4 && cfg.Family == model.IPv4
				if got := cfg.LocalhostNodePorts && cfg.NodePortAddresses.MatchAll; got != want {
					t.Errorf("%s: localhost NodePorts %v (config %+v), want %v", cfg.Family, got, cfg, want)
				}
			}
			if got := len(r.ipvs) == 1; got != tc.wantIPVS || len(r.ipvs) > 1 {
				t.Fatalf("ipvs setup ran %d times, want it %v (once)", len(r.ipvs), tc.wantIPVS)
			}
			if tc.wantIPVS {
				s := r.ipvs[0]
				if s.Scheduler != "mh" || !s.StrictARP || s.TCPTimeout != 900*time.Second {
					t.Errorf("ipvs settings %+v do not carry the configuration %+v", s, ipvsConfig)
				}
			}
		})
	}
}

func TestInitOnlyReportsTheModesFailure(t *testing.T) {
	r := recordedSetup{err: errors.New("kernel has no IPVS")}
	e := config.Effective{Mode: dataplane.ModeIPVS}
	err := modeSetup(context.Background(), e.Mode, &e, []model.IPFamily{model.IPv4}, r.steps())
	if err == nil || !strings.Contains(err.Error(), "ipvs mode setup: kernel has no IPVS") {
		t.Fatalf("modeSetup = %v, want the ipvs failure", err)
	}
}
