//go:build e2e

package rollout

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"
)

// livezWithin is how soon after its start sluice's /livez must answer: it listens before
// anything that can wait. A few seconds on an idle machine is a fraction of this; the
// margin is for a loaded 2-core one (kubelet's default startup probe period is 10 s).
const livezWithin = 10 * time.Second

// (c) NodeCIDR mode on a Node without pod CIDRs (a CNI with its own IPAM): sluice is alive
// within seconds, serves Services without local-traffic detection, reports it (log line,
// Event, metric), and exits for a restart when the pod CIDRs appear; restarted, it detects
// local traffic by them.
func TestNodeWithoutPodCIDRsServesAndRestartsWhenTheyAppear(t *testing.T) {
	env := NewEnv(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			node := env.RegisterNode(t, nodeName("nopodcidrs", mode), NodeOptions{})
			cfg := env.Config(t, node, mode, func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "NodeCIDR" })
			s := env.StartSluice(t, SluiceOptions{Node: node, Config: cfg})
			took := s.WaitLivez(t, livezWithin)
			t.Logf("/livez answered 200 %.2fs after the start", took.Seconds())
			s.WaitSynced(t)

			svc := env.EchoService(t, node)
			env.ExpectServed(t, s, svc)
			s.WaitLog(t, `"Programming Services without local-traffic detection"`, "has no IPv4 pod CIDR")
			ev := env.WaitNodeEvent(t, node, "NoLocalTrafficDetection")
			t.Logf("Event %s: %s", ev.Reason, ev.Note)
			for _, fam := range env.Families {
				s.WaitMetric(t, "sluice_local_traffic_detection_missing", 1, "ip_family", string(fam))
			}

			env.SetPodCIDRs(t, node)
			if code := s.WaitExit(t, convergeTimeout); code != 1 {
				t.Errorf("exit code %d after the pod CIDRs appeared, want 1", code)
			}
			if log := s.Log(); !strings.Contains(log, "pod CIDRs changed from [] to [10.244.1.0/24 fd00:10:244:1::/64]") {
				t.Errorf("the log does not say why sluice exited:\n%s", s.Proc.Tail(10))
			}

			// The DaemonSet restarts it: now local traffic is detected, and Services are
			// still served.
			again := env.StartSluice(t, SluiceOptions{Node: node, Config: cfg})
			again.WaitSynced(t)
			for _, fam := range env.Families {
				again.WaitMetric(t, "sluice_local_traffic_detection_missing", 0, "ip_family", string(fam))
			}
			env.ExpectServed(t, again, env.EchoService(t, node))
		})
	}
}

// Alive before ready: before its Node exists sluice's /livez answers 200 within seconds
// and /healthz 503 with nodeEligible false (upstream's answer without a Node); once the
// Node is registered sluice programs Services and /healthz turns 200. Mode-independent.
func TestAliveBeforeTheNodeExists(t *testing.T) {
	env := NewEnv(t)
	const node = "late-node"
	s := env.StartSluice(t, SluiceOptions{Node: node, Config: env.Config(t, node, "nftables", nil)})
	took := s.WaitLivez(t, livezWithin)
	t.Logf("/livez answered 200 %.2fs after the start, with no Node object", took.Seconds())
	code, body, err := s.Get(healthzPort, "/healthz")
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, `"nodeEligible":false`) {
		t.Errorf("/healthz without a Node: %d %s %v, want 503 with nodeEligible false", code, body, err)
	}
	s.WaitLog(t, "Waiting for this node's Node object to exist")

	env.RegisterNode(t, node, NodeOptions{PodCIDRs: true})
	s.WaitSynced(t)
	env.ExpectServed(t, s, env.EchoService(t, node))
	deadline := time.Now().Add(convergeTimeout)
	for {
		code, body, err = s.Get(healthzPort, "/healthz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz with the Node: %d %s %v, want 200", code, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
