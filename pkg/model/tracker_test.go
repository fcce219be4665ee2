package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

// stateDiff compares whole NodeStates, including the unexported index.
func stateDiff(want, got map[IPFamily]*NodeState) string {
	return cmp.Diff(want, got, cmp.AllowUnexported(NodeState{}), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}))
}

// newTestTracker returns a tracker over a fresh fake source.
func newTestTracker(opts Options) (*Tracker, *modeltest.Source) {
	src := modeltest.NewSource()
	return NewTracker(TrackerConfig{Source: src, Node: testNode, Options: opts}), src
}

// upsertService stores svc and calls the matching handler.
func upsertService(tr *Tracker, src *modeltest.Source, svc *v1.Service) {
	if old := src.PutService(svc); old != nil {
		tr.OnServiceUpdate(old, svc)
	} else {
		tr.OnServiceAdd(svc)
	}
}

func upsertSlice(tr *Tracker, src *modeltest.Source, sl *discoveryv1.EndpointSlice) {
	if old := src.PutSlice(sl); old != nil {
		tr.OnEndpointSliceUpdate(old, sl)
	} else {
		tr.OnEndpointSliceAdd(sl)
	}
}

// drainAndApply drains and records every family as applied without failures.
func drainAndApply(tr *Tracker) (map[IPFamily]*NodeState, map[IPFamily]Changes, DrainInfo) {
	states, changes, info := tr.Drain()
	for f := range states {
		tr.Applied(f, nil)
	}
	return states, changes, info
}

// wantChanged checks a family's Changes.
func wantChanged(t *testing.T, c Changes, full bool, names ...string) {
	t.Helper()
	want := sets.New[types.NamespacedName]()
	for _, n := range names {
		want.Insert(nn(n))
	}
	if c.Full != full || !c.Services.Equal(want) {
		t.Errorf("Changes = {Full: %v, Services: %v}, want {Full: %v, Services: %v}", c.Full, c.Services.UnsortedList(), full, want.UnsortedList())
	}
}

func TestTrackerFirstDrainIsFullAndMatchesCompute(t *testing.T) {
	tr, src := newTestTracker(Options{})
	upsertService(tr, src, makeService("a", withClusterIPs("172.30.0.1", "fd00:30::1")))
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	states, changes, info := tr.Drain()
	wantChanged(t, changes[IPv4], true, "a")
	wantChanged(t, changes[IPv6], true, "a")
	if info.ServiceEvents != 1 || info.EndpointSliceEvents != 1 || info.Recomputed != 1 {
		t.Errorf("info %+v", info)
	}
	svcs, slices := src.All()
	if d := stateDiff(Compute(svcs, slices, testNode, nil, Options{}), states); d != "" {
		t.Errorf("tracker differs from Compute:\n%s", d)
	}
	tr.Applied(IPv4, nil)
	tr.Applied(IPv6, nil)
	_, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false)
}

func TestTrackerNoOpUpdateYieldsNoChange(t *testing.T) {
	tr, src := newTestTracker(Options{})
	svc := makeService("a")
	svc.ResourceVersion = "1"
	sl := makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1"))
	sl.ResourceVersion = "1"
	upsertService(tr, src, svc)
	upsertSlice(tr, src, sl)
	drainAndApply(tr)

	// Resync: the same objects again. Dropped by the handlers.
	tr.OnServiceUpdate(svc, svc)
	tr.OnEndpointSliceUpdate(sl, sl)
	if p := tr.Pending(); p.Services != 0 || p.EndpointSlices != 0 {
		t.Errorf("resync recorded as pending: %+v", p)
	}
	// A real update of fields the proxy ignores: recomputed, found equal, not reported.
	svc2 := svc.DeepCopy()
	svc2.ResourceVersion = "2"
	svc2.Labels = map[string]string{"team": "x"}
	svc2.Spec.Selector = map[string]string{"app": "y"}
	upsertService(tr, src, svc2)
	sl2 := sl.DeepCopy()
	sl2.ResourceVersion = "2"
	sl2.Endpoints[0].TargetRef = &v1.ObjectReference{Kind: "Pod", Name: "p"}
	upsertSlice(tr, src, sl2)

	states, changes, info := tr.Drain()
	wantChanged(t, changes[IPv4], false)
	if info.Recomputed != 1 {
		t.Errorf("Recomputed = %d", info.Recomputed)
	}
	if states[IPv4].Services[ServicePortName{NamespacedName: nn("a"), Port: "p80", Protocol: TCP}] == nil {
		t.Error("port lost")
	}
}

