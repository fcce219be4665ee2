package config

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	metricsfeatures "k8s.io/component-base/metrics/features"
	zpagesfeatures "k8s.io/component-base/zpages/features"
)

// UpstreamVersion is the kube-proxy release whose behaviour sluice reproduces. Feature gates
// are evaluated at this version, and showHiddenMetricsForVersion accepts only the minor
// release before it.
const UpstreamVersion = "1.37"

// The feature gates kube-proxy 1.37 reads. Their specs (default, maturity, lock) follow
// upstream's pkg/features table at 1.37; the logging, metrics and zpages gates that every
// component-base binary has are registered as well (see NewFeatureGate).
const (
	// KubeProxyIPVS allows mode "ipvs". Deprecated in 1.37 (still on by default); when
	// off, mode ipvs fails validation.
	KubeProxyIPVS featuregate.Feature = "KubeProxyIPVS"
	// KubeProxyNFTablesLocalhostNodePorts (alpha, off) serves TCP NodePorts on loopback in
	// nftables mode through a userspace proxy when nodePortAddresses names a loopback CIDR.
	KubeProxyNFTablesLocalhostNodePorts featuregate.Feature = "KubeProxyNFTablesLocalhostNodePorts"
	// NFTablesNetlink (beta, on) talks netlink to nf_tables instead of running nft.
	NFTablesNetlink featuregate.Feature = "NFTablesNetlink"
	// PreferSameTrafficDistribution (GA, locked on) honours EndpointSlice node hints.
	PreferSameTrafficDistribution featuregate.Feature = "PreferSameTrafficDistribution"
	// AllowServiceExternalIPs (GA, on, not locked) programs spec.externalIPs.
	AllowServiceExternalIPs featuregate.Feature = "AllowServiceExternalIPs"
	// MultiCIDRServiceAllocator (GA, locked on) makes kube-proxy watch ServiceCIDRs.
	MultiCIDRServiceAllocator featuregate.Feature = "MultiCIDRServiceAllocator"
)

