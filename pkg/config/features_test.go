package config

import (
	"slices"
	"testing"

	"k8s.io/component-base/featuregate"

	"github.com/sluiceproxy/sluice/test/errtest"
)

func TestFeatureGateDefaultsAt137(t *testing.T) {
	tests := []struct {
		gate     featuregate.Feature
		enabled  bool
		locked   bool
		maturity any // a featuregate prerelease constant (its type is unexported)
	}{
		{KubeProxyIPVS, true, false, featuregate.Deprecated},
		{KubeProxyNFTablesLocalhostNodePorts, false, false, featuregate.Alpha},
		{NFTablesNetlink, true, false, featuregate.Beta},
		{PreferSameTrafficDistribution, true, true, featuregate.GA},
		{AllowServiceExternalIPs, true, false, featuregate.GA},
		{MultiCIDRServiceAllocator, true, true, featuregate.GA},
		// component-base gates every Kubernetes binary has
		{"ContextualLogging", true, false, featuregate.Beta},
		{"LoggingAlphaOptions", false, false, featuregate.Alpha},
		{"LoggingBetaOptions", true, false, featuregate.Beta},
		{"NativeHistograms", true, false, featuregate.Beta},
		{"ComponentFlagz", true, false, featuregate.Beta},
		{"ComponentStatusz", true, false, featuregate.Beta},
	}
	gate := NewFeatureGate()
	all := gate.GetAll()
	for _, tt := range tests {
		spec, known := all[tt.gate]
		if !known {
			t.Errorf("%s is not registered", tt.gate)
			continue
		}
		if gate.Enabled(tt.gate) != tt.enabled || spec.LockToDefault != tt.locked || any(spec.PreRelease) != tt.maturity {
			t.Errorf("%s: enabled=%v locked=%v maturity=%s; want %v %v %s",
				tt.gate, gate.Enabled(tt.gate), spec.LockToDefault, spec.PreRelease, tt.enabled, tt.locked, tt.maturity)
		}
	}
}

func TestSetFeatureGates(t *testing.T) {
	tests := []struct {
		name        string
		in          map[string]bool
		wantErr     string
		check       featuregate.Feature
		want        bool
		wantIgnored []string
	}{
		{name: "alpha gate turned on", in: map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true},
			check: KubeProxyNFTablesLocalhostNodePorts, want: true},
		{name: "deprecated gate turned off", in: map[string]bool{"KubeProxyIPVS": false},
			check: KubeProxyIPVS, want: false},
		{name: "unlocked GA gate turned off", in: map[string]bool{"AllowServiceExternalIPs": false},
			check: AllowServiceExternalIPs, want: false},
		{name: "locked gate cannot change", in: map[string]bool{"MultiCIDRServiceAllocator": false},
			wantErr: "locked to true", check: MultiCIDRServiceAllocator, want: true},
		{name: "another component's gate is ignored, as upstream's full registry accepts it",
			in:    map[string]bool{"InPlacePodVerticalScaling": true, "NFTablesNetlink": false},
			check: NFTablesNetlink, want: false, wantIgnored: []string{"InPlacePodVerticalScaling"}},
		{name: "a misspelt gate is ignored and reported", in: map[string]bool{"KubeProxyIPVs": false},
			check: KubeProxyIPVS, want: true, wantIgnored: []string{"KubeProxyIPVs"}},
		{name: "a failed map leaves the defaults", in: map[string]bool{"NFTablesNetlink": false, "MultiCIDRServiceAllocator": false},
			wantErr: "locked to true", check: NFTablesNetlink, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate, ignored, err := setFeatureGates(tt.in)
			if !slices.Equal(ignored, tt.wantIgnored) {
				t.Errorf("ignored = %v, want %v", ignored, tt.wantIgnored)
			}
			// A failed map still answers (with the defaults), so a row goes on either way.
			errtest.Want(t, err, tt.wantErr)
			if gate.Enabled(tt.check) != tt.want {
				t.Errorf("%s enabled = %v, want %v", tt.check, gate.Enabled(tt.check), tt.want)
			}
		})
	}
}

func TestFeatureGateSetsAreIndependent(t *testing.T) {
	a, b := NewFeatureGate(), NewFeatureGate()
	if err := a.SetFromMap(map[string]bool{"KubeProxyIPVS": false}); err != nil {
		t.Fatal(err)
	}
	if !b.Enabled(KubeProxyIPVS) {
		t.Errorf("changing one gate set changed another")
	}
}
