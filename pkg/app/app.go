// Package app runs the sluice daemon: it wires the API watch, the model, the sync loop and
// a backend together from completed options. This file is a placeholder until the daemon
// is assembled.
package app

import (
	"context"
	"errors"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/config"
)

// ErrNotImplemented is what the placeholder Run returns.
var ErrNotImplemented = errors.New("not implemented yet")

// Run runs sluice until ctx is cancelled or a fatal error occurs.
//
// o has been through config.Options.Complete: o.Config is the defaulted, validated
// KubeProxyConfiguration (what /configz serves), o.Effective its typed view (mode,
// per-mode periods and masquerade settings, node name, per-family resolvers for the
// backends' dataplane.Config), o.FeatureGates the evaluated gates, o.Master the API server
// override, o.Cleanup and o.InitOnly the one-shot modes, o.ConfigFile the file to watch
// (upstream exits when it changes) and o.IgnoredFlags the flags --config overrode. Logging
// is already configured. --write-config-to is handled before Run is called.
func Run(ctx context.Context, o *config.Options) error {
	logger := klog.FromContext(ctx)
	e := o.Effective
	logger.Info("Effective configuration",
		"mode", e.Mode, "modeDefaulted", e.ModeDefaulted, "nodeName", e.NodeName,
		"syncPeriod", e.SyncPeriod, "minSyncPeriod", e.MinSyncPeriod,
		"masqueradeBit", e.MasqueradeBit, "masqueradeAll", e.MasqueradeAll,
		"nodePortAddresses", e.NodePortAddresses, "detectLocalMode", e.DetectLocalMode,
		"clusterCIDRs", e.ClusterCIDRs, "healthzBindAddress", e.HealthzBindAddress,
		"metricsBindAddress", e.MetricsBindAddress, "cleanup", o.Cleanup, "initOnly", o.InitOnly)
	return ErrNotImplemented
}
