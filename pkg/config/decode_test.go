package config

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func TestDecodeRejectsWithFieldPaths(t *testing.T) {
	tests := []struct {
		name string
		in   string
		// wantProblems must each appear in one of the reported problems.
		wantProblems []string
	}{
		{name: "unknown top-level field",
			in:           header + "mdoe: nftables\n",
			wantProblems: []string{`unknown field "mdoe"`}},
		{name: "nested unknown field",
			in:           header + "iptables:\n  syncPerod: 10s\n",
			wantProblems: []string{`unknown field "iptables.syncPerod"`}},
		{name: "field names are case-sensitive",
			in:           header + "IPTables: {}\n",
			wantProblems: []string{`unknown field "IPTables"`}},
		{name: "every unknown field is reported",
			in:           header + "foo: 1\nconntrack:\n  maxPerCpu: 5\ndetectLocal:\n  bridge: br0\n",
			wantProblems: []string{`unknown field "foo"`, `unknown field "conntrack.maxPerCpu"`, `unknown field "detectLocal.bridge"`}},
		{name: "duplicate field",
			in:           header + "mode: iptables\nmode: nftables\n",
			wantProblems: []string{`duplicate field "mode"`}},
		{name: "nested duplicate field",
			in:           header + "iptables:\n  syncPeriod: 10s\n  syncPeriod: 20s\n",
			wantProblems: []string{`duplicate field "iptables.syncPeriod"`}},
		{name: "duplicate field and wrong type together",
			in:           header + "mode: iptables\nmode: nftables\nclientConnection:\n  burst: many\n",
			wantProblems: []string{`duplicate field "mode"`, `clientConnection.burst: invalid value "many"`}},
		{name: "wrong type for an integer",
			in:           header + "iptables:\n  masqueradeBit: fourteen\n",
			wantProblems: []string{`iptables.masqueradeBit: invalid value "fourteen": expected an integer`}},
		{name: "wrong type for a duration",
			in:           header + "nftables:\n  syncPeriod: 30\n",
			wantProblems: []string{`nftables.syncPeriod: invalid value 30: expected a duration`}},
		{name: "unparsable duration",
			in:           header + "conntrack:\n  tcpCloseWaitTimeout: soon\n",
			wantProblems: []string{`conntrack.tcpCloseWaitTimeout: invalid value "soon": expected a duration`}},
		{name: "string where a list belongs",
			in:           header + "nodePortAddresses: primary\n",
			wantProblems: []string{`nodePortAddresses: invalid value "primary": expected a list, got string`}},
		{name: "wrong type inside a list and a map",
			in:           header + "ipvs:\n  excludeCIDRs: [10.0.0.0/8, 7]\nfeatureGates:\n  KubeProxyIPVS: maybe\n",
			wantProblems: []string{`ipvs.excludeCIDRs[1]: invalid value 7`, `featureGates[KubeProxyIPVS]: invalid value "maybe": expected a boolean`}},
		{name: "bad quantity in logging options",
			in:           header + "logging:\n  options:\n    text:\n      infoBufferSize: lots\n",
			wantProblems: []string{`logging.options.text.infoBufferSize: invalid value "lots"`}},
		{name: "unknown field and wrong type together",
			in:           header + "bogus: true\nclientConnection:\n  burst: many\n",
			wantProblems: []string{`unknown field "bogus"`, `clientConnection.burst: invalid value "many"`}},
		{name: "wrong kind",
			in:           "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
			wantProblems: []string{`kind: unsupported value "KubeletConfiguration", must be "KubeProxyConfiguration"`}},
		{name: "wrong apiVersion",
			in:           "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
			wantProblems: []string{`apiVersion: unsupported value "kubeproxy.config.k8s.io/v1beta1", must be "kubeproxy.config.k8s.io/v1alpha1"`}},
		{name: "missing apiVersion and kind",
			in:           "mode: iptables\n",
			wantProblems: []string{`apiVersion: missing`, `kind: missing`}},
		{name: "not YAML",
			in:           header + "mode: [unclosed\n",
			wantProblems: []string{"not valid YAML or JSON"}},
		{name: "not an object",
			in:           "- mode\n",
			wantProblems: []string{"must be a YAML or JSON object"}},
		{name: "JSON with an unknown field",
			in:           `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "ipvs": {"shceduler": "rr"}}`,
			wantProblems: []string{`unknown field "ipvs.shceduler"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tt.in))
			if err == nil {
				t.Fatalf("Decode accepted it: %+v", cfg)
			}
			var decodeErr *DecodeError
			if !errors.As(err, &decodeErr) {
				t.Fatalf("error is %T, want *DecodeError: %v", err, err)
			}
			wantMentioned(t, decodeErr.Problems, tt.wantProblems)
		})
	}
}

func TestDecodeAcceptsYAMLAndJSON(t *testing.T) {
	for name, in := range map[string]string{
		"yaml": header + "mode: nftables\nnftables:\n  syncPeriod: 10s\nnodePortAddresses: [primary, localhost]\n",
		"json": `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
			"mode": "nftables", "nftables": {"syncPeriod": "10s"}, "nodePortAddresses": ["primary", "localhost"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Decode([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Mode != "nftables" || cfg.NFTables.SyncPeriod.Duration != 10*time.Second || len(cfg.NodePortAddresses) != 2 {
				t.Errorf("decoded %+v", cfg)
			}
			// Decoding applies no defaults.
			if cfg.IPTables.SyncPeriod.Duration != 0 || cfg.IPTables.MasqueradeBit != nil {
				t.Errorf("Decode applied defaults: %+v", cfg.IPTables)
			}
		})
	}
}

func TestLoadFileNamesTheFile(t *testing.T) {
	path := writeConfig(t, "iptables:\n  syncPerod: 1s\n")
	_, err := LoadFile(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `unknown field "iptables.syncPerod"`) {
		t.Errorf("error %v should name %s and the field", err, path)
	}
	if _, err := LoadFile(path + ".missing"); err == nil {
		t.Errorf("missing file accepted")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cfg := NewDefaultConfiguration()
	cfg.Mode = "nftables"
	cfg.NodePortAddresses = []string{"primary", "10.0.0.0/8"}
	cfg.FeatureGates = map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true}
	data, err := Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n") || !strings.Contains(string(data), "\nkind: KubeProxyConfiguration\n") {
		t.Errorf("encoding lacks apiVersion/kind:\n%s", data)
	}
	back, err := Decode(data)
	if err != nil {
		t.Fatalf("decoding our own output: %v\n%s", err, data)
	}
	if !equalConfigs(cfg, back) {
		t.Errorf("round trip changed the configuration:\n%s", data)
	}
}

// Upstream v1.37 (cmd/kube-proxy/app loadConfig) decodes strictly, and when only
// strictness failed decodes again leniently and starts. sluice does the same, and names
// every field the lenient decode ignored or overrode.
func TestDecodeLenientStartsWhereUpstreamStarts(t *testing.T) {
	tests := []struct {
		name         string
		in           string
		wantWarnings []FieldWarning
		check        func(t *testing.T, cfg *v1alpha1.KubeProxyConfiguration)
	}{
		{name: "clean file: no warnings",
			in: header + "mode: nftables\n"},
		{name: "unknown fields are ignored",
			in:           header + "mode: nftables\nmdoe: ipvs\niptables:\n  syncPerod: 10s\n  syncPeriod: 20s\n",
			wantWarnings: []FieldWarning{{UnknownField, "mdoe"}, {UnknownField, "iptables.syncPerod"}},
			check: func(t *testing.T, cfg *v1alpha1.KubeProxyConfiguration) {
				if cfg.Mode != "nftables" || cfg.IPTables.SyncPeriod.Duration != 20*time.Second {
					t.Errorf("mode %q, iptables.syncPeriod %v", cfg.Mode, cfg.IPTables.SyncPeriod)
				}
			}},
		{name: "the last of duplicated keys wins, at any depth",
			in:           header + "mode: iptables\nmode: nftables\nnftables:\n  syncPeriod: 5s\n  syncPeriod: 7s\nfeatureGates:\n  NFTablesNetlink: true\n  NFTablesNetlink: false\n",
			wantWarnings: []FieldWarning{{DuplicateField, "mode"}, {DuplicateField, "nftables.syncPeriod"}, {DuplicateField, "featureGates[NFTablesNetlink]"}},
			check: func(t *testing.T, cfg *v1alpha1.KubeProxyConfiguration) {
				if cfg.Mode != "nftables" || cfg.NFTables.SyncPeriod.Duration != 7*time.Second || cfg.FeatureGates["NFTablesNetlink"] {
					t.Errorf("mode %q, nftables.syncPeriod %v, gates %v", cfg.Mode, cfg.NFTables.SyncPeriod, cfg.FeatureGates)
				}
			}},
		{name: "a duplicated unknown field is one warning",
			in:           header + "bogus: 1\nbogus: 2\n",
			wantWarnings: []FieldWarning{{UnknownField, "bogus"}}},
		{name: "unknown fields below an unknown field are not listed again",
			in:           header + "extra:\n  a: 1\n  a: 2\n",
			wantWarnings: []FieldWarning{{UnknownField, "extra"}}},
		{name: "warnings come in document order",
			in:           header + "zeta: 1\nconntrack:\n  maxPerCpu: 5\nalpha: 2\n",
			wantWarnings: []FieldWarning{{UnknownField, "zeta"}, {UnknownField, "conntrack.maxPerCpu"}, {UnknownField, "alpha"}}},
		{name: "inside lists",
			in:           header + "logging:\n  vmodule:\n  - filePattern: a*\n    verbosity: 2\n    verbosty: 3\n",
			wantWarnings: []FieldWarning{{UnknownField, "logging.vmodule[0].verbosty"}}},
		{name: "JSON",
			in:           `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "mode": "iptables", "mode": "nftables", "ipvs": {"shceduler": "rr"}}`,
			wantWarnings: []FieldWarning{{DuplicateField, "mode"}, {UnknownField, "ipvs.shceduler"}},
			check: func(t *testing.T, cfg *v1alpha1.KubeProxyConfiguration) {
				if cfg.Mode != "nftables" {
					t.Errorf("mode %q", cfg.Mode)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, warnings, err := DecodeLenient([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(warnings, tt.wantWarnings) {
				t.Errorf("warnings %v, want %v", warnings, tt.wantWarnings)
			}
			if tt.check != nil {
				tt.check(t, cfg)
			}
			// The strict decode refuses exactly what was warned about.
			_, strictErr := Decode([]byte(tt.in))
			if (strictErr != nil) != (len(tt.wantWarnings) > 0) {
				t.Errorf("Decode: %v", strictErr)
			}
			for _, w := range tt.wantWarnings {
				if strictErr != nil && !strings.Contains(strictErr.Error(), strconv.Quote(w.Path)) {
					t.Errorf("Decode's error %v does not name %s", strictErr, w.Path)
				}
			}
		})
	}
}

// What upstream refuses even leniently stays an error, with every problem named.
func TestDecodeLenientRefusesWhatUpstreamRefuses(t *testing.T) {
	for name, tt := range map[string]struct{ in, want string }{
		"wrong type":           {header + "bogus: 1\nclientConnection:\n  burst: many\n", `clientConnection.burst: invalid value "many"`},
		"wrong type, unknown":  {header + "bogus: 1\nclientConnection:\n  burst: many\n", `unknown field "bogus"`},
		"wrong kind":           {"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\nbogus: 1\n", `kind: unsupported value`},
		"not YAML":             {header + "mode: [unclosed\n", "not valid YAML or JSON"},
		"unparsable duration":  {header + "mdoe: x\nnftables:\n  syncPeriod: soon\n", `nftables.syncPeriod: invalid value "soon"`},
		"list where a string":  {header + "mode: [nftables]\n", `mode: invalid value ["nftables"]`},
		"duplicate beside bad": {header + "mode: a\nmode: b\noomScoreAdj: low\n", `duplicate field "mode"`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, warnings, err := DecodeLenient([]byte(tt.in))
			if err == nil {
				t.Fatalf("accepted: %+v, warnings %v", cfg, warnings)
			}
			var decodeErr *DecodeError
			if !errors.As(err, &decodeErr) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v (%T) does not mention %q", err, err, tt.want)
			}
		})
	}
}

func TestLoadFileLenientNamesTheFile(t *testing.T) {
	path := writeConfig(t, "iptables:\n  syncPerod: 1s\n")
	cfg, warnings, err := LoadFileLenient(path)
	if err != nil || cfg == nil || len(warnings) != 1 || warnings[0].Path != "iptables.syncPerod" {
		t.Errorf("LoadFileLenient: %v %v %v", cfg, warnings, err)
	}
	_, _, err = LoadFileLenient(writeConfig(t, "oomScoreAdj: low\n"))
	if err == nil || !strings.Contains(err.Error(), "config.yaml") {
		t.Errorf("error %v should name the file", err)
	}
}

// wantMentioned checks that every string of want is part of some problem.
func wantMentioned(t *testing.T, problems, want []string) {
	t.Helper()
	for _, w := range want {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("no problem mentions %q; got %q", w, problems)
		}
	}
}
