package conntrack

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/cpuset"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

// Settings are the conntrack section of the proxy configuration (config.ConntrackSettings
// is this type). A zero value leaves the kernel's setting alone.
type Settings struct {
	// MaxPerCore times the number of CPUs, but at least Min, is nf_conntrack_max;
	// MaxPerCore 0 leaves nf_conntrack_max (and Min) alone.
	MaxPerCore int
	Min        int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set nf_conntrack_tcp_timeout_*.
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal=1.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout{,_stream}.
	UDPTimeout       time.Duration
	UDPStreamTimeout time.Duration
}

// maxLimit caps nf_conntrack_max computed from MaxPerCore: on a machine with many cores
// the product would reserve memory for far more connections than a node handles.
const maxLimit = 1 << 20

// The settings ApplySysctls reads and writes besides nf_conntrack_max (sysctlMax): sysctls
// below /proc/sys, and the hash table size, a parameter of the nf_conntrack module below
// /sys/module.
const (
	sysctlTCPEstablished    = "net/netfilter/nf_conntrack_tcp_timeout_established"
	sysctlTCPCloseWait      = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	sysctlTCPBeLiberal      = "net/netfilter/nf_conntrack_tcp_be_liberal"
	sysctlUDPTimeout        = "net/netfilter/nf_conntrack_udp_timeout"
	sysctlUDPStreamTimeout  = "net/netfilter/nf_conntrack_udp_timeout_stream"
	moduleParameterHashsize = "nf_conntrack/parameters/hashsize"
)

// Kernel is where ApplySysctls reads and writes. A nil field is the machine's own.
type Kernel struct {
	// Sysctls holds the net/netfilter sysctls (default hostnet.ProcSys{}).
	Sysctls hostnet.Sysctls
	// ModuleParameters holds nf_conntrack/parameters/hashsize (default hostnet.SysModule()).
	ModuleParameters hostnet.Sysctls
}

// ApplySysctls sets the conntrack sysctls as upstream kube-proxy does in every mode:
// nf_conntrack_max is raised (never lowered) to max(MaxPerCore×CPUs, Min), the product
// capped at 1 048 576; the hash table is raised to a quarter of it; the TCP timeouts, the
// TCP "be liberal" switch and the UDP timeouts are set when configured. A value the kernel
// already has is not written, so a node prepared by its operator (or by the privileged
// --init-only container) needs no write access.
//
// nf_conntrack_max and hashsize are global: only the host's initial network namespace may
// change them. An error names the first setting that could not be written; the settings
// before it were applied. The daemon passes hostnet.Tolerant for both fields of k, so that
// a write its container may not make is a warning and the rest is still applied.
func ApplySysctls(ctx context.Context, s Settings, k Kernel) error {
	if k.Sysctls == nil {
		k.Sysctls = hostnet.ProcSys{}
	}
	if k.ModuleParameters == nil {
		k.ModuleParameters = hostnet.SysModule()
	}
	return applySysctls(ctx, s, k, numCPU())
}

// numCPU counts the node's online CPUs. nf_conntrack_max is host-wide, so the process's
// cpuset (which runtime.NumCPU honours) is the wrong measure under a static CPU policy.
func numCPU() int {
	if n, err := cpuset.NumCPU(); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// conntrackMax returns the nf_conntrack_max the settings ask for, 0 for "leave it".
func conntrackMax(s Settings, cpus int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	scaled := s.MaxPerCore * cpus
	if scaled > maxLimit {
		return maxLimit
	}
	if scaled > s.Min {
		return scaled
	}
	return s.Min
}

func applySysctls(ctx context.Context, s Settings, k Kernel, cpus int) error {
	logger := klog.FromContext(ctx)
	set := func(to hostnet.Sysctls, name string, value int) error {
		if cur, err := to.Get(name); err == nil && cur == value {
			return nil
		}
		logger.Info("Setting conntrack parameter", "entry", name, "value", value)
		return hostnet.EnsureSysctl(to, name, value)
	}

	if max := conntrackMax(s, cpus); max > 0 {
		if cur, err := k.Sysctls.Get(sysctlMax); err != nil || cur < max {
			if err := set(k.Sysctls, sysctlMax, max); err != nil {
				return err
			}
		}
		hashsize, err := k.ModuleParameters.Get(moduleParameterHashsize)
		if err != nil {
			return fmt.Errorf("reading conntrack hashsize: %w", err)
		}
		if hashsize < max/4 {
			if err := set(k.ModuleParameters, moduleParameterHashsize, max/4); err != nil {
				if hostnet.IsNotWritable(err) {
					return fmt.Errorf("%w (is /sys mounted read-only? the hash table then stays at %d buckets)", err, hashsize)
				}
				return err
			}
		}
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	for _, t := range []struct {
		name  string
		value int
		set   bool
	}{
		{sysctlTCPEstablished, seconds(s.TCPEstablishedTimeout), s.TCPEstablishedTimeout > 0},
		{sysctlTCPCloseWait, seconds(s.TCPCloseWaitTimeout), s.TCPCloseWaitTimeout > 0},
		{sysctlTCPBeLiberal, 1, s.TCPBeLiberal},
		{sysctlUDPTimeout, seconds(s.UDPTimeout), s.UDPTimeout > 0},
		{sysctlUDPStreamTimeout, seconds(s.UDPStreamTimeout), s.UDPStreamTimeout > 0},
	} {
		if !t.set {
			continue
		}
		if err := set(k.Sysctls, t.name, t.value); err != nil {
			return err
		}
	}
	return nil
}