func TestTrackerPublishedServicePortsAreNeverModified(t *testing.T) {
	tr, src := newTestTracker(Options{})
	upsertService(tr, src, makeService("a"))
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	states, _, _ := drainAndApply(tr)
	name := ServicePortName{NamespacedName: nn("a"), Port: "p80", Protocol: TCP}
	kept := states[IPv4].Services[name]
	copyOfKept := *kept
	copyOfKept.AllEndpoints = append([]Endpoint(nil), kept.AllEndpoints...)

	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1"), makeEndpoint("10.0.0.2")))
	states, changes, _ := drainAndApply(tr)
	wantChanged(t, changes[IPv4], false, "a")
	if states[IPv4].Services[name] == kept {
		t.Error("changed port not replaced")
	}
	if d := diff(&copyOfKept, kept); d != "" {
		t.Errorf("published port modified:\n%s", d)
	}
}

func TestTrackerFailedServicesReportedAgain(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	drainAndApply(tr)

	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	upsertSlice(tr, src, makeSlice("b", "b-1", IPv4, 8080, makeEndpoint("10.0.0.2")))
	_, changes, _ := tr.Drain()
	wantChanged(t, changes[IPv4], false, "a", "b")
	tr.Applied(IPv4, sets.New(nn("b")))

	// Nothing new happened, but b failed: it is reported again, a is not.
	_, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false, "b")
	tr.Applied(IPv4, nil)
	_, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false)
}

func TestTrackerWholeSyncFailureMakesNextFullAndKeepsChanges(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	drainAndApply(tr)

	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	_, changes, _ := tr.Drain()
	wantChanged(t, changes[IPv4], false, "a")
	tr.Failed(IPv4)

	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	_, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], true, "a", "b")
	tr.Applied(IPv4, nil)
	_, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false)
}

func TestTrackerDeletedServiceReported(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	svc := makeService("a")
	upsertService(tr, src, svc)
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	drainAndApply(tr)

	src.DeleteService(nn("a"))
	tr.OnServiceDelete(svc)
	states, changes, _ := drainAndApply(tr)
	wantChanged(t, changes[IPv4], false, "a")
	if len(states[IPv4].Services) != 0 {
		t.Errorf("deleted Service still in state: %v", states[IPv4].Services)
	}
}

func TestTrackerNodeZoneChangeRecomputesEverythingAndIsFull(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080,
		makeEndpoint("10.0.0.1", zoneHints("zone-a")), makeEndpoint("10.0.0.2", zoneHints("zone-b"))))
	states, _, _ := drainAndApply(tr)
	name := ServicePortName{NamespacedName: nn("a"), Port: "p80", Protocol: TCP}
	if got := endpointStrings(states[IPv4].Services[name].ClusterEndpoints); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Fatalf("zone-a endpoints %v", got)
	}

	node := testNode
	node.Zone = "zone-b"
	tr.OnNodeChange(node)
	states, changes, info := drainAndApply(tr)
	if !info.NodeChanged || info.Recomputed != 2 {
		t.Errorf("info %+v", info)
	}
	wantChanged(t, changes[IPv4], true, "a")
	if got := endpointStrings(states[IPv4].Services[name].ClusterEndpoints); len(got) != 1 || got[0] != "10.0.0.2:8080" {
		t.Errorf("zone-b endpoints %v", got)
	}
	if states[IPv4].Node.Zone != "zone-b" {
		t.Errorf("node %+v", states[IPv4].Node)
	}
	svcs, slices := src.All()
	if d := stateDiff(Compute(svcs, slices, node, nil, Options{Families: []IPFamily{IPv4}}), states); d != "" {
		t.Errorf("tracker differs from Compute:\n%s", d)
	}
}

