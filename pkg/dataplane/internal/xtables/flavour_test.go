package xtables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// scriptedCommander says which flavour `iptables --version` reports and which programs
// exist, answers restores with a fixed outcome, and records the runs.
type scriptedCommander struct {
	installed Flavour
	missing   []string
	restore   func(stdin []byte) (stderr string, err error)
	runs      []string
}

func (c *scriptedCommander) Run(_ context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	c.runs = append(c.runs, name+" "+strings.Join(args, " "))
	switch {
	case slices.Contains(args, "--version"):
		if c.installed == "" {
			return nil, []byte("not found"), ErrExit
		}
		return []byte(fmt.Sprintf("iptables v1.8.9 (%s)\n", map[Flavour]string{NFT: "nf_tables", Legacy: "legacy"}[c.installed])), nil, nil
	case strings.HasSuffix(name, "-restore") && c.restore != nil:
		stderr, err := c.restore(stdin)
		return nil, []byte(stderr), err
	}
	return nil, nil, nil
}

func (c *scriptedCommander) LookPath(name string) (string, error) {
	if slices.Contains(c.missing, name) {
		return "", errors.New("not found")
	}
	return "/usr/sbin/" + name, nil
}

// scriptedProbe answers from tables of chains per flavour; a flavour without an entry is
// not in use.
type scriptedProbe map[Flavour]map[string]map[string]bool

func (p scriptedProbe) InUse(t *Tools) bool { return p[t.Flavour] != nil }
func (p scriptedProbe) Chains(_ context.Context, t *Tools) (map[string]map[string]bool, error) {
	return p[t.Flavour], nil
}

// chains returns n chains in filter, plus the named ones in mangle.
func chains(n int, mangle ...string) map[string]map[string]bool {
	out := map[string]map[string]bool{TableFilter: {}, TableMangle: {}}
	for i := range n {
		out[TableFilter][fmt.Sprintf("C%d", i)] = true
	}
	for _, c := range mangle {
		out[TableMangle][c] = true
	}
	return out
}

func TestChooseFollowsKubeletThenChainCountThenInstalled(t *testing.T) {
	tests := []struct {
		name       string
		installed  Flavour
		missing    []string
		probe      scriptedProbe
		configured Flavour
		want       Flavour
		wantTools  string
	}{
		{name: "nothing anywhere: installed", installed: NFT, probe: scriptedProbe{}, want: NFT, wantTools: "iptables-restore"},
		{name: "kubelet's hint in legacy wins over installed nft and more chains", installed: NFT,
			probe: scriptedProbe{Legacy: chains(2, "KUBE-IPTABLES-HINT"), NFT: chains(100)}, want: Legacy, wantTools: "iptables-legacy-restore"},
		{name: "kubelet's canary counts as the hint", installed: Legacy,
			probe: scriptedProbe{Legacy: chains(50), NFT: chains(1, "KUBE-KUBELET-CANARY")}, want: NFT, wantTools: "iptables-nft-restore"},
		{name: "both hold the hint: nft", installed: Legacy,
			probe: scriptedProbe{Legacy: chains(50, "KUBE-IPTABLES-HINT"), NFT: chains(1, "KUBE-IPTABLES-HINT")}, want: NFT},
		{name: "more chains in legacy", installed: NFT, probe: scriptedProbe{Legacy: chains(40), NFT: chains(12)}, want: Legacy},
		{name: "more chains in nft", installed: Legacy, probe: scriptedProbe{Legacy: chains(3), NFT: chains(12)}, want: NFT},
		{name: "a flavour without programs does not count", installed: Legacy, missing: []string{"iptables-nft-save"},
			probe: scriptedProbe{Legacy: chains(3), NFT: chains(12, "KUBE-IPTABLES-HINT")}, want: Legacy},
		{name: "configured wins", installed: NFT, probe: scriptedProbe{NFT: chains(1, "KUBE-IPTABLES-HINT")}, configured: Legacy, want: Legacy},
		{name: "configured, iptables unknown: the flavour's own programs", probe: scriptedProbe{}, configured: NFT, want: NFT,
			wantTools: "iptables-nft-restore"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := &scriptedCommander{installed: tc.installed, missing: tc.missing}
			tools, choice, err := Choose(context.Background(), cmd, tc.probe, model.IPv4, tc.configured)
			if err != nil {
				t.Fatal(err)
			}
			if choice.Flavour != tc.want || tools.Flavour != tc.want {
				t.Errorf("flavour %s (%s), want %s", choice.Flavour, choice.Reason, tc.want)
			}
			if tc.wantTools != "" && tools.RestoreProgram != tc.wantTools {
				t.Errorf("restore program %s, want %s", tools.RestoreProgram, tc.wantTools)
			}
		})
	}
}

func TestChooseFailsWithoutPrograms(t *testing.T) {
	for name, cmd := range map[string]*scriptedCommander{
		"no iptables at all":                      {},
		"the chosen flavour's restore is missing": {installed: NFT, missing: []string{"iptables-restore"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := Choose(context.Background(), cmd, scriptedProbe{}, model.IPv4, ""); err == nil {
				t.Error("no error")
			}
		})
	}
}

