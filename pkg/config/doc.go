// Package config turns sluice's command line and its KubeProxyConfiguration file
// (kubeproxy.config.k8s.io/v1alpha1, upstream kube-proxy's only config format) into the
// configuration the rest of the program uses.
//
// The steps, each a function of its own: Decode strictly (unknown fields and wrong types
// are errors naming the field), SetDefaults and ApplyPlatformDefaults exactly as upstream
// v1.37 does, Validate (every invalid field, with its path), and NewEffective, a typed view
// with the mode-dependent choices made and helpers that resolve, per IP family, what the
// backends need (dataplane.Config, NodePortAddresses, LocalDetector). Options ties these
// to the flags with upstream's precedence rules; see README.md.
package config