func TestTrackerNodeIPChangeIsFullWithoutRecompute(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	drainAndApply(tr)

	tr.OnNodeChange(testNode) // unchanged: nothing recorded
	_, changes, info := drainAndApply(tr)
	if info.NodeChanged || changes[IPv4].Full {
		t.Errorf("unchanged node reported: %+v %+v", info, changes[IPv4])
	}

	node := testNode
	node.IPs = addrs("192.168.0.11")
	tr.OnNodeChange(node)
	states, changes, info := drainAndApply(tr)
	if !info.NodeChanged || info.Recomputed != 0 || !changes[IPv4].Full {
		t.Errorf("info %+v changes %+v", info, changes[IPv4])
	}
	if d := diff(addrs("192.168.0.11"), states[IPv4].Node.IPs); d != "" {
		t.Error(d)
	}
}

func TestTrackerServiceCIDRsChangeIsFull(t *testing.T) {
	tr, _ := newTestTracker(Options{})
	drainAndApply(tr)
	tr.OnServiceCIDRsChange(prefixes("172.30.0.0/16", "fd00:30::/64"))
	states, changes, info := drainAndApply(tr)
	if !info.ServiceCIDRsChanged || !changes[IPv4].Full || !changes[IPv6].Full {
		t.Errorf("info %+v changes %+v", info, changes)
	}
	if d := diff(prefixes("fd00:30::/64"), states[IPv6].ServiceCIDRs); d != "" {
		t.Error(d)
	}
	tr.OnServiceCIDRsChange(prefixes("172.30.0.0/16", "fd00:30::/64"))
	if _, changes, _ = drainAndApply(tr); changes[IPv4].Full {
		t.Error("unchanged CIDRs made a Full sync")
	}
}

