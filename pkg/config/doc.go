// Package config turns sluice's command line and its KubeProxyConfiguration file
// (kubeproxy.config.k8s.io/v1alpha1, upstream kube-proxy's only config format) into the
// configuration the rest of the program uses.
//
// The steps, each a function of its own: DecodeLenient as upstream v1.37 decodes (strictly,
// falling back to a lenient decode when only unknown or duplicated fields failed, each
// returned as a FieldWarning with its path; wrong types stay errors), SetDefaults and
// ApplyPlatformDefaults exactly as upstream does, Validate (every invalid field, with its
// path), and NewEffective, a typed view with the mode-dependent choices made and helpers
// that resolve, per IP family, what the backends need (dataplane.Config,
// NodePortAddresses, LocalDetector). Options ties these to the flags with upstream's
// precedence rules; Decode and Check are the strict gate of `sluice config check`. See
// README.md.
package config
