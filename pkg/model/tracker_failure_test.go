package model

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
)

// applyFails reports to the tracker that the sync applied Service name in IPv4 and that
// it failed: the tracker holds it.
func applyFails(tr *Tracker, name string) {
	tr.Applied(IPv4, sets.New(nn(name)))
	tr.Hold(IPv4, nn(name))
}

// addFailing adds svc, drains the tracker, and reports that applying svc failed.
func addFailing(tr *Tracker, src *modeltest.Source, svc *v1.Service) {
	upsertService(tr, src, svc)
	tr.Drain()
	applyFails(tr, svc.Name)
}

// appliedAB returns an IPv4 tracker whose state, applied, holds Service a with endpoint
// 10.0.0.1:8080 and Service b (172.30.0.2) without endpoints.
func appliedAB() (*Tracker, *modeltest.Source) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	drainAndApply(tr)
	return tr, src
}

// endpointsOf returns the endpoint addresses a state holds for Service name.
func endpointsOf(st *NodeState, name string) []string {
	var out []string
	for _, sp := range st.PortsOf(nn(name)) {
		for _, e := range sp.AllEndpoints {
			out = append(out, e.String())
		}
	}
	return out
}

// TestTrackerHeldServiceKeepsItsLastGoodVersion: a Service whose change failed is held
// back with the version last applied in the state (what a full sync then programs), not
// reported until Retry or a change of its own, and reported again after either.
func TestTrackerHeldServiceKeepsItsLastGoodVersion(t *testing.T) {
	tr, src := appliedAB()

	// a's update fails: it is held with its old endpoint in the state.
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.9")))
	states, changes, _ := tr.Drain()
	wantChanged(t, changes[IPv4], false, "a")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.9:8080" {
		t.Fatalf("before the failure the state holds %v", got)
	}
	applyFails(tr, "a")
	states, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false)
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Fatalf("a held: the state holds %v, want its last good endpoint 10.0.0.1:8080", got)
	}
	tr.Applied(IPv4, nil)

	// Another Service's change does not bring it back; a full sync programs its old version.
	tr.OnServiceCIDRsChange([]netip.Prefix{netip.MustParsePrefix("172.30.0.0/16")})
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2"), withPorts(v1.ServicePort{Name: "p", Port: 81, Protocol: v1.ProtocolTCP})))
	states, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], true, "b")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Fatalf("a held through a full sync: the state holds %v", got)
	}
	tr.Applied(IPv4, nil)

	// Its retry is due: it is reported with its new version.
	tr.Retry(nn("a"))
	states, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false, "a")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.9:8080" {
		t.Fatalf("a retried: the state holds %v", got)
	}
	// It fails again and is held again, with the same last good version.
	applyFails(tr, "a")
	states, _, _ = tr.Drain()
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Fatalf("a held again: the state holds %v", got)
	}
	tr.Applied(IPv4, nil)

	// A change of its own brings it back at once.
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.7")))
	states, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false, "a")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.7:8080" {
		t.Fatalf("a changed: the state holds %v", got)
	}
	tr.Applied(IPv4, nil)

	// Applied: the new version is now the last good one; a later failure holds it.
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.8")))
	tr.Drain()
	applyFails(tr, "a")
	states, _, _ = tr.Drain()
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.7:8080" {
		t.Fatalf("after a successful apply the last good version is %v, want 10.0.0.7:8080", got)
	}
}

// TestTrackerHeldNewServiceIsAbsent: a new Service that fails is absent from the state
// while held; one that failed before any apply succeeded has no last good version and
// keeps its new one.
func TestTrackerHeldNewServiceIsAbsent(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	addFailing(tr, src, makeService("first"))
	states, changes, _ := tr.Drain()
	wantChanged(t, changes[IPv4], false)
	if len(states[IPv4].PortsOf(nn("first"))) != 1 {
		t.Error("a Service that failed in the first sync left the state (its last good version is unknown)")
	}
	tr.Applied(IPv4, nil)

	addFailing(tr, src, makeService("new", withClusterIPs("172.30.0.5")))
	states, _, _ = tr.Drain()
	if ports := states[IPv4].PortsOf(nn("new")); len(ports) != 0 {
		t.Errorf("a new Service that failed is in the state while held: %v", ports)
	}
	tr.Applied(IPv4, nil)
	tr.Retry(nn("new"), nn("first"))
	states, changes, _ = tr.Drain()
	wantChanged(t, changes[IPv4], false, "new", "first")
	if len(states[IPv4].PortsOf(nn("new"))) != 1 {
		t.Error("the retried Service is not back in the state")
	}
}

