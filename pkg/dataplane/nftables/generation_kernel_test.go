//go:build kernel

package nftables

import (
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/loopharness"
)

// TestPeriodicResyncReadsOnlyAfterAForeignCommit: the IPv4 and IPv6 backends of one
// node commit to the same ruleset generation; their periodic full resyncs read nothing
// while every commit since their last read was one of theirs (partial syncs included),
// and read the table again after anyone else's commit, which repairs an element deleted
// by hand (real packets before and after).
func TestPeriodicResyncReadsOnlyAfterAForeignCommit(t *testing.T) {
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	tp.addPod("pod-b", "10.180.0.2")
	clock := time.Now()
	now := func() time.Time { return clock }
	type node struct {
		b  *Backend
		ns *model.NodeState
	}
	nodes := map[model.IPFamily]node{}
	for _, f := range model.Families {
		cfg := testConfig(f)
		cfg.SyncPeriod = time.Minute
		addr := testNodeIP
		if f == model.IPv6 {
			addr = testNodeIPv6
		}
		sp := svc("t", "web", "http", model.TCP, vip(f, 10), 80).Endpoints(netip.AddrPortFrom(netip.MustParseAddr(podIP(f, 1)), 80).String()).Build()
		n := node{b: newTestBackend(t, cfg, fixedAddrs(addr), WithClock(now)), ns: nodeState(f, sp)}
		mustApply(t, n.b, n.ns, model.Changes{Full: true})
		nodes[f] = n
	}
	web := ap("172.30.0.10", 80)
	loopharness.Eventually(t, "web programmed", 10*time.Second, tp.reaches(web, "pod-a"))

	// resync runs every backend's next sync after syncPeriod and checks whether it read.
	resync := func(step string, wantRead bool) {
		t.Helper()
		clock = clock.Add(time.Minute)
		for _, f := range model.Families {
			n := nodes[f]
			res := mustApply(t, n.b, n.ns, model.Changes{})
			st := n.b.LastStats()
			if !res.Full {
				t.Fatalf("%s, %v: the periodic resync is not reported as full", step, f)
			}
			if read := st.Dumps > 0; read != wantRead || st.Verified == wantRead {
				t.Fatalf("%s, %v: read the table = %v (dumps %d, verified %v), want %v", step, f, read, st.Dumps, st.Verified, wantRead)
			}
		}
	}
	resync("nothing changed", false)

	// Partial syncs of both families are the backends' own commits.
	moved := svc("t", "web", "http", model.TCP, "172.30.0.10", 80).Endpoints("10.180.0.2:80").Build()
	nodes[model.IPv4].ns.SetService(moved.Name.NamespacedName, []*model.ServicePort{moved}, nil)
	mustApply(t, nodes[model.IPv4].b, nodes[model.IPv4].ns, changed("t/web"))
	loopharness.Eventually(t, "web moved", 10*time.Second, tp.reaches(web, "pod-b"))
	resync("after the backends' own partial syncs", false)

	// Someone else's commit, anywhere in the namespace's nf_tables: both read again.
	nft(t, "add", "table", "inet", "sluice-test-foreign")
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", "sluice-test-foreign").Run() })
	resync("after a foreign table was added", true)
	resync("after that read", false)

	// Drift: the foreign commit that deletes an element is seen, and the read repairs it.
	nft(t, "delete", "element", "ip", kubeProxyTable, serviceIPsMap, "{ 172.30.0.10 . tcp . 80 }")
	if _, err := tp.tcp(tp.client, netip.Addr{}, web, slow); err == nil {
		t.Fatal("the Service still answers without its map element; the test is broken")
	}
	resync("after an element was deleted by hand", true)
	loopharness.Eventually(t, "web repaired", 10*time.Second, tp.reaches(web, "pod-b"))
}