func TestTrackerSliceHandling(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	drainAndApply(tr)

	t.Run("slices without the service-name label are ignored", func(t *testing.T) {
		sl := makeSlice("a", "stray", IPv4, 8080, makeEndpoint("10.0.0.1"))
		sl.Labels = nil
		tr.OnEndpointSliceAdd(sl)
		if p := tr.Pending(); p.EndpointSlices != 0 {
			t.Errorf("pending %+v", p)
		}
	})
	t.Run("slices of an untracked family are ignored", func(t *testing.T) {
		tr.OnEndpointSliceAdd(makeSlice("a", "a-v6", IPv6, 8080, makeEndpoint("fd00:10::1")))
		if p := tr.Pending(); p.EndpointSlices != 0 {
			t.Errorf("pending %+v", p)
		}
	})
	t.Run("a slice moving to another Service dirties both", func(t *testing.T) {
		upsertSlice(tr, src, makeSlice("a", "x-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
		drainAndApply(tr)
		upsertSlice(tr, src, makeSlice("b", "x-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
		states, changes, _ := drainAndApply(tr)
		wantChanged(t, changes[IPv4], false, "a", "b")
		svcs, slices := src.All()
		if d := stateDiff(Compute(svcs, slices, testNode, nil, Options{Families: []IPFamily{IPv4}}), states); d != "" {
			t.Errorf("tracker differs from Compute:\n%s", d)
		}
	})
	t.Run("a deleted slice removes its endpoints", func(t *testing.T) {
		tr.OnEndpointSliceDelete(src.DeleteSlice(types.NamespacedName{Namespace: testNS, Name: "x-1"}))
		states, changes, _ := drainAndApply(tr)
		wantChanged(t, changes[IPv4], false, "b")
		name := ServicePortName{NamespacedName: nn("b"), Port: "p80", Protocol: TCP}
		if sp := states[IPv4].Services[name]; sp.AllEndpoints != nil || sp.HasAnyEndpoints {
			t.Errorf("endpoints left: %+v", sp)
		}
	})
}

func TestTrackerPendingCounts(t *testing.T) {
	tr, src := newTestTracker(Options{})
	upsertService(tr, src, makeService("a"))
	upsertService(tr, src, makeService("a", withClusterIPs("172.30.0.9")))
	upsertService(tr, src, makeService("b"))
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080))
	upsertSlice(tr, src, makeSlice("a", "a-2", IPv4, 8080))
	upsertSlice(tr, src, makeSlice("c", "c-1", IPv4, 8080))
	if p := tr.Pending(); p.Services != 2 || p.EndpointSlices != 3 {
		t.Errorf("pending %+v, want 2 Services and 3 slice events", p)
	}
	_, _, info := tr.Drain()
	if info.ServiceEvents != 3 || info.EndpointSliceEvents != 3 || info.Recomputed != 3 {
		t.Errorf("info %+v", info)
	}
	if p := tr.Pending(); p != (PendingChanges{}) {
		t.Errorf("pending after drain %+v", p)
	}
}

func TestTrackerSyncedNeedsBothCaches(t *testing.T) {
	notified := 0
	tr := NewTracker(TrackerConfig{Source: modeltest.NewSource(), Notify: func() { notified++ }})
	if tr.Synced() {
		t.Error("synced at start")
	}
	tr.OnServicesSynced()
	if tr.Synced() {
		t.Error("synced with Services only")
	}
	tr.OnEndpointSlicesSynced()
	if !tr.Synced() {
		t.Error("not synced with both")
	}
	if notified != 2 {
		t.Errorf("Notify called %d times", notified)
	}
}

func TestTrackerTriggerTimes(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	src := modeltest.NewSource()
	tr := NewTracker(TrackerConfig{Source: src, Node: testNode, StartTime: start, Options: Options{Families: []IPFamily{IPv4}}})
	at := func(sl *discoveryv1.EndpointSlice, ts time.Time, rv int) *discoveryv1.EndpointSlice {
		sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: ts.Format(time.RFC3339Nano)}
		sl.ResourceVersion = strconv.Itoa(rv)
		return sl
	}
	upsertService(tr, src, makeService("a"))
	upsertSlice(tr, src, at(makeSlice("a", "a-1", IPv4, 8080), start.Add(-time.Minute), 1)) // before start: dropped
	upsertSlice(tr, src, at(makeSlice("b", "b-1", IPv4, 8080), start.Add(3*time.Second), 1))
	upsertSlice(tr, src, at(makeSlice("b", "b-2", IPv4, 8080), start.Add(2*time.Second), 1)) // earliest for b
	upsertSlice(tr, src, at(makeSlice("b", "b-1", IPv4, 8080), start.Add(5*time.Second), 2))
	_, _, info := drainAndApply(tr)
	want := map[types.NamespacedName]time.Time{nn("b"): start.Add(2 * time.Second)}
	if d := diff(want, info.TriggerTimes); d != "" {
		t.Errorf("TriggerTimes (-want +got):\n%s", d)
	}

	// An update that keeps the annotation was not triggered by a new change.
	sl := src.Slice(types.NamespacedName{Namespace: testNS, Name: "b-1"}).DeepCopy()
	sl.ResourceVersion = "3"
	sl.Labels["extra"] = "x"
	upsertSlice(tr, src, sl)
	// A malformed annotation is ignored.
	bad := makeSlice("b", "b-3", IPv4, 8080)
	bad.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday"}
	upsertSlice(tr, src, bad)
	if _, _, info = drainAndApply(tr); len(info.TriggerTimes) != 0 {
		t.Errorf("TriggerTimes %v", info.TriggerTimes)
	}
}

func TestTrackerReportsProblemChangesOnce(t *testing.T) {
	tr, src := newTestTracker(Options{})
	bad := makeService("a", withClusterIPs("172.30.0.1", "fd00:30::1"), func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{"nonsense"}
	})
	upsertService(tr, src, bad)
	_, _, info := drainAndApply(tr)
	if got := info.Problems[nn("a")]; len(got) != 1 {
		t.Fatalf("problems %v: the same problem from both families must be reported once", got)
	}

	// Recomputed without change: not reported again.
	bad2 := bad.DeepCopy()
	bad2.Labels = map[string]string{"x": "y"}
	upsertService(tr, src, bad2)
	if _, _, info = drainAndApply(tr); info.Problems != nil {
		t.Errorf("unchanged problems reported: %v", info.Problems)
	}

	// Fixed: reported as gone, and the ports did not change so no Service changed.
	fixed := bad2.DeepCopy()
	fixed.Spec.ExternalIPs = nil
	upsertService(tr, src, fixed)
	states, changes, info := drainAndApply(tr)
	if got, ok := info.Problems[nn("a")]; !ok || len(got) != 0 {
		t.Errorf("cleared problems not reported: %v", info.Problems)
	}
	wantChanged(t, changes[IPv4], false)
	if len(states[IPv4].Problems) != 0 {
		t.Errorf("state problems %v", states[IPv4].Problems)
	}
}

