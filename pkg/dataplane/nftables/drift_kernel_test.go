//go:build kernel

package nftables

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
	"github.com/sluiceproxy/sluice/test/loopharness"
)

func driftCount(kind string) float64 {
	return dataplane.DriftRepairs(dataplane.ModeNFTables, model.IPv4)[kind]
}

// TestDriftRepairsAreCounted: full resyncs that find the table as the backend wrote it
// count nothing; one that finds an element deleted and a chain flushed by hand counts
// one element and one rule repair.
func TestDriftRepairsAreCounted(t *testing.T) {
	_, b, ns := trafficSetup(t, model.IPv4)
	kinds := metrics.DriftKinds[string(dataplane.ModeNFTables)]
	before := map[string]float64{}
	for _, k := range kinds {
		before[k] = driftCount(k)
	}
	// Partial and full syncs of sluice's own changes are not drift.
	sp := svc("t", "nodeport", "http", model.TCP, "172.30.0.12", 80).NodePort(30080).Endpoints("10.180.0.3:80", "10.180.0.1:80@local").Build()
	ns.SetService(sp.Name.NamespacedName, []*model.ServicePort{sp}, nil)
	mustApply(t, b, ns, changed("t/nodeport"))
	mustApply(t, b, ns, model.Changes{Full: true})
	mustApply(t, b, ns, model.Changes{Full: true})
	for _, k := range kinds {
		if d := driftCount(k) - before[k]; d != 0 {
			t.Fatalf("full syncs over the table as sluice wrote it counted %v %s repairs", d, k)
		}
	}

	nft(t, "delete", "element", "ip", kubeProxyTable, serviceIPsMap, "{ 172.30.0.10 . tcp . 80 }")
	nft(t, "flush", "chain", "ip", kubeProxyTable, chainNamesFor(sp.Name).cluster)
	mustApply(t, b, ns, model.Changes{Full: true})
	want := map[string]float64{"element": 1, "rule": 1}
	for _, k := range kinds {
		if d := driftCount(k) - before[k]; d != want[k] {
			t.Errorf("sluice_drift_repairs_total{kind=%q} grew by %v, want %v", k, d, want[k])
		}
	}
}

// TestDeletedElementIsRepairedBySyncLoop: the sync loop over the real backend (syncPeriod
// 1 s, the nftables mode's full resync at every syncPeriod) repairs a map element deleted
// by hand within syncPeriod, with nothing else changing, and counts the repair.
func TestDeletedElementIsRepairedBySyncLoop(t *testing.T) {
	resetTable(t)
	tp := newTopology(t, model.IPv4)
	tp.addPod("pod-a", "10.180.0.1")
	cfg := testConfig(model.IPv4)
	cfg.SyncPeriod = time.Second
	b := newTestBackend(t, cfg, fixedAddrs(testNodeIP))
	h := loopharness.New(t, loopharness.Config{Backends: []dataplane.Backend{b}, SyncPeriod: time.Second,
		Node: model.NodeInfo{Name: "node1", IPs: []netip.Addr{testNodeIP}}})
	h.Set(loopharness.Service("ns", "web", "172.30.0.10", 80), loopharness.EndpointSlice("ns", "web", 80, "10.180.0.1"))
	h.Start(t)
	loopharness.Eventually(t, "web programmed", 10*time.Second, tp.reaches(ap("172.30.0.10", 80), "pod-a"))
	time.Sleep(1500 * time.Millisecond) // a full resync with the table as written: no repair
	before := driftCount("element")

	// The deletion must be seen to break the Service before the repair is awaited. On a
	// loaded machine the next resync may repair it before the probe runs (CI saw that):
	// then the repair is counted and the deletion is made again, right after a sync.
	var deleted time.Time
	for attempt := 1; ; attempt++ {
		syncs := h.Status(model.IPv4).Syncs
		h.WaitFor(t, "a resync", 5*time.Second, func(st syncloop.FamilyStatus) bool { return st.Syncs > syncs })
		repairedBefore := driftCount("element")
		nft(t, "delete", "element", "ip", kubeProxyTable, serviceIPsMap, "{ 172.30.0.10 . tcp . 80 }")
		deleted = time.Now()
		_, err := tp.tcp(tp.client, netip.Addr{}, ap("172.30.0.10", 80), slow)
		if err != nil {
			break // broken, as it must be
		}
		if driftCount("element") == repairedBefore {
			t.Fatal("the Service still answers without its map element, and nothing repaired it; the test is broken")
		}
		if attempt == 5 {
			t.Fatal("every deletion was repaired before a probe could see it broken")
		}
		t.Logf("attempt %d: the resync repaired the element before the probe; deleting it again", attempt)
		before = driftCount("element")
	}
	loopharness.Eventually(t, "web repaired within syncPeriod (1 s, plus 2 s of slack for a loaded machine)", 3*time.Second, tp.reaches(ap("172.30.0.10", 80), "pod-a"))
	t.Logf("repaired %v after the deletion", time.Since(deleted).Round(10*time.Millisecond))
	if d := driftCount("element") - before; d != 1 {
		t.Errorf("sluice_drift_repairs_total{kind=element} grew by %v, want 1", d)
	}
}
