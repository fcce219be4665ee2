// Package version holds the build's version, set at link time by the Makefile.
package version

// Version is overridden with -ldflags "-X github.com/sluiceproxy/sluice/pkg/version.Version=...".
var Version = "dev"
