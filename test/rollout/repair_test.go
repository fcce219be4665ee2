//go:build e2e

package rollout

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// repairSyncPeriod is the nftables.syncPeriod of the repair test: in nftables mode sluice
// syncs at least that often with nothing changing, and each of those full syncs reads the
// table back and repairs what differs from what it wrote.
const repairSyncPeriod = 3 * time.Second

// repairSlack is what a loaded 2-core machine may add to syncPeriod before the repair
// shows: the sync itself, and the probes' own pace.
const repairSlack = 3 * time.Second

// A rule deleted by hand (here the Service's element of the service-ips map, what
// `nft delete element` by an operator or another program does) stops the Service, and
// sluice's periodic full sync repairs it within syncPeriod with nothing else changing:
// the ClusterIP answers again, sluice_drift_repairs_total{mode="nftables",kind="element"}
// of that family rose by exactly one (and no other kind by anything), and an Info line
// names the repair. Per family, one after the other. nftables mode only: iptables mode
// (like upstream's) resyncs every hour, and within syncPeriod repairs only a flush that
// takes its canary chain (pkg/dataplane/iptables README, "Drift").
func TestHandDeletedRuleIsRepairedWithinSyncPeriod(t *testing.T) {
	env := NewEnv(t)
	node := env.RegisterNode(t, nodeName("repair", "nftables"), NodeOptions{PodCIDRs: true})
	s := env.StartSluice(t, SluiceOptions{Node: node, Config: env.Config(t, node, "nftables", func(c *v1alpha1.KubeProxyConfiguration) {
		c.NFTables.SyncPeriod = metav1.Duration{Duration: repairSyncPeriod}
	})})
	s.WaitSynced(t)
	svc := env.EchoService(t, node)
	env.ExpectServed(t, s, svc)

	for _, fam := range env.Families {
		t.Run(string(fam), func(t *testing.T) {
			ip := clusterIP(t, svc, fam)
			target := netip.AddrPortFrom(ip, servicePort)
			table, element := "ip", fmt.Sprintf("{ %s . tcp . %d }", ip, servicePort)
			if fam == corev1.IPv6Protocol {
				table = "ip6"
			}
			before := driftRepairs(t, s, fam)
			repairLines := len(repairLogLines(s, ip))

			// The deletion must be seen to stop the Service before the repair is awaited,
			// so it is made right after a full sync. Should the next one repair it before
			// the probe runs (a loaded machine), the repair is counted and the deletion is
			// made again.
			var deleted time.Time
			for attempt := 1; ; attempt++ {
				s.WaitFullSync(t, fam)
				repairedBefore := driftRepairs(t, s, fam)["element"]
				if out, err := env.Node.Run("nft", "delete", "element", table, "kube-proxy", "service-ips", element); err != nil {
					t.Fatalf("deleting %s from %s kube-proxy service-ips: %v %s", element, table, err, out)
				}
				deleted = time.Now()
				out := env.Client.Probe(echo.TCP, target, echo.ProbeOptions{Timeout: time.Second})
				if out.Result != echo.Answered {
					t.Logf("attempt %d: without its element %s is %s", attempt, target, out)
					break
				}
				if driftRepairs(t, s, fam)["element"] == repairedBefore {
					t.Fatalf("%s still answers without its service-ips element and nothing repaired it; the test is broken", target)
				}
				if attempt == 5 {
					t.Fatal("every deletion was repaired before a probe could see the Service stopped")
				}
				t.Logf("attempt %d: a full sync repaired the element before the probe; deleting it again", attempt)
				before = driftRepairs(t, s, fam)
				repairLines = len(repairLogLines(s, ip))
			}

			within := repairSyncPeriod + repairSlack
			for {
				s.RequireRunning(t)
				out := env.Client.Probe(echo.TCP, target, echo.ProbeOptions{Timeout: time.Second})
				if out.Result == echo.Answered && out.Reply.Pod == env.Server.Name {
					break
				}
				if time.Since(deleted) > within {
					t.Fatalf("%s (%s ClusterIP) not repaired within %v (syncPeriod %v plus %v of slack): %s\n%s",
						target, fam, within, repairSyncPeriod, repairSlack, out, s.Proc.Tail(30))
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%s answers again %v after the deletion (syncPeriod %v)", target, time.Since(deleted).Round(10*time.Millisecond), repairSyncPeriod)
			env.ExpectServed(t, s, svc)

			after := driftRepairs(t, s, fam)
			for kind, v := range after {
				want := 0.0
				if kind == "element" {
					want = 1
				}
				if d := v - before[kind]; d != want {
					t.Errorf(`sluice_drift_repairs_total{mode="nftables",ip_family=%q,kind=%q} rose by %v, want %v`, fam, kind, d, want)
				}
			}
			if lines := repairLogLines(s, ip); len(lines) != repairLines+1 {
				t.Errorf("%d new Info lines name the repair of %s's service-ips element, want 1\n%s", len(lines)-repairLines, ip, s.Proc.Tail(20))
			} else {
				t.Logf("sluice logged: %s", lines[len(lines)-1])
			}
		})
	}
}

// repairLogLines are the Info lines of sluice's log that report a drift repair in nftables
// mode of one element, the deleted service-ips element of ip (whose key, in hex, starts
// with the address).
func repairLogLines(s *Sluice, ip netip.Addr) []string {
	want := []string{`"Repaired kernel state changed behind sluice's back`, `mode="nftables"`, `repairs=["element=1"]`,
		fmt.Sprintf(`examples=["element %x`, ip.AsSlice()), "of service-ips deleted"}
	var out []string
	for _, line := range strings.Split(s.Log(), "\n") {
		matches := strings.HasPrefix(line, "I") // Info
		for _, w := range want {
			matches = matches && strings.Contains(line, w)
		}
		if matches {
			out = append(out, line)
		}
	}
	return out
}

// driftRepairs reads sluice_drift_repairs_total{mode="nftables"} of family fam, by kind.
func driftRepairs(t *testing.T, s *Sluice, fam corev1.IPFamily) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, kind := range []string{"chain", "rule", "set", "element"} {
		v, found, err := s.Metric("sluice_drift_repairs_total", "mode", "nftables", "ip_family", string(fam), "kind", kind)
		if err != nil || !found {
			t.Fatalf("sluice_drift_repairs_total{mode=nftables,ip_family=%s,kind=%s}: found %v, %v", fam, kind, found, err)
		}
		out[kind] = v
	}
	return out
}

// WaitFullSync waits for the next full sync of family fam to finish
// (kubeproxy_sync_full_proxy_rules_duration_seconds counts one more).
func (s *Sluice) WaitFullSync(t *testing.T, fam corev1.IPFamily) {
	t.Helper()
	const name = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	start, _, err := s.Metric(name, "ip_family", string(fam))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(convergeTimeout)
	for {
		s.RequireRunning(t)
		if v, _, err := s.Metric(name, "ip_family", string(fam)); err == nil && v > start {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no full %s sync within %v\n%s", fam, convergeTimeout, s.Proc.Tail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