func TestTrackerSnapshotIsIndependent(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	drainAndApply(tr)
	snap := tr.Snapshot(IPv4)
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	drainAndApply(tr)
	if len(snap.Services) != 1 || len(tr.Snapshot(IPv4).Services) != 2 {
		t.Errorf("snapshot %d ports, live %d", len(snap.Services), len(tr.Snapshot(IPv4).Services))
	}
	if tr.Snapshot(IPv6) != nil {
		t.Error("snapshot of an untracked family")
	}
}

// randomWorld generates random changes to a small cluster: few names so that objects are
// often updated, moved and deleted, and every rule of the model gets exercised.
type randomWorld struct {
	rng *rand.Rand
	rv  int
}

func (w *randomWorld) pick(n int) int { return w.rng.IntN(n) }

func (w *randomWorld) chance(p float64) bool { return w.rng.Float64() < p }

func (w *randomWorld) nextRV() string { w.rv++; return strconv.Itoa(w.rv) }

func (w *randomWorld) serviceName() string { return fmt.Sprintf("s%d", w.pick(6)) }

func (w *randomWorld) service() *v1.Service {
	name := w.serviceName()
	idx := name[1:]
	svc := makeService(name, withClusterIPs("172.30.0."+idx))
	if w.chance(0.4) {
		withClusterIPs("172.30.0."+idx, "fd00:30::"+idx)(svc)
	} else if w.chance(0.2) {
		withClusterIPs("fd00:30::" + idx)(svc)
	}
	svc.Spec.Type = []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer}[w.pick(3)]
	switch w.pick(12) {
	case 0:
		svc.Spec.Type = v1.ServiceTypeExternalName
	case 1:
		withClusterIPs("None")(svc)
	case 2:
		svc.Labels = map[string]string{LabelServiceProxyName: "other"}
	}
	svc.Spec.Ports = nil
	for i := range 1 + w.pick(2) {
		p := v1.ServicePort{Name: []string{"p80", "dns", "x"}[w.pick(3)], Port: int32(80 + i), Protocol: []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP}[w.pick(2)]}
		if svc.Spec.Type != v1.ServiceTypeClusterIP {
			p.NodePort = int32(30000 + w.pick(3))
		}
		svc.Spec.Ports = append(svc.Spec.Ports, p)
	}
	if w.chance(0.3) {
		svc.Spec.ExternalIPs = []string{"203.0.113.1", "2001:db8::1", "bad"}[:1+w.pick(3)]
	}
	if w.chance(0.3) {
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.2"}, {IP: "2001:db8::2"}}
	}
	if w.chance(0.3) {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = 32000
	}
	if w.chance(0.3) {
		svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if w.chance(0.2) {
		svc.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "0.0.0.0/0", "2001:db8::/32"}[w.pick(3):]
	}
	if w.chance(0.2) {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	if w.chance(0.1) {
		svc.Annotations = map[string]string{AnnotationIPVSScheduler: []string{"rr", "bogus"}[w.pick(2)]}
	}
	svc.ResourceVersion = w.nextRV()
	return svc
}

