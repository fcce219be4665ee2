package config

import (
	"os"
	"testing"
)

func TestCheckNamesEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{name: "unknown and duplicate fields beside invalid values",
			in: header + "mode: nftables\nmode: nftables\nnftables:\n  syncPerod: 1s\n  masqueradeBit: 40\noomScoreAdj: 5000\n",
			want: []string{`duplicate field "mode"`, `unknown field "nftables.syncPerod"`,
				"nftables.masqueradeBit: Invalid value: 40", "oomScoreAdj: Invalid value: 5000"}},
		{name: "values of the wrong type and unknown fields",
			in:   header + "bogus: 1\nclientConnection:\n  burst: many\nconntrack:\n  tcpCloseWaitTimeout: soon\n",
			want: []string{`unknown field "bogus"`, `clientConnection.burst: invalid value "many"`, `conntrack.tcpCloseWaitTimeout: invalid value "soon"`}},
		{name: "invalid values only",
			in:   header + "mode: userspace\ndetectLocalMode: BridgeInterface\n",
			want: []string{`mode: Unsupported value: "userspace"`, "detectLocal.bridgeInterface: Required value"}},
		{name: "wrong kind",
			in:   "apiVersion: v1\nkind: ConfigMap\n",
			want: []string{`apiVersion: unsupported value "v1"`, `kind: unsupported value "ConfigMap"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check([]byte(tt.in))
			if r.OK() || r.Effective != nil {
				t.Fatalf("Check passed: %+v", r)
			}
			if len(r.Problems) != len(tt.want) {
				t.Errorf("%d problems, want %d: %q", len(r.Problems), len(tt.want), r.Problems)
			}
			wantMentioned(t, r.Problems, tt.want)
		})
	}
}

func TestCheckPassesACleanFileWithItsEffectiveValues(t *testing.T) {
	r := Check([]byte(header + "mode: nftables\nnftables:\n  syncPeriod: 10s\nfeatureGates:\n  SomeOtherComponentsGate: true\n"))
	if !r.OK() {
		t.Fatalf("problems: %q", r.Problems)
	}
	if r.Effective == nil || r.Effective.Mode != "nftables" || r.Effective.SyncPeriod.String() != "10s" ||
		r.Effective.DetectLocalMode != "ClusterCIDR" || len(r.Effective.NodePortAddresses) != 1 {
		t.Errorf("effective: %+v", r.Effective)
	}
	// A gate sluice does not know is not a problem (upstream accepts every Kubernetes
	// gate), but it is named.
	if len(r.IgnoredFeatureGates) != 1 || r.IgnoredFeatureGates[0] != "SomeOtherComponentsGate" {
		t.Errorf("ignored gates: %v", r.IgnoredFeatureGates)
	}
}

func TestCheckAcceptsKubeadmsConfigMap(t *testing.T) {
	data, err := os.ReadFile(kubeadmFixture)
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(data); !r.OK() {
		t.Errorf("kubeadm's config.conf: %q", r.Problems)
	}
}
