//go:build e2e

package rollout

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// repairSyncPeriod is the syncPeriod of the repair test. In nftables mode sluice syncs at
// least that often with nothing changing, and each of those full syncs reads the table
// back and repairs what differs from what it wrote; in iptables mode the canary chain is
// checked that often, and a full sync follows when it is gone.
const repairSyncPeriod = 3 * time.Second

// repairSlack is what a loaded 2-core machine may add to syncPeriod before the repair
// shows: the sync itself, and the probes' own pace.
const repairSlack = 3 * time.Second

// handDeletion is what someone else does to one family's rules in the node namespace.
type handDeletion struct {
	// what says it, for the logs.
	what string
	// do deletes, and returns by how much each kind of sluice_drift_repairs_total must rise
	// for the repair and what the Info line reporting it must contain.
	do func(t *testing.T, env *Env, fam corev1.IPFamily, ip netip.Addr) (want map[string]float64, logLine []string)
}

var handDeletions = map[string]handDeletion{
	// An operator's (or another program's) `nft delete element` of the Service's
	// service-ips element.
	"nftables": {what: "the service-ips element", do: func(t *testing.T, env *Env, fam corev1.IPFamily, ip netip.Addr) (map[string]float64, []string) {
		table := map[corev1.IPFamily]string{corev1.IPv4Protocol: "ip", corev1.IPv6Protocol: "ip6"}[fam]
		element := fmt.Sprintf("{ %s . tcp . %d }", ip, servicePort)
		mustRun(t, env, "nft", "delete", "element", table, "kube-proxy", "service-ips", element)
		// The element's key, in hex, starts with the address.
		return map[string]float64{"element": 1},
			[]string{`repairs=["element=1"]`, fmt.Sprintf(`examples=["element %x`, ip.AsSlice()), "of service-ips deleted"}
	}},
	// A firewall reload: every rule and chain of the family's filter, nat and mangle
	// tables flushed and deleted (the canary with them). What must be counted is what
	// the kernel held before: sluice's chains in nat and filter (KUBE-FIREWALL is
	// kubelet's, which sluice only makes sure exists), and the jumps to its chains from
	// the built-in ones.
	"iptables": {what: "every chain and rule (a firewall reload)", do: func(t *testing.T, env *Env, fam corev1.IPFamily, ip netip.Addr) (map[string]float64, []string) {
		cmd := map[corev1.IPFamily]string{corev1.IPv4Protocol: "iptables", corev1.IPv6Protocol: "ip6tables"}[fam]
		want := map[string]float64{}
		for _, table := range []string{"nat", "filter"} {
			for _, line := range strings.Split(mustRun(t, env, cmd, "-w", "-t", table, "-S"), "\n") {
				f := strings.Fields(line)
				switch {
				case len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") && f[1] != "KUBE-FIREWALL":
					want["chain"]++
				case len(f) > 2 && f[0] == "-A" && strings.ToUpper(f[1]) == f[1] && !strings.HasPrefix(f[1], "KUBE-") && strings.Contains(line, " -j KUBE-"):
					want["rule"]++
				}
			}
		}
		mustRun(t, env, "sh", "-c", fmt.Sprintf("for t in filter nat mangle; do %[1]s -w -t $t -F && %[1]s -w -t $t -X || exit 1; done", cmd))
		return want, []string{fmt.Sprintf(`repairs=["chain=%v","rule=%v"]`, want["chain"], want["rule"])}
	}},
}

// Rules deleted by hand behind sluice's back stop a Service, and sluice repairs them
// within syncPeriod with nothing else changing: the ClusterIP answers again (real
// packets), sluice_drift_repairs_total{mode,ip_family,kind} rose by exactly what was
// repaired, and an Info line names the repair. Per mode and family, one family after the
// other. In nftables mode a single element deleted by hand is repaired so; in iptables
// mode, which (like upstream) syncs fully only every hour or when its canary chain is
// gone, what is repaired within syncPeriod is a flush (pkg/dataplane/iptables README,
// "Drift"), so that is what the iptables case does.
func TestHandDeletedRuleIsRepairedWithinSyncPeriod(t *testing.T) {
	env := NewEnv(t)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			deletion := handDeletions[mode]
			node := env.RegisterNode(t, nodeName("repair", mode), NodeOptions{PodCIDRs: true})
			s := env.StartSluice(t, SluiceOptions{Node: node, Config: env.Config(t, node, mode, func(c *v1alpha1.KubeProxyConfiguration) {
				c.NFTables.SyncPeriod = metav1.Duration{Duration: repairSyncPeriod}
				c.IPTables.SyncPeriod = metav1.Duration{Duration: repairSyncPeriod}
			})})
			s.WaitSynced(t)
			svc := env.EchoService(t, node)
			env.ExpectServed(t, s, svc)
			for _, fam := range env.Families {
				t.Run(string(fam), func(t *testing.T) { expectRepaired(t, env, s, svc, mode, fam, deletion) })
			}
			s.Stop()
		})
	}
}