func (w *randomWorld) slice() *discoveryv1.EndpointSlice {
	family := IPv4
	if w.chance(0.3) {
		family = IPv6
	}
	name := fmt.Sprintf("%s-%s-%d", w.serviceName(), family, w.pick(2))
	sl := makeSlice(w.serviceName(), name, family, int32(8080+w.pick(2)))
	sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolUDP)})
	if w.chance(0.1) {
		sl.Labels = nil
	}
	for range w.pick(5) {
		n := w.pick(6)
		ip := fmt.Sprintf("10.0.0.%d", n)
		if family == IPv6 {
			ip = fmt.Sprintf("fd00:10::%d", n)
		}
		if w.chance(0.05) {
			ip = "bad"
		}
		var mods []func(*discoveryv1.Endpoint)
		node := []string{"node-a", "node-b", "node-c"}[w.pick(3)]
		mods = append(mods, onNode(node, map[string]string{"node-a": "zone-a", "node-b": "zone-b", "node-c": "zone-a"}[node]))
		switch w.pick(4) {
		case 0:
			mods = append(mods, terminatingServing)
		case 1:
			mods = append(mods, terminatingNotServing)
		}
		if w.chance(0.5) {
			mods = append(mods, zoneHints([]string{"zone-a", "zone-b"}[w.pick(2)]))
		}
		if w.chance(0.3) {
			mods = append(mods, nodeHints(node))
		}
		sl.Endpoints = append(sl.Endpoints, makeEndpoint(ip, mods...))
	}
	sl.ResourceVersion = w.nextRV()
	return sl
}

// appliedView is what a backend would have programmed for one family, Service by Service.
type appliedView map[types.NamespacedName][]*ServicePort

func (v appliedView) portsEqual(st *NodeState, name types.NamespacedName) bool {
	return portsEqual(st, name, v[name])
}

// TestTrackerMatchesComputeOnRandomChanges is the tracker's property test: after any
// sequence of handler events, a Drain gives the same states as Compute on the same objects,
// and Changes name every Service that differs from what was last applied successfully.
func TestTrackerMatchesComputeOnRandomChanges(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			w := &randomWorld{rng: rand.New(rand.NewPCG(seed, 42))}
			opts := Options{}
			tr, src := newTestTracker(opts)
			node := testNode
			var cidrs []netip.Prefix
			applied := map[IPFamily]appliedView{IPv4: {}, IPv6: {}}
			lastFailed := map[IPFamily]bool{}

			for step := range 400 {
				switch op := w.pick(20); {
				case op < 5:
					upsertService(tr, src, w.service())
				case op < 6:
					if old := src.DeleteService(nn(w.serviceName())); old != nil {
						tr.OnServiceDelete(old)
					}
				case op < 11:
					upsertSlice(tr, src, w.slice())
				case op < 13:
					s := w.slice()
					if old := src.DeleteSlice(types.NamespacedName{Namespace: testNS, Name: s.Name}); old != nil {
						tr.OnEndpointSliceDelete(old)
					}
				case op < 14:
					// Resync and no-op updates.
					svcs, slices := src.All()
					for _, s := range svcs {
						tr.OnServiceUpdate(s, s)
					}
					for _, s := range slices {
						c := s.DeepCopy()
						c.ResourceVersion = w.nextRV()
						upsertSlice(tr, src, c)
					}
				case op < 15:
					node.Zone = []string{"zone-a", "zone-b", ""}[w.pick(3)]
					if w.chance(0.5) {
						node.IPs = addrs(fmt.Sprintf("192.168.0.%d", 10+w.pick(3)))
					}
					tr.OnNodeChange(node)
				case op < 16:
					cidrs = [][]netip.Prefix{nil, prefixes("172.30.0.0/16"), prefixes("172.30.0.0/16", "fd00:30::/64")}[w.pick(3)]
					tr.OnServiceCIDRsChange(cidrs)
				default:
					states, changes, _ := tr.Drain()
					svcs, slices := src.All()
					if d := stateDiff(Compute(svcs, slices, node, cidrs, opts), states); d != "" {
						t.Fatalf("step %d: tracker differs from Compute (-compute +tracker):\n%s", step, d)
					}
					for f, st := range states {
						c := changes[f]
						if lastFailed[f] && !c.Full {
							t.Fatalf("step %d: %v not Full after a failed sync", step, f)
						}
						names := st.ServiceNames()
						for name := range applied[f] {
							names.Insert(name)
						}
						for name := range names {
							if !applied[f].portsEqual(st, name) && !c.Full && !c.Services.Has(name) {
								t.Fatalf("step %d: %v: %v changed since the last apply but is not in Changes %v", step, f, name, c.Services.UnsortedList())
							}
						}
						// Apply: succeed, fail a few Services, or fail as a whole.
						switch w.pick(5) {
						case 0:
							tr.Failed(f)
							lastFailed[f] = true
							continue
						case 1:
							failed := sets.New[types.NamespacedName]()
							for name := range c.Services {
								if w.chance(0.5) {
									failed.Insert(name)
								}
							}
							tr.Applied(f, failed)
							applyView(applied[f], st, names, failed)
						default:
							tr.Applied(f, nil)
							applyView(applied[f], st, names, nil)
						}
						lastFailed[f] = false
					}
				}
			}
		})
	}
}

