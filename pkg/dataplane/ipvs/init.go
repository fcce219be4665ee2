package ipvs

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

// ApplyKernelSettings does the ipvs mode's privileged node setup without building a
// backend, for `sluice --init-only` (upstream's ipvs proxier does the same work before it
// returns under --init-only): it checks that the kernel has IPVS, sets the sysctls New sets
// and IPVS's connection timeouts when settings give any. The net/ipv4/vs sysctls and the
// timeouts are shared by both families, so one call serves a dual-stack node. Only the
// seams of opts are used (tests); the other options do not apply.
func ApplyKernelSettings(ctx context.Context, settings Settings, opts ...Option) error {
	o := options{supported: KernelSupportsIPVS, kernel: hostnet.RunningKernel}
	for _, opt := range opts {
		opt(&o)
	}
	if settings.Scheduler == "" {
		settings.Scheduler = DefaultScheduler
	}
	if err := requireIPVS(o.supported, settings.Scheduler); err != nil {
		return err
	}
	kv, err := o.kernel()
	if err != nil {
		return fmt.Errorf("check kernel version: %w", err)
	}
	s := o.sysctl
	if s == nil {
		s = hostnet.ProcSys{}
	}
	h := o.ipvs
	if h == nil && (settings.TCPTimeout > 0 || settings.TCPFinTimeout > 0 || settings.UDPTimeout > 0) {
		m, err := newMobyIPVS()
		if err != nil {
			return err
		}
		defer m.close()
		h = m
	}
	return applyKernelSettings(s, kv, h, settings, klog.FromContext(ctx))
}

// requireIPVS fails unless the kernel has IPVS (supported asks it), naming the modules to
// load: moby/ipvs reports success for every call on a kernel without IPVS, which would make
// a backend that programs nothing look healthy.
func requireIPVS(supported func() (bool, error), scheduler string) error {
	ok, err := supported()
	if err != nil {
		return fmt.Errorf("probe the kernel for IPVS: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w (ip_vs module not loaded?): load ip_vs, ip_vs_%s and nf_conntrack (modprobe -a ip_vs ip_vs_%s nf_conntrack), or use mode nftables",
			ErrNoIPVS, scheduler, scheduler)
	}
	return nil
}

// applyKernelSettings sets the sysctls (setupSysctls) and, when settings give any, IPVS's
// TCP, TCP FIN and UDP timeouts (ipvsadm --set); h may be nil when they do not.
func applyKernelSettings(s hostnet.Sysctls, kv hostnet.KernelVersion, h ipvsKernel, settings Settings, logger klog.Logger) error {
	if err := setupSysctls(s, kv, settings.StrictARP, logger); err != nil {
		return err
	}
	if settings.TCPTimeout > 0 || settings.TCPFinTimeout > 0 || settings.UDPTimeout > 0 {
		if err := h.SetTimeouts(settings.TCPTimeout, settings.TCPFinTimeout, settings.UDPTimeout); err != nil {
			return fmt.Errorf("set IPVS timeouts (tcp %s, tcpfin %s, udp %s): %w", settings.TCPTimeout, settings.TCPFinTimeout, settings.UDPTimeout, err)
		}
	}
	return nil
}
