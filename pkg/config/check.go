package config

import (
	"errors"

	"k8s.io/kube-proxy/config/v1alpha1"
)

// CheckResult is the verdict of Check on one configuration file.
type CheckResult struct {
	// Problems lists, each with its v1alpha1 path, every unknown and duplicated field,
	// every value of the wrong type and every value validation refuses. Empty means the
	// file is clean: strict decoding and validation both pass.
	Problems []string
	// Config is the configuration in effect (defaults applied), nil when it could not be
	// decoded at all. It is set even with Problems when a lenient decode succeeded, so that
	// the values that were understood can still be shown.
	Config *v1alpha1.KubeProxyConfiguration
	// Effective is the typed view of Config, nil unless the file is clean.
	Effective *Effective
	// IgnoredFeatureGates are featureGates sluice does not know: not a problem (upstream
	// accepts every Kubernetes gate, so sluice does too), but worth a look for typos.
	IgnoredFeatureGates []string
}

// OK reports whether the file passed every check.
func (r CheckResult) OK() bool { return len(r.Problems) == 0 }

// Check is the strict gate operators run before a rollout (`sluice config check`): it
// decodes data as the daemon does, applies the defaults the daemon applies, validates, and
// collects every problem instead of stopping at the first. A file Check passes starts sluice
// without a warning; one that only has unknown or duplicated fields still starts (see
// DecodeLenient), but Check fails it, so that CI catches the typo the daemon would only
// report.
//
// The node's name is not known here: a hostnameOverride left empty stays empty in
// Effective.NodeName (the daemon uses the machine's hostname).
func Check(data []byte) CheckResult {
	var r CheckResult
	cfg, warnings, err := DecodeLenient(data)
	if err != nil {
		var decodeErr *DecodeError
		if errors.As(err, &decodeErr) {
			r.Problems = decodeErr.Problems
		} else {
			r.Problems = []string{err.Error()}
		}
		return r
	}
	for _, w := range warnings {
		r.Problems = append(r.Problems, w.String())
	}
	SetDefaults(cfg)
	modeDefaulted := ApplyPlatformDefaults(cfg)
	r.Config = cfg
	errs, _, ignoredGates := validate(cfg)
	r.IgnoredFeatureGates = ignoredGates
	for _, e := range errs {
		r.Problems = append(r.Problems, e.Error())
	}
	if len(r.Problems) > 0 {
		return r
	}
	effective, err := NewEffective(cfg, cfg.HostnameOverride)
	if err != nil {
		r.Problems = append(r.Problems, err.Error())
		return r
	}
	effective.ModeDefaulted = modeDefaulted
	r.Effective = effective
	return r
}