// TestTrackerComputePanicKeepsStateAndRetries: a panic computing one Service is reported,
// leaves that Service's state alone, does not stop the others, and the next Drain
// computes it again.
func TestTrackerComputePanicKeepsStateAndRetries(t *testing.T) {
	tr, src := appliedAB()

	broken := true
	tr.computeService = func(svc *v1.Service, sl []*discoveryv1.EndpointSlice, n NodeInfo, f IPFamily, o Options) ([]*ServicePort, []Problem) {
		if broken && svc != nil && svc.Name == "a" {
			panic("index out of range")
		}
		return ComputeService(svc, sl, n, f, o)
	}
	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.9")))
	upsertSlice(tr, src, makeSlice("b", "b-1", IPv4, 8080, makeEndpoint("10.0.0.2")))
	states, changes, info := tr.Drain()
	if err := info.ComputeFailed[nn("a")]; err == nil || !strings.Contains(err.Error(), "index out of range") || !strings.Contains(err.Error(), "tracker_failure_test.go") {
		t.Fatalf("ComputeFailed = %v, want a's panic with its stack", info.ComputeFailed)
	}
	wantChanged(t, changes[IPv4], false, "b")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Errorf("a's state changed although computing it panicked: %v", got)
	}
	if got := endpointsOf(states[IPv4], "b"); len(got) != 1 {
		t.Errorf("b was not computed: %v", got)
	}
	tr.Applied(IPv4, nil)

	// Nothing new happens, but a is computed again by the next Drain.
	broken = false
	states, changes, info = tr.Drain()
	if len(info.ComputeFailed) != 0 {
		t.Fatalf("ComputeFailed = %v", info.ComputeFailed)
	}
	wantChanged(t, changes[IPv4], false, "a")
	if got := endpointsOf(states[IPv4], "a"); len(got) != 1 || got[0] != "10.0.0.9:8080" {
		t.Errorf("a was not recomputed: %v", got)
	}
}

// TestTrackerPanicInDrainPutsTheWorkBack: a panic in Drain outside one Service's
// computation loses nothing: the next Drain reports the same Services, events and
// node change.
func TestTrackerPanicInDrainPutsTheWorkBack(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	upsertService(tr, src, makeService("a"))
	drainAndApply(tr)

	upsertSlice(tr, src, makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")))
	upsertService(tr, src, makeService("b", withClusterIPs("172.30.0.2")))
	tr.OnNodeChange(NodeInfo{Name: testNode.Name, Zone: testNode.Zone, IPs: []netip.Addr{netip.MustParseAddr("192.168.0.9")}})
	tr.drainHook = func() { panic("boom") }
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic to go on to the caller", r)
			}
		}()
		tr.Drain()
	}()
	if p := tr.Pending(); p.Services != 1 || p.EndpointSlices != 1 {
		t.Errorf("pending after the panic = %+v, want the drained events back", p)
	}
	tr.drainHook = nil
	_, changes, info := tr.Drain()
	wantChanged(t, changes[IPv4], true, "a", "b")
	if info.ServiceEvents != 1 || info.EndpointSliceEvents != 1 || !info.NodeChanged || info.Recomputed != 2 {
		t.Errorf("info after the panic = %+v", info)
	}
}

// TestTrackerUnappliedAndHeldServices: a held Service whose state shows its last good
// version is applied; one whose last good version is unknown shows a version not applied.
func TestTrackerUnappliedAndHeldServices(t *testing.T) {
	tr, src := newTestTracker(Options{Families: []IPFamily{IPv4}})
	addFailing(tr, src, makeService("first"))
	addFailing(tr, src, makeService("later", withClusterIPs("172.30.0.5")))
	if got := tr.Unapplied(IPv4); len(got) != 1 || got[0] != nn("first") {
		t.Errorf("Unapplied = %v, want only ns/first (later's state is its last good version: absent)", got)
	}
}
