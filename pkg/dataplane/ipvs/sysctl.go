package ipvs

import (
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

// connReuseMode returns the conn_reuse_mode to set on a kernel, or -1 to leave it alone.
//
// With conn_reuse_mode=1 (the kernel's default) a SYN that reuses the source port of a
// connection IPVS still remembers used to be dropped for a second before being rescheduled
// (https://issues.k8s.io/70747); upstream set 0 to avoid that, which made IPVS send such
// connections to the old real server even at weight 0, forever under port reuse
// (https://issues.k8s.io/81775). Linux 5.9 removed the delay (commit "ipvs: allow
// connection reuse for unconfirmed conntrack"; https://issues.k8s.io/93297), so there 1 is
// right on both counts and sluice sets it (upstream only leaves it alone, so a 0 left by an
// older kube-proxy stays). Between 4.1 and 5.9 sluice keeps upstream's 0: a one-second
// stall of every reused port is worse than the weight-0 leak, which expire_nodest_conn
// ends when the real server is deleted. Before 4.1 the sysctl does not exist.
func connReuseMode(v hostnet.KernelVersion) int {
	switch {
	case !v.AtLeast(4, 1):
		return -1
	case v.AtLeast(5, 9):
		return 1
	}
	return 0
}

// setupSysctls sets what IPVS needs: conntrack for IPVS connections (the masquerade rules
// and the conntrack reconciler see them), conn_reuse_mode, expiry of connections whose real
// server is gone (so a deleted real server does not blackhole them, https://issues.k8s.io/71358)
// and of persistence templates of quiesced ones (weight 0), forwarding, and strict ARP when
// asked (so the node does not answer ARP for the addresses on the dummy device, which
// MetalLB's L2 mode needs).
func setupSysctls(s hostnet.Sysctls, v hostnet.KernelVersion, strictARP bool, logger klog.Logger) error {
	want := []struct {
		name  string
		value int
	}{
		{sysctlVSConnTrack, 1},
		{sysctlExpireNoDestConn, 1},
		{sysctlExpireQuiescentTemplate, 1},
		{sysctlIPForward, 1},
	}
	if m := connReuseMode(v); m >= 0 {
		want = append(want, struct {
			name  string
			value int
		}{sysctlConnReuseMode, m})
	} else {
		logger.Info("Kernel too old to set sysctl, leaving it alone", "sysctl", sysctlConnReuseMode, "kernel", v.String(), "minimumKernel", "4.1")
	}
	if strictARP {
		want = append(want, struct {
			name  string
			value int
		}{sysctlARPIgnore, 1}, struct {
			name  string
			value int
		}{sysctlARPAnnounce, 2})
	}
	for _, w := range want {
		if err := hostnet.EnsureSysctl(s, w.name, w.value); err != nil {
			return err
		}
	}
	if v, err := s.Get(sysctlBridgeNFCallIPTables); err == nil && v != 1 {
		logger.Info("Missing br_netfilter module or unset sysctl br-nf-call-iptables; Services may not work for pods on a bridge", "sysctl", sysctlBridgeNFCallIPTables)
	}
	return nil
}