// kubeProxyFeatureSpecs are the version histories of the gates above, as upstream declares
// them; a gate's state at UpstreamVersion is the last entry not newer than it.
func kubeProxyFeatureSpecs() map[featuregate.Feature]featuregate.VersionedSpecs {
	v := version.MustParse
	return map[featuregate.Feature]featuregate.VersionedSpecs{
		KubeProxyIPVS: {
			{Version: v("1.0"), Default: true, PreRelease: featuregate.GA},
			{Version: v("1.37"), Default: true, PreRelease: featuregate.Deprecated},
		},
		KubeProxyNFTablesLocalhostNodePorts: {
			{Version: v("1.37"), Default: false, PreRelease: featuregate.Alpha},
		},
		NFTablesNetlink: {
			{Version: v("1.37"), Default: true, PreRelease: featuregate.Beta},
		},
		PreferSameTrafficDistribution: {
			{Version: v("1.33"), Default: false, PreRelease: featuregate.Alpha},
			{Version: v("1.34"), Default: true, PreRelease: featuregate.Beta},
			{Version: v("1.35"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
		},
		AllowServiceExternalIPs: {
			{Version: v("1.0"), Default: true, PreRelease: featuregate.GA},
		},
		MultiCIDRServiceAllocator: {
			{Version: v("1.27"), Default: false, PreRelease: featuregate.Alpha},
			{Version: v("1.31"), Default: false, PreRelease: featuregate.Beta},
			{Version: v("1.33"), Default: true, PreRelease: featuregate.GA},
			{Version: v("1.34"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
		},
	}
}

// NewFeatureGate returns a fresh gate set holding the gates sluice understands, at their
// UpstreamVersion defaults: the kube-proxy gates above plus component-base's logging
// (ContextualLogging, LoggingAlphaOptions, LoggingBetaOptions), metrics (NativeHistograms)
// and zpages (ComponentFlagz, ComponentStatusz) gates. Every call returns an independent
// gate set, so tests and the program never share mutable global state.
func NewFeatureGate() featuregate.MutableVersionedFeatureGate {
	gate := featuregate.NewVersionedFeatureGate(version.MustParse(UpstreamVersion))
	for _, add := range []func(featuregate.MutableVersionedFeatureGate) error{
		func(g featuregate.MutableVersionedFeatureGate) error { return g.AddVersioned(kubeProxyFeatureSpecs()) },
		logsapi.AddFeatureGates,
		metricsfeatures.AddFeatureGates,
		zpagesfeatures.AddFeatureGates,
	} {
		if err := add(gate); err != nil {
			// The specs are static; a failure here is a programming error caught by tests.
			panic(fmt.Sprintf("registering feature gates: %v", err))
		}
	}
	return gate
}

// knownFeatureNames lists the gates a user may set, sorted, for error messages.
func knownFeatureNames(gate featuregate.FeatureGate) []string {
	var names []string
	for name := range gate.(featuregate.MutableVersionedFeatureGate).GetAll() {
		if name == "AllAlpha" || name == "AllBeta" {
			continue
		}
		names = append(names, string(name))
	}
	slices.Sort(names)
	return names
}

// setFeatureGates applies featureGates (the config file's map or --feature-gates) to a
// fresh gate set, and returns the names it ignored: the gates sluice does not know.
//
// Upstream kube-proxy registers every Kubernetes feature gate (it shares the whole
// project's registry), so a configuration that sets a gate of another component, as
// clusters that hand the same featureGates to every component do, starts upstream. A gate
// sluice does not know cannot change what kube-proxy 1.37 programs, so sluice starts too
// and names the ignored gates in a warning instead of refusing the file: a drop-in
// replacement must start wherever upstream starts. (A misspelt gate, which upstream would
// refuse, is warned about the same way.) A known gate set to a value it cannot take (a
// locked one) is still an error; on error the returned gate set holds the defaults.
func setFeatureGates(featureGates map[string]bool) (featuregate.MutableVersionedFeatureGate, []string, error) {
	gate := NewFeatureGate()
	known := gate.GetAll()
	apply := make(map[string]bool, len(featureGates))
	var ignored []string
	for name, on := range featureGates {
		if _, ok := known[featuregate.Feature(name)]; !ok {
			ignored = append(ignored, name)
			continue
		}
		apply[name] = on
	}
	slices.Sort(ignored)
	if err := gate.SetFromMap(apply); err != nil {
		// A failed SetFromMap keeps nothing of the map; hand back an untouched gate set so
		// that the rest of validation runs against the defaults.
		return NewFeatureGate(), ignored, err
	}
	return gate, ignored, nil
}

// IgnoredFeatureGatesWarning is the warning for the gates setFeatureGates ignored; it names
// the gates sluice knows, so that a misspelt one is easy to spot.
func IgnoredFeatureGatesWarning(ignored []string) string {
	return fmt.Sprintf("featureGates: ignoring %s: not a gate that changes what kube-proxy %s programs (sluice knows %s)",
		strings.Join(ignored, ", "), UpstreamVersion, strings.Join(knownFeatureNames(NewFeatureGate()), ", "))
}

// featureGatesHelp lists the gates for --feature-gates' help: component-base's list of the
// alpha and beta ones, plus the GA and deprecated gates that can still be turned off
// (component-base leaves those out, but KubeProxyIPVS=false is how to refuse ipvs mode).
func featureGatesHelp() string {
	gate := NewFeatureGate()
	lines := gate.KnownFeatures()
	var stable []string
	for name, spec := range gate.GetAll() {
		if spec.LockToDefault || (spec.PreRelease != featuregate.GA && spec.PreRelease != featuregate.Deprecated) {
			continue
		}
		maturity := string(spec.PreRelease)
		if maturity == "" {
			maturity = "GA" // component-base spells GA as ""
		}
		stable = append(stable, fmt.Sprintf("%s=true|false (%s - default=%t)", name, maturity, spec.Default))
	}
	slices.Sort(stable)
	return strings.Join(append(lines, stable...), "\n")
}