func TestHasChains(t *testing.T) {
	p := scriptedProbe{NFT: {TableNAT: {"KUBE-SVC-X": true}}, Legacy: chains(3, "KUBE-KUBELET-CANARY")}
	for f, want := range map[Flavour]bool{NFT: true, Legacy: false} {
		if got, err := HasChains(context.Background(), p, NewTools(nil, model.IPv4, f, NFT), KubeProxyChain); err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", f, got, err, want)
		}
	}
}

func TestToolsInUseAreTheInstalledFlavoursWithTables(t *testing.T) {
	both := scriptedProbe{NFT: chains(1), Legacy: chains(1)}
	for _, tc := range []struct {
		name  string
		cmd   *scriptedCommander
		probe scriptedProbe
		want  []string // restore programs, in order
	}{
		{"both in use: legacy first, the installed one by its plain name",
			&scriptedCommander{installed: NFT}, both, []string{"iptables-legacy-restore", "iptables-restore"}},
		{"only the flavour with tables",
			&scriptedCommander{installed: Legacy}, scriptedProbe{NFT: chains(0)}, []string{"iptables-nft-restore"}},
		{"a flavour without its programs is left out",
			&scriptedCommander{installed: NFT, missing: []string{"iptables-legacy-save"}}, both, []string{"iptables-restore"}},
		{"`iptables --version` failing: each flavour by its own names",
			&scriptedCommander{}, both, []string{"iptables-legacy-restore", "iptables-nft-restore"}},
		{"nothing in use", &scriptedCommander{installed: NFT}, scriptedProbe{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tools := range ToolsInUse(context.Background(), tc.cmd, tc.probe, model.IPv4) {
				got = append(got, tools.RestoreProgram)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestToolNames(t *testing.T) {
	tests := []struct {
		family             model.IPFamily
		flavour, installed Flavour
		want               string
	}{
		{model.IPv4, NFT, NFT, "iptables-restore"},
		{model.IPv4, Legacy, NFT, "iptables-legacy-restore"},
		{model.IPv6, NFT, Legacy, "ip6tables-nft-restore"},
		{model.IPv6, Legacy, "", "ip6tables-legacy-restore"},
	}
	for _, tc := range tests {
		if _, got, _ := ToolNames(tc.family, tc.flavour, tc.installed); got != tc.want {
			t.Errorf("ToolNames(%v, %s, %s) = %s, want %s", tc.family, tc.flavour, tc.installed, got, tc.want)
		}
	}
	if NFT.Other() != Legacy || Legacy.Other() != NFT {
		t.Error("Other")
	}
}

func TestRestoreErrorsNameTheLinesTheProgramBlames(t *testing.T) {
	tests := []struct {
		out  string
		want []int
	}{
		{"iptables-restore v1.8.9 (legacy): Couldn't load target `KUBE-X':No such file or directory\n\nError occurred at line: 4\nTry `iptables-restore -h'", []int{4}},
		{"iptables-restore: line 8 failed", []int{8}},
		{"iptables-nft-restore v1.8.9 (nf_tables): \nline 6: RULE_APPEND failed (Invalid argument): rule in chain KUBE-T2\nline 7: RULE_APPEND failed (Invalid argument): rule in chain KUBE-T1", []int{6, 7}},
		{"Another app is currently holding the xtables lock.", nil},
	}
	for _, tc := range tests {
		cmd := &scriptedCommander{restore: func([]byte) (string, error) { return tc.out, ErrExit }}
		err := NewTools(cmd, model.IPv4, Legacy, Legacy).Restore(context.Background(), []byte("*nat\nCOMMIT\n"))
		var re *RestoreError
		if !errors.As(err, &re) {
			t.Fatalf("%q: error %v is no *RestoreError", tc.out, err)
		}
		if !slices.Equal(re.Lines, tc.want) {
			t.Errorf("%q: lines %v, want %v", tc.out, re.Lines, tc.want)
		}
		if len(tc.want) == 0 && !strings.Contains(err.Error(), "failed: Another app") {
			t.Errorf("error %q does not say what happened", err)
		}
	}
	cmd := &scriptedCommander{restore: func([]byte) (string, error) { return "", errors.New("fork failed") }}
	if err := NewTools(cmd, model.IPv4, Legacy, Legacy).Restore(context.Background(), nil); err == nil || errors.As(err, new(*RestoreError)) {
		t.Errorf("a program that did not run: %v, want a plain error", err)
	}
	ok := &scriptedCommander{restore: func([]byte) (string, error) { return "", nil }}
	if err := NewTools(ok, model.IPv4, Legacy, Legacy).Restore(context.Background(), nil); err != nil {
		t.Error(err)
	}
	if got := strings.Join(ok.runs, ";"); got != "iptables-restore --noflush --counters --wait 30" {
		t.Errorf("ran %q", got)
	}
}
