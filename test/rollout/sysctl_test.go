//go:build e2e

package rollout

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Per-namespace sysctls the test prepares (never a global one).
const (
	sysctlCloseWait     = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	sysctlEstablished   = "net/netfilter/nf_conntrack_tcp_timeout_established"
	sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"
)

// (d) sluice's long-running container has a read-only /proc/sys (and here no
// CAP_SYS_RESOURCE either, so it cannot lower its OOM score). A conntrack value that
// differs from the configuration (as after CPU hot-add or an agent's reset) and, in
// iptables mode, route_localnet left at 0 do not stop it: it starts, serves Services, and
// reports each setting it could not write (log line, sluice_node_setup_warnings_total, one
// NodeSetupWarning Event). A value already right is never written, so never warned about.
func TestReadOnlyProcSysStartsWarnsAndServes(t *testing.T) {
	env := NewEnv(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			env.SetSysctl(t, sysctlCloseWait, 60)     // the configuration wants 3600
			env.SetSysctl(t, sysctlEstablished, 7200) // the configuration wants 7200: already right
			env.SetSysctl(t, sysctlRouteLocalnet, 0)  // iptables mode wants 1 (localhost NodePorts)

			node := env.RegisterNode(t, nodeName("readonly", mode), NodeOptions{PodCIDRs: true})
			cfg := env.Config(t, node, mode, func(c *v1alpha1.KubeProxyConfiguration) {
				c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
				c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 2 * time.Hour}
			})
			s := env.StartSluice(t, SluiceOptions{Node: node, Config: cfg,
				Wrap: append(ReadOnlyProcSys(), WithoutCapability("sys_resource")...)})
			s.WaitLivez(t, livezWithin)
			s.WaitSynced(t)
			env.ExpectServed(t, s, env.EchoService(t, node))

			notWritten := []string{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "oom_score_adj"}
			if mode == "iptables" {
				notWritten = append(notWritten, "net.ipv4.conf.all.route_localnet")
			}
			for _, setting := range notWritten {
				s.WaitMetric(t, "sluice_node_setup_warnings_total", 1, "setting", setting)
				s.WaitLog(t, `setting="`+setting+`"`)
			}
			for _, setting := range []string{"net.netfilter.nf_conntrack_tcp_timeout_established", "net.ipv4.conf.all.route_localnet"} {
				if mode == "iptables" && setting == "net.ipv4.conf.all.route_localnet" {
					continue
				}
				if v, found, err := s.Metric("sluice_node_setup_warnings_total", "setting", setting); err != nil || found {
					t.Errorf("a warning about %s (value %v, err %v): it needs no write", setting, v, err)
				}
			}
			s.WaitLog(t, `"Could not change a kernel setting; going on with its current value`)
			ev := env.WaitNodeEvent(t, node, "NodeSetupWarning")
			for _, setting := range notWritten {
				if !strings.Contains(ev.Note, setting+"=") {
					t.Errorf("the Event does not name %s: %s", setting, ev.Note)
				}
			}
			t.Logf("Event %s: %s", ev.Reason, ev.Note)

			// Nothing was written behind the read-only view.
			if v := env.Sysctl(t, sysctlCloseWait); v != 60 {
				t.Errorf("%s = %d, want 60 (unchanged)", sysctlCloseWait, v)
			}
			if v := env.Sysctl(t, sysctlRouteLocalnet); v != 0 {
				t.Errorf("%s = %d, want 0 (unchanged)", sysctlRouteLocalnet, v)
			}
			s.RequireRunning(t)
		})
	}
}
