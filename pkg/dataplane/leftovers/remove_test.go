package leftovers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// fakeKernelState records what was removed of the kernel state besides chains.
type fakeKernelState struct{ calls []string }

func (k *fakeKernelState) deleteNFTablesTable(f model.IPFamily) (bool, error) {
	k.calls = append(k.calls, "nftables table "+f.String())
	return true, nil
}
func (k *fakeKernelState) removeIPVSServersAndDevice() (bool, error) {
	k.calls = append(k.calls, "ipvs")
	return true, nil
}
func (k *fakeKernelState) destroyIPVSIPSets(f model.IPFamily) (int, error) {
	k.calls = append(k.calls, "ipsets "+f.String())
	return 1, nil
}

// fakeFlavours holds iptables-save output per flavour (nft is the installed one) and
// records the restores.
type fakeFlavours struct {
	saved    map[xtables.Flavour]string
	restores map[xtables.Flavour][]string
}

func flavourOf(program string) xtables.Flavour {
	if strings.Contains(program, "-legacy-") {
		return xtables.Legacy
	}
	return xtables.NFT
}

func (k *fakeFlavours) Run(_ context.Context, name string, args []string, stdin []byte) ([]byte, []byte, error) {
	switch {
	case slices.Contains(args, "--version"):
		return []byte("iptables v1.8.9 (nf_tables)\n"), nil, nil
	case strings.HasSuffix(name, "-save"):
		return []byte(k.saved[flavourOf(name)]), nil, nil
	case strings.HasSuffix(name, "-restore"):
		k.restores[flavourOf(name)] = append(k.restores[flavourOf(name)], string(stdin))
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("unknown program %s", name)
}

func (k *fakeFlavours) LookPath(name string) (string, error) { return "/usr/sbin/" + name, nil }

func (k *fakeFlavours) InUse(t *xtables.Tools) bool { return k.saved[t.Flavour] != "" }

func (k *fakeFlavours) Chains(_ context.Context, t *xtables.Tools) (map[string]map[string]bool, error) {
	saved, err := xtables.ParseSave([]byte(k.saved[t.Flavour]))
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]bool{}
	for name, table := range saved {
		out[name] = table.ChainSet()
	}
	return out, nil
}

// In both flavours: the iptables mode's KUBE-SERVICES (nat) and the ipvs mode's
// KUBE-IPVS-FILTER (filter), each with its jump.
const bothModes = `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -j KUBE-SERVICES
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -j KUBE-IPVS-FILTER
COMMIT
`

const (
	unlinkAll  = "*filter\n:KUBE-IPVS-FILTER - [0:0]\n-D INPUT -j KUBE-IPVS-FILTER\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-D PREROUTING -j KUBE-SERVICES\nCOMMIT\n"
	deleteAll  = "*filter\n-X KUBE-IPVS-FILTER\nCOMMIT\n*nat\n-X KUBE-SERVICES\nCOMMIT\n"
	unlinkIPVS = "*filter\n:KUBE-IPVS-FILTER - [0:0]\n-D INPUT -j KUBE-IPVS-FILTER\nCOMMIT\n"
	deleteIPVS = "*filter\n-X KUBE-IPVS-FILTER\nCOMMIT\n"
)

func TestEachModeRemovesWhatTheOthersLeft(t *testing.T) {
	tests := []struct {
		mode     dataplane.Mode
		kernel   []string
		restores map[xtables.Flavour][]string
	}{
		{
			mode:   dataplane.ModeIPTables,
			kernel: []string{"nftables table IPv4", "ipvs", "ipsets IPv4"},
			restores: map[xtables.Flavour][]string{
				xtables.Legacy: {unlinkAll, deleteAll},
				// In its own flavour, only the ipvs mode's chains: KUBE-SERVICES is its own.
				xtables.NFT: {unlinkIPVS, deleteIPVS},
			},
		},
		{
			mode:   dataplane.ModeIPVS,
			kernel: []string{"nftables table IPv4"},
			// Its own flavour's iptables-mode chains went in its first full sync.
			restores: map[xtables.Flavour][]string{xtables.Legacy: {unlinkAll, deleteAll}},
		},
		{
			mode:     dataplane.ModeNFTables,
			kernel:   []string{"ipvs", "ipsets IPv4"},
			restores: map[xtables.Flavour][]string{xtables.Legacy: {unlinkAll, deleteAll}, xtables.NFT: {unlinkAll, deleteAll}},
		},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			k := &fakeKernelState{}
			fl := &fakeFlavours{saved: map[xtables.Flavour]string{xtables.Legacy: bothModes, xtables.NFT: bothModes}, restores: map[xtables.Flavour][]string{}}
			var own *xtables.Tools
			if tc.mode != dataplane.ModeNFTables {
				own = xtables.NewTools(fl, model.IPv4, xtables.NFT, xtables.NFT)
			}
			r := &remover{mode: tc.mode, family: model.IPv4, own: own, cmd: fl, probe: fl, kernel: k, logger: klog.Background()}
			if err := r.run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.kernel, k.calls); diff != "" {
				t.Errorf("kernel state removed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.restores, fl.restores); diff != "" {
				t.Errorf("restores (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNothingToRemoveWritesNothing(t *testing.T) {
	fl := &fakeFlavours{saved: map[xtables.Flavour]string{xtables.Legacy: "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n"},
		restores: map[xtables.Flavour][]string{}}
	r := &remover{mode: dataplane.ModeNFTables, family: model.IPv6, cmd: fl, probe: fl, kernel: &fakeKernelState{}, logger: klog.Background()}
	if err := r.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(fl.restores) != 0 {
		t.Errorf("restores %v, want none (kubelet's chain is not kube-proxy's)", fl.restores)
	}
}