// expectRepaired makes deletion in family fam and checks that s repairs it (see
// TestHandDeletedRuleIsRepairedWithinSyncPeriod).
func expectRepaired(t *testing.T, env *Env, s *Sluice, svc *corev1.Service, mode string, fam corev1.IPFamily, deletion handDeletion) {
	ip := clusterIP(t, svc, fam)
	target := netip.AddrPortFrom(ip, servicePort)
	before := allDriftRepairs(t, s, env, mode)

	// The deletion must be seen to stop the Service before the repair is awaited, so in
	// nftables mode it is made right after a full sync. Should a sync repair it before the
	// probe runs (a loaded machine, or iptables' canary check coming at once), the repair
	// is counted and the deletion is made again.
	repairLine := []string{`"Repaired kernel state changed behind sluice's back`, fmt.Sprintf("ipFamily=%q mode=%q", fam, mode)}
	var deleted time.Time
	var want map[string]float64
	var logWant []string
	var linesBefore int
	for attempt := 1; ; attempt++ {
		if mode == "nftables" {
			s.WaitFullSync(t, fam)
		}
		repairedBefore := driftRepairs(t, s, mode, fam)
		linesBefore = len(logLines(s.Log(), repairLine))
		want, logWant = deletion.do(t, env, fam, ip)
		deleted = time.Now()
		out := env.Client.Probe(echo.TCP, target, echo.ProbeOptions{Timeout: time.Second})
		if out.Result != echo.Answered {
			t.Logf("attempt %d: without %s, %s is %s", attempt, deletion.what, target, out)
			break
		}
		if maps.Equal(driftRepairs(t, s, mode, fam), repairedBefore) {
			t.Fatalf("%s still answers without %s and nothing repaired it; the test is broken", target, deletion.what)
		}
		if attempt == 5 {
			t.Fatal("every deletion was repaired before a probe could see the Service stopped")
		}
		t.Logf("attempt %d: a sync repaired %s before the probe; deleting again", attempt, deletion.what)
		before = allDriftRepairs(t, s, env, mode)
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
	t.Logf("%s answers again %v after the deletion of %s (syncPeriod %v)", target, time.Since(deleted).Round(10*time.Millisecond), deletion.what, repairSyncPeriod)
	env.ExpectServed(t, s, svc)

	// Exactly what was repaired, in this family; nothing in the other.
	for f, repairs := range allDriftRepairs(t, s, env, mode) {
		for kind, v := range repairs {
			w := 0.0
			if f == fam {
				w = want[kind]
			}
			if d := v - before[f][kind]; d != w {
				t.Errorf(`sluice_drift_repairs_total{mode=%q,ip_family=%q,kind=%q} rose by %v, want %v`, mode, f, kind, d, w)
			}
		}
	}
	// One Info line reports the repair, and says what was repaired. It is written just
	// before the sync that repairs ends; give it a moment.
	deadline := time.Now().Add(convergeTimeout)
	lines := logLines(s.Log(), repairLine)
	for len(lines) == linesBefore && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		lines = logLines(s.Log(), repairLine)
	}
	if len(lines) != linesBefore+1 {
		t.Errorf("%d Info lines report a repair in %s since the deletion, want 1\n%s", len(lines)-linesBefore, fam, strings.Join(lines[linesBefore:], "\n"))
	} else if line := lines[linesBefore]; len(logLines(line, logWant)) == 0 {
		t.Errorf("the Info line reporting the repair does not say %q:\n%s", logWant, line)
	} else {
		t.Logf("sluice logged: %s", line)
	}
}

// mustRun runs a command in the node namespace and returns its output.
func mustRun(t *testing.T, env *Env, name string, args ...string) string {
	t.Helper()
	out, err := env.Node.Run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// logLines are the Info lines of log (sluice's) that contain every one of want.
func logLines(log string, want []string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		matches := strings.HasPrefix(line, "I")
		for _, w := range want {
			matches = matches && strings.Contains(line, w)
		}
		if matches {
			out = append(out, line)
		}
	}
	return out
}

// driftRepairs reads sluice_drift_repairs_total of mode and family fam, by kind.
func driftRepairs(t *testing.T, s *Sluice, mode string, fam corev1.IPFamily) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, kind := range metrics.DriftKinds[mode] {
		v, found, err := s.Metric("sluice_drift_repairs_total", "mode", mode, "ip_family", string(fam), "kind", kind)
		if err != nil || !found {
			t.Fatalf("sluice_drift_repairs_total{mode=%s,ip_family=%s,kind=%s}: found %v, %v", mode, fam, kind, found, err)
		}
		out[kind] = v
	}
	return out
}

// allDriftRepairs is driftRepairs of every family of env.
func allDriftRepairs(t *testing.T, s *Sluice, env *Env, mode string) map[corev1.IPFamily]map[string]float64 {
	t.Helper()
	out := map[corev1.IPFamily]map[string]float64{}
	for _, f := range env.Families {
		out[f] = driftRepairs(t, s, mode, f)
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
