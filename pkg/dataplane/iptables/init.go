package iptables

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

// ApplySysctls sets the sysctls the iptables mode needs for cfg without building a backend,
// for `sluice --init-only` (upstream's iptables proxier does the same before it returns
// under --init-only): route_localnet=1 when NodePorts answer on 127.0.0.0/8 (IPv4,
// iptables.localhostNodePorts on, nodePortAddresses covering loopback). Only the sysctl seam
// of opts is used (tests).
func ApplySysctls(ctx context.Context, cfg dataplane.Config, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.sysctl == nil {
		o.sysctl = hostnet.ProcSys{}
	}
	return applySysctls(o.sysctl, cfg, klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", cfg.Family))
}

// applySysctls sets route_localnet when localhost NodePorts are active (New and
// ApplySysctls).
func applySysctls(s hostnet.Sysctls, cfg dataplane.Config, logger klog.Logger) error {
	if !localhostNodePortsActive(cfg) {
		return nil
	}
	logger.Info("Setting route_localnet=1 to allow NodePorts on localhost; to change this either disable iptables.localhostNodePorts or set nodePortAddresses to exclude loopback addresses")
	return hostnet.EnsureSysctl(s, sysctlRouteLocalnet, 1)
}