// applyView records st as applied for names, except failed ones.
func applyView(v appliedView, st *NodeState, names sets.Set[types.NamespacedName], failed sets.Set[types.NamespacedName]) {
	for name := range names {
		if failed.Has(name) {
			continue
		}
		if ports := st.PortsOf(name); len(ports) > 0 {
			v[name] = ports
		} else {
			delete(v, name)
		}
	}
}

// TestTrackerConcurrentHandlersAndDrain runs handlers on several goroutines while the sync
// goroutine drains and a reader takes snapshots; run it with -race. Once everything has
// settled, a last Drain must agree with Compute.
func TestTrackerConcurrentHandlersAndDrain(t *testing.T) {
	src := modeltest.NewSource()
	var notified atomic.Int64
	tr := NewTracker(TrackerConfig{Source: src, Node: testNode, Notify: func() { notified.Add(1) }})
	var srcMu sync.Mutex // serialises store update + handler, as one informer does per object kind
	stop := make(chan struct{})
	var handlers, others sync.WaitGroup
	for g := range 4 {
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			w := &randomWorld{rng: rand.New(rand.NewPCG(uint64(g), 7))}
			for range 500 {
				srcMu.Lock()
				switch w.pick(4) {
				case 0:
					upsertService(tr, src, w.service())
				case 1:
					if old := src.DeleteService(nn(w.serviceName())); old != nil {
						tr.OnServiceDelete(old)
					}
				default:
					upsertSlice(tr, src, w.slice())
				}
				srcMu.Unlock()
				if g == 0 && w.chance(0.05) {
					n := testNode
					n.Zone = []string{"zone-a", "zone-b"}[w.pick(2)]
					tr.OnNodeChange(n)
				}
				_ = tr.Pending()
			}
		}()
	}
	// untilStopped runs fn over and over in a goroutine until stop is closed.
	untilStopped := func(fn func()) {
		others.Add(1)
		go func() {
			defer others.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fn()
			}
		}()
	}
	// The sync loop, and a debug reader.
	untilStopped(func() { drainAndApply(tr) })
	untilStopped(func() {
		if s := tr.Snapshot(IPv4); s != nil {
			_ = len(s.Services)
		}
	})
	handlers.Wait()
	close(stop)
	others.Wait()

	tr.OnNodeChange(testNode)
	states, _, _ := tr.Drain()
	svcs, slices := src.All()
	if d := stateDiff(Compute(svcs, slices, testNode, nil, Options{}), states); d != "" {
		t.Errorf("tracker differs from Compute after concurrent changes:\n%s", d)
	}
	if notified.Load() == 0 {
		t.Error("Notify never called")
	}
}
