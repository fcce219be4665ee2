package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

func TestFirstSyncProgramsEveryKindOfFrontend(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	state := stateOf(
		fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.1.2:8080@local", "10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/np", "", model.TCP, "172.30.0.11", 80).NodePort(30080).Endpoints("10.180.2.4:8080").Build(),
		fixture.ServicePort("ns/lb", "", model.TCP, "172.30.0.12", 443).NodePort(30443).LoadBalancer("5.6.7.7").ExternalIPs("192.168.99.9").Endpoints("10.180.2.5:8443").Build(),
		fixture.ServicePort("ns/dns", "", model.UDP, "172.30.0.13", 53).Endpoints("10.180.2.6:5353").Build(),
	)
	res := mustApply(t, b, state, model.Changes{Full: true})
	if !res.Full {
		t.Errorf("first Apply was not full")
	}

	wantIPVS(t, k,
		"TCP 5.6.7.7:443 rr", "  -> 10.180.2.5:8443 1",
		"TCP 172.30.0.10:80 rr", "  -> 10.180.1.2:8080 1", "  -> 10.180.2.3:8080 1",
		"TCP 172.30.0.11:80 rr", "  -> 10.180.2.4:8080 1",
		"TCP 172.30.0.12:443 rr", "  -> 10.180.2.5:8443 1",
		"UDP 172.30.0.13:53 rr", "  -> 10.180.2.6:5353 1",
		"TCP 192.168.0.2:30080 rr", "  -> 10.180.2.4:8080 1",
		"TCP 192.168.0.2:30443 rr", "  -> 10.180.2.5:8443 1",
		"TCP 192.168.99.9:443 rr", "  -> 10.180.2.5:8443 1",
	)
	// ClusterIPs, the externalIP and the LB IP are held by the dummy device; NodePorts
	// listen on the node's own address, which is never bound there.
	if diff := cmp.Diff([]string{"172.30.0.10", "172.30.0.11", "172.30.0.12", "172.30.0.13", "192.168.99.9", "5.6.7.7"}, k.dummyAddrs()); diff != "" {
		t.Errorf("kube-ipvs0 addresses (-want +got):\n%s", diff)
	}
	for set, want := range map[string][]string{
		"KUBE-CLUSTER-IP":    {"172.30.0.10,tcp:80", "172.30.0.11,tcp:80", "172.30.0.12,tcp:443", "172.30.0.13,udp:53"},
		"KUBE-NODE-PORT-TCP": {"30080", "30443"},
		"KUBE-LOAD-BALANCER": {"5.6.7.7,tcp:443"},
		"KUBE-EXTERNAL-IP":   {"192.168.99.9,tcp:443"},
		"KUBE-LOOP-BACK":     {"10.180.1.2,tcp:8080,10.180.1.2"},
		"KUBE-IPVS-IPS":      {"172.30.0.10", "172.30.0.11", "172.30.0.12", "172.30.0.13", "192.168.99.9", "5.6.7.7"},
	} {
		if diff := cmp.Diff(want, k.setEntries(set)); diff != "" {
			t.Errorf("ipset %s (-want +got):\n%s", set, diff)
		}
	}
	for _, j := range jumpRules {
		found := false
		for _, r := range k.rules(j.table, j.from) {
			if r == line(j.from, j.args()) {
				found = true
			}
		}
		if !found {
			t.Errorf("jump %s -> %s in %s missing", j.from, j.to, j.table)
		}
	}
	if k.sysctls[sysctlVSConnTrack] != 1 || k.sysctls[sysctlExpireNoDestConn] != 1 || k.sysctls[sysctlExpireQuiescentTemplate] != 1 ||
		k.sysctls[sysctlIPForward] != 1 || k.sysctls[sysctlConnReuseMode] != 1 {
		t.Errorf("sysctls not set: %v", k.sysctls)
	}
	if k.sysctls[sysctlARPIgnore] != 0 {
		t.Errorf("strict ARP set without being asked")
	}
}

func TestSchedulersComeFromConfigAndAnnotation(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{Scheduler: "lc"})
	state := stateOf(
		fixture.ServicePort("ns/default", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/sh", "", model.TCP, "172.30.0.11", 80).Scheduler("sh").Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/mh", "", model.TCP, "172.30.0.12", 80).Scheduler("mh").NodePort(30012).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/sticky", "", model.TCP, "172.30.0.13", 80).Affinity(10800).Endpoints("10.180.2.3:8080").Build(),
	)
	mustApply(t, b, state, model.Changes{Full: true})
	for key, want := range map[vsKey]vsParams{
		{model.TCP, addr("172.30.0.10"), 80}:    {Scheduler: "lc"},
		{model.TCP, addr("172.30.0.11"), 80}:    {Scheduler: "sh"},
		{model.TCP, addr("172.30.0.12"), 80}:    {Scheduler: "mh", Flags: flagSched2},
		{model.TCP, addr("192.168.0.2"), 30012}: {Scheduler: "mh", Flags: flagSched2},
		{model.TCP, addr("172.30.0.13"), 80}:    {Scheduler: "lc", Flags: flagPersistent, Timeout: 10800},
	} {
		vs, ok := k.services[key]
		if !ok {
			t.Errorf("virtual server %s missing", key)
			continue
		}
		if vs.params != want {
			t.Errorf("virtual server %s has %v, want %v", key, vs.params, want)
		}
	}

	// Changing the annotation changes the scheduler in place: the virtual server and its
	// connections stay.
	state = stateOf(
		fixture.ServicePort("ns/default", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/sh", "", model.TCP, "172.30.0.11", 80).Scheduler("wrr").Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/mh", "", model.TCP, "172.30.0.12", 80).Scheduler("mh").NodePort(30012).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/sticky", "", model.TCP, "172.30.0.13", 80).Affinity(10800).Endpoints("10.180.2.3:8080").Build(),
	)
	k.calls = nil
	mustApply(t, b, state, changed("ns/sh"))
	if want := []string{"update-vs 172.30.0.11:80/TCP"}; !slices.Equal(k.calls, want) {
		t.Errorf("calls = %v, want %v", k.calls, want)
	}
}

func TestTrafficPoliciesChooseRealServers(t *testing.T) {
	local, remote := "10.180.1.2:8080", "10.180.2.3:8080"
	cip := func(s string) vsKey { return vsKey{model.TCP, addr(s), 80} }
	np := func(p uint16) vsKey { return vsKey{model.TCP, nodeIP, p} }
	tests := []struct {
		name string
		port *model.ServicePort
		want map[vsKey][]string
		// noLocal are the entries of KUBE-SLUICE-NO-LOCAL-EPS, noEndpoints those of
		// KUBE-SLUICE-NO-ENDPOINTS-TCP (TCP virtual servers without real servers).
		noLocal, noEndpoints []string
	}{{
		name: "cluster policy uses every endpoint",
		port: fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).NodePort(30010).Endpoints(local+"@local", remote).Build(),
		want: map[vsKey][]string{cip("172.30.0.10"): {local, remote}, np(30010): {local, remote}},
	}, {
		name: "external Local uses local endpoints for external frontends only",
		port: fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).NodePort(30010).ExternalLocal().Endpoints(local+"@local", remote).Build(),
		want: map[vsKey][]string{cip("172.30.0.10"): {local, remote}, np(30010): {local}},
	}, {
		name:    "external Local without local endpoints falls back to the cluster's and drops outside traffic",
		port:    fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).NodePort(30010).ExternalLocal().Endpoints(remote).Build(),
		want:    map[vsKey][]string{cip("172.30.0.10"): {remote}, np(30010): {remote}},
		noLocal: []string{"192.168.0.2,tcp:30010"},
	}, {
		name:        "external Local without any endpoint has no real server and nothing to drop",
		port:        fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).NodePort(30010).ExternalLocal().Build(),
		want:        map[vsKey][]string{cip("172.30.0.10"): nil, np(30010): nil},
		noEndpoints: []string{"172.30.0.10,tcp:80", "192.168.0.2,tcp:30010"},
	}, {
		name:        "cluster policy without any endpoint refuses every frontend with a reset",
		port:        fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).NodePort(30010).ExternalIPs("5.6.7.7").Build(),
		want:        map[vsKey][]string{cip("172.30.0.10"): nil, np(30010): nil, cip("5.6.7.7"): nil},
		noEndpoints: []string{"172.30.0.10,tcp:80", "192.168.0.2,tcp:30010", "5.6.7.7,tcp:80"},
	}, {
		name: "UDP without any endpoint is left to IPVS",
		port: fixture.ServicePort("ns/a", "", model.UDP, "172.30.0.10", 53).NodePort(30053).Build(),
		want: map[vsKey][]string{{model.UDP, addr("172.30.0.10"), 53}: nil, {model.UDP, nodeIP, 30053}: nil},
	}, {
		name: "internal Local uses local endpoints for the ClusterIP",
		port: fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).InternalLocal().Endpoints(local+"@local", remote).Build(),
		want: map[vsKey][]string{cip("172.30.0.10"): {local}},
	}, {
		name:        "internal Local without local endpoints leaves the ClusterIP without real servers",
		port:        fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).InternalLocal().NodePort(30010).Endpoints(remote).Build(),
		want:        map[vsKey][]string{cip("172.30.0.10"): nil, np(30010): {remote}},
		noEndpoints: []string{"172.30.0.10,tcp:80"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeNode()
			b, _ := newTestBackend(t, k, Settings{})
			if tc.port.InternalPolicyLocal || tc.port.ExternalPolicyLocal {
				// The model computes Local endpoints only for ports that use them, and Cluster
				// ones only for ports that use those.
				if !tc.port.UsesClusterEndpoints() {
					tc.port.ClusterEndpoints = nil
				}
			}
			mustApply(t, b, stateOf(tc.port), model.Changes{Full: true})
			got := map[vsKey][]string{}
			for key, vs := range k.services {
				var rs []string
				for a := range vs.dests {
					rs = append(rs, a.String())
				}
				slices.Sort(rs)
				got[key] = rs
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("real servers (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.noLocal, k.setEntries("KUBE-SLUICE-NO-LOCAL-EPS")); diff != "" {
				t.Errorf("no-local-endpoints set (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.noEndpoints, k.setEntries("KUBE-SLUICE-NO-ENDPOINTS-TCP")); diff != "" {
				t.Errorf("no-endpoints set (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPartialSyncTouchesOnlyChangedServices(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	var ports []*model.ServicePort
	for i := range 200 {
		ports = append(ports, fixture.ServicePort(fmt.Sprintf("ns/s%03d", i), "", model.TCP, fmt.Sprintf("172.30.1.%d", i), 80).NodePort(int32(30000+i)).Endpoints(fmt.Sprintf("10.180.2.%d:8080", i)).Build())
	}
	mustApply(t, b, stateOf(ports...), model.Changes{Full: true})
	restores := len(k.restores)

	ports[7] = fixture.ServicePort("ns/s007", "", model.TCP, "172.30.1.7", 80).NodePort(30007).Endpoints("10.180.2.7:8080", "10.180.2.99:8080").Build()
	k.calls = nil
	mustApply(t, b, stateOf(ports...), changed("ns/s007"))
	st := b.LastStats()
	if st.Full {
		t.Fatalf("sync was full")
	}
	want := []string{"add-rs 172.30.1.7:80/TCP 10.180.2.99:8080", "add-rs 192.168.0.2:30007/TCP 10.180.2.99:8080"}
	if diff := cmp.Diff(want, k.calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if st.DestinationReads != 2 {
		t.Errorf("read the real servers of %d virtual servers, want the 2 of the changed Service", st.DestinationReads)
	}
	if len(k.restores) != restores {
		t.Errorf("a partial sync that changes no rule wrote the iptables rules")
	}

	// Deleting a Service removes its virtual servers, address and set entries.
	ports = slices.Delete(ports, 7, 8)
	k.calls = nil
	mustApply(t, b, stateOf(ports...), changed("ns/s007"))
	want = []string{"delete-vs 172.30.1.7:80/TCP", "delete-vs 192.168.0.2:30007/TCP",
		"del-entry KUBE-IPVS-IPS 172.30.1.7", "del-entry KUBE-CLUSTER-IP 172.30.1.7,tcp:80", "del-entry KUBE-NODE-PORT-TCP 30007",
		"del-addr kube-ipvs0 172.30.1.7"}
	if diff := cmp.Diff(want, k.calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestGracefulTermination(t *testing.T) {
	k := newFakeNode()
	b, clock := newTestBackend(t, k, Settings{})
	web := vsKey{model.TCP, addr("172.30.0.10"), 80}
	dns := vsKey{model.UDP, addr("172.30.0.53"), 53}
	old, next := addrPort("10.180.2.3:8080"), addrPort("10.180.2.4:8080")
	oldDNS := addrPort("10.180.2.3:5353")
	other := fixture.ServicePort("ns/other", "", model.TCP, "172.30.0.99", 80).Endpoints("10.180.2.9:8080").Build()
	state := func(webEPs, dnsEPs []string) *model.NodeState {
		return stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints(webEPs...).Build(),
			fixture.ServicePort("ns/dns", "", model.UDP, "172.30.0.53", 53).Endpoints(dnsEPs...).Build(), other)
	}
	mustApply(t, b, state([]string{old.String()}, []string{oldDNS.String()}), model.Changes{Full: true})
	k.setConnections(web, old, 1, 0)
	k.setConnections(dns, oldDNS, 0, 1)

	// The endpoint goes: its TCP real server stays at weight 0 while a connection is open;
	// UDP's goes at once.
	mustApply(t, b, state([]string{next.String()}, []string{"10.180.2.4:5353"}), changed("ns/web", "ns/dns"))
	if rs := k.services[web].dests[old]; rs == nil || rs.Weight != 0 {
		t.Fatalf("old TCP real server = %+v, want it kept at weight 0", rs)
	}
	if rs := k.services[web].dests[next]; rs == nil || rs.Weight != 1 {
		t.Fatalf("new TCP real server = %+v, want weight 1", rs)
	}
	if _, ok := k.services[dns].dests[oldDNS]; ok {
		t.Errorf("old UDP real server kept; UDP real servers go at once")
	}

	// Syncs about other Services look at the draining one too; it stays while the
	// connection lives...
	k.calls = nil
	mustApply(t, b, state([]string{next.String()}, []string{"10.180.2.4:5353"}), changed("ns/other"))
	if len(k.calls) != 0 {
		t.Errorf("calls = %v, want none while the connection lives", k.calls)
	}
	// ... and is deleted by the first sync after it ended, even one with no changes.
	k.setConnections(web, old, 0, 0)
	clock.step(time.Second)
	mustApply(t, b, state([]string{next.String()}, []string{"10.180.2.4:5353"}), changed())
	if want := []string{"delete-rs 172.30.0.10:80/TCP 10.180.2.3:8080"}; !slices.Equal(k.calls, want) {
		t.Errorf("calls = %v, want %v", k.calls, want)
	}
	if b.LastStats().Draining != 0 {
		t.Errorf("still draining %d virtual servers", b.LastStats().Draining)
	}
}

func TestEndpointReturningWhileDrainingKeepsItsConnections(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	web := vsKey{model.TCP, addr("172.30.0.10"), 80}
	ep := addrPort("10.180.2.3:8080")
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints(ep.String(), "10.180.2.4:8080").Build()), model.Changes{Full: true})
	k.setConnections(web, ep, 3, 1)
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.4:8080").Build()), changed("ns/web"))
	if k.services[web].dests[ep].Weight != 0 {
		t.Fatalf("real server not draining")
	}
	// Upstream deletes and re-adds it, which (with expire_nodest_conn) kills its
	// connections; sluice puts it back in rotation.
	k.calls = nil
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints(ep.String(), "10.180.2.4:8080").Build()), changed("ns/web"))
	if want := []string{"update-rs 172.30.0.10:80/TCP 10.180.2.3:8080 weight 1"}; !slices.Equal(k.calls, want) {
		t.Errorf("calls = %v, want %v", k.calls, want)
	}
	if rs := k.services[web].dests[ep]; rs.Active != 3 || rs.Weight != 1 {
		t.Errorf("real server = %+v, want weight 1 with its 3 connections", rs)
	}
}

func TestFullSyncRepairsDrift(t *testing.T) {
	k := newFakeNode()
	b, clock := newTestBackend(t, k, Settings{})
	state := stateOf(
		fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).NodePort(30080).Endpoints("10.180.1.2:8080@local", "10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/lb", "", model.TCP, "172.30.0.11", 443).LoadBalancer("5.6.7.7").SourceRanges("198.51.100.0/24").Endpoints("10.180.2.5:8443").Build(),
	)
	mustApply(t, b, state, model.Changes{Full: true})
	want := k.snapshot()
	before := driftCounts()
	clock.step(30 * time.Second)
	mustApply(t, b, state, changed())
	if got := driftCounts(); !maps.Equal(got, before) {
		t.Fatalf("a full sync over what sluice wrote counted repairs: %v -> %v", before, got)
	}

	// Someone deletes things by hand.
	delete(k.services, vsKey{model.TCP, addr("172.30.0.10"), 80})
	delete(k.services[vsKey{model.TCP, nodeIP, 30080}].dests, addrPort("10.180.2.3:8080"))
	k.services[vsKey{model.TCP, addr("172.30.0.11"), 443}].params.Scheduler = "wlc"
	k.links[dummyDevice] = slices.DeleteFunc(k.links[dummyDevice], func(a netip.Addr) bool { return a == addr("5.6.7.7") })
	delete(k.sets["KUBE-CLUSTER-IP"].entries, setEntry{IP: addr("172.30.0.10"), Proto: 6, Port: 80})
	k.tables[tableNAT].chains[chainServices] = nil
	k.tables[tableFilter].chains["INPUT"] = nil
	k.services[vsKey{model.TCP, addr("172.30.7.7"), 80}] = &fakeVS{params: vsParams{Scheduler: "rr"}, dests: map[netip.AddrPort]*realServer{}}

	// A partial sync does not look; the periodic full sync does.
	mustApply(t, b, state, changed())
	clock.step(30 * time.Second)
	res := mustApply(t, b, state, changed())
	if !res.Full {
		t.Fatalf("sync after syncPeriod was not full")
	}
	if diff := cmp.Diff(want, k.snapshot()); diff != "" {
		t.Errorf("kernel after repair (-want +got):\n%s", diff)
	}
	after := driftCounts()
	for kind, n := range map[string]float64{"virtual_server": 3, "real_server": 1, "address": 1, "element": 1, "set": 0, "interface": 0} {
		if d := after[kind] - before[kind]; d != n {
			t.Errorf("sluice_drift_repairs_total{kind=%q} grew by %v, want %v", kind, d, n)
		}
	}
	if d := after["rule"] - before["rule"]; d < 2 {
		t.Errorf("sluice_drift_repairs_total{kind=rule} grew by %v, want the flushed chain and the missing jumps", d)
	}
}

// driftCounts reads sluice_drift_repairs_total of the ipvs mode, IPv4, by kind.
func driftCounts() map[string]float64 { return dataplane.DriftRepairs(dataplane.ModeIPVS, model.IPv4) }

func TestRestartConvergesWithoutDisruption(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	state := stateOf(
		fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).NodePort(30080).Affinity(60).Endpoints("10.180.1.2:8080@local", "10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/lb", "", model.TCP, "172.30.0.11", 443).LoadBalancer("5.6.7.7").ExternalLocal().Endpoints("10.180.1.5:8443@local").Build(),
	)
	mustApply(t, b, state, model.Changes{Full: true})
	want := k.snapshot()

	// A new process: no memory, the kernel as the old one left it.
	b2, _ := newTestBackend(t, k, Settings{})
	k.calls = nil
	mustApply(t, b2, state, model.Changes{Full: true})
	for _, c := range k.calls {
		if c != "restore" {
			t.Errorf("restart changed the kernel: %s", c)
		}
	}
	if diff := cmp.Diff(want, k.snapshot()); diff != "" {
		t.Errorf("kernel after restart (-want +got):\n%s", diff)
	}
}

func TestStartConvergesWhatUpstreamLeft(t *testing.T) {
	k := newFakeNode()
	web := vsKey{model.TCP, addr("172.30.0.10"), 80}
	// Upstream's ipvs mode ran: a virtual server with a real server it left at weight 0
	// (its graceful-termination list died with it), one for a Service gone since, one in
	// excludeCIDRs, an IPv6 one (not this backend's family), its device, sets and chains.
	k.services[web] = &fakeVS{params: vsParams{Scheduler: "rr"}, dests: map[netip.AddrPort]*realServer{
		addrPort("10.180.2.3:8080"): {Addr: addrPort("10.180.2.3:8080"), Weight: 1},
		addrPort("10.180.2.8:8080"): {Addr: addrPort("10.180.2.8:8080"), Weight: 0},
	}}
	k.services[vsKey{model.TCP, addr("172.30.0.66"), 80}] = &fakeVS{params: vsParams{Scheduler: "rr"}, dests: map[netip.AddrPort]*realServer{}}
	k.services[vsKey{model.TCP, addr("172.16.0.1"), 80}] = &fakeVS{params: vsParams{Scheduler: "rr"}, dests: map[netip.AddrPort]*realServer{}}
	k.services[vsKey{model.TCP, addr("fd00:172:30::10"), 80}] = &fakeVS{params: vsParams{Scheduler: "rr"}, dests: map[netip.AddrPort]*realServer{}}
	k.links[dummyDevice] = []netip.Addr{addr("172.30.0.10"), addr("172.30.0.66"), addr("fd00:172:30::10")}
	k.sets["KUBE-CLUSTER-IP"] = &fakeSet{typ: typeHashIPPort, family: model.IPv4, entries: map[setEntry]bool{
		{IP: addr("172.30.0.10"), Proto: 6, Port: 80}: true, {IP: addr("172.30.0.66"), Proto: 6, Port: 80}: true}}
	mustRestore(t, k, `*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
COMMIT
`)

	b, _ := newTestBackend(t, k, Settings{ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16")}})
	k.calls = nil
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build()), model.Changes{Full: true})
	for _, c := range k.calls {
		if strings.HasPrefix(c, "delete-vs "+web.String()) || strings.HasPrefix(c, "add-vs "+web.String()) {
			t.Errorf("the Service's virtual server was recreated: %s", c)
		}
	}
	wantIPVS(t, k,
		"TCP 172.16.0.1:80 rr",
		"TCP 172.30.0.10:80 rr", "  -> 10.180.2.3:8080 1",
		"TCP [fd00:172:30::10]:80 rr",
	)
	if diff := cmp.Diff([]string{"172.30.0.10", "fd00:172:30::10"}, k.dummyAddrs()); diff != "" {
		t.Errorf("kube-ipvs0 (-want +got):\n%s", diff)
	}
	if got := k.rules(tableNAT, "PREROUTING"); len(got) != 1 {
		t.Errorf("PREROUTING = %v, want upstream's jump kept, once", got)
	}
}

func mustRestore(t *testing.T, k *fakeKernel, input string) {
	t.Helper()
	if err := (fakeIPTables{k: k}).Restore(context.Background(), []byte(input)); err != nil {
		t.Fatal(err)
	}
}

func TestIPTablesModeLeftoversGoInTheFirstSync(t *testing.T) {
	k := newFakeNode()
	k.sets["KUBE-CLUSTER-IP"] = &fakeSet{typ: typeHashIPPort, family: model.IPv4, entries: map[setEntry]bool{}}
	mustRestore(t, k, `*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-ABCDEF - [0:0]
:KUBE-SEP-ABCDEF - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABCDEF
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-ABCDEF -j KUBE-SEP-ABCDEF
-A KUBE-SEP-ABCDEF -s 10.180.2.3/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-ABCDEF -p tcp -j DNAT --to-destination 10.180.2.3:8080
COMMIT
*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A INPUT -j KUBE-FIREWALL
COMMIT
*mangle
:KUBE-PROXY-CANARY - [0:0]
COMMIT
`)
	b, _ := newTestBackend(t, k, Settings{})
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build()), model.Changes{Full: true})
	for table, gone := range map[string][]string{
		tableNAT:    {"KUBE-NODEPORTS", "KUBE-SVC-ABCDEF", "KUBE-SEP-ABCDEF"},
		tableFilter: {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"},
		tableMangle: {"KUBE-PROXY-CANARY"},
	} {
		for _, c := range gone {
			if k.tables[table].has(c) {
				t.Errorf("%s %s left behind", table, c)
			}
		}
	}
	if !k.tables[tableFilter].has("KUBE-FIREWALL") || len(k.rules(tableFilter, "INPUT")) == 0 {
		t.Errorf("kubelet's KUBE-FIREWALL or its jump was removed")
	}
	for _, r := range append(k.rules(tableFilter, "INPUT"), k.rules(tableFilter, "OUTPUT")...) {
		if strings.Contains(r, "ctstate NEW") {
			t.Errorf("the iptables mode's jump %q is left", r)
		}
	}
	// The nat jumps were upstream's own and stay, once each.
	if got := k.rules(tableNAT, "PREROUTING"); len(got) != 1 {
		t.Errorf("PREROUTING = %v", got)
	}
}

func TestFailureIsolation(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	state := stateOf(
		fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/bad", "", model.TCP, "172.30.0.11", 80).Endpoints("10.180.2.4:8080").Build(),
		fixture.ServicePort("ns/c", "", model.TCP, "172.30.0.12", 80).Endpoints("10.180.2.5:8080").Build(),
	)
	k.fault = failMatching("add-vs 172.30.0.11:80")
	res := b.Apply(context.Background(), state, model.Changes{Full: true})
	if res.Err != nil {
		t.Fatalf("a Service's failure failed the sync: %v", res.Err)
	}
	if len(res.Failed) != 1 || res.Failed[nn("ns/bad")] == nil {
		t.Fatalf("Failed = %v, want only ns/bad", res.Failed)
	}
	if !strings.Contains(res.Failed[nn("ns/bad")].Error(), "add-vs TCP/172.30.0.11:80") && !strings.Contains(res.Failed[nn("ns/bad")].Error(), "172.30.0.11:80/TCP") {
		t.Errorf("error does not say what failed: %v", res.Failed[nn("ns/bad")])
	}
	for _, ip := range []string{"172.30.0.10", "172.30.0.12"} {
		if _, ok := k.services[vsKey{model.TCP, addr(ip), 80}]; !ok {
			t.Errorf("%s not programmed", ip)
		}
	}
	// The sync loop retries the failed Service.
	k.fault = nil
	mustApply(t, b, state, changed("ns/bad"))
	if vs := k.services[vsKey{model.TCP, addr("172.30.0.11"), 80}]; vs == nil || len(vs.dests) != 1 {
		t.Errorf("retry did not program ns/bad")
	}
}

func TestMissingSchedulerFailsOnlyThatService(t *testing.T) {
	k := newFakeNode()
	delete(k.schedulers, "ovf")
	b, _ := newTestBackend(t, k, Settings{})
	res := b.Apply(context.Background(), stateOf(
		fixture.ServicePort("ns/a", "", model.TCP, "172.30.0.10", 80).Endpoints("10.180.2.3:8080").Build(),
		fixture.ServicePort("ns/ovf", "", model.TCP, "172.30.0.11", 80).Scheduler("ovf").Endpoints("10.180.2.4:8080").Build(),
	), model.Changes{Full: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	err := res.Failed[nn("ns/ovf")]
	if err == nil || !strings.Contains(err.Error(), `IPVS scheduler "ovf" is not available`) {
		t.Errorf("Failed = %v, want ns/ovf failing on its scheduler", res.Failed)
	}
}

func TestConflictingFrontendsFailTheNewcomer(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	first := fixture.ServicePort("ns/first", "", model.TCP, "172.30.0.10", 80).ExternalIPs("192.168.99.9").Endpoints("10.180.2.3:8080").Build()
	second := fixture.ServicePort("ns/second", "", model.TCP, "172.30.0.11", 80).ExternalIPs("192.168.99.9").Endpoints("10.180.2.4:8080").Build()
	mustApply(t, b, stateOf(first), model.Changes{Full: true})
	res := b.Apply(context.Background(), stateOf(first, second), changed("ns/second"))
	if err := res.Failed[nn("ns/second")]; err == nil || !strings.Contains(err.Error(), "already used by Service ns/first") {
		t.Fatalf("Failed = %v, want ns/second failing on 192.168.99.9:80", res.Failed)
	}
	eip := vsKey{model.TCP, addr("192.168.99.9"), 80}
	if _, ok := k.services[eip].dests[addrPort("10.180.2.3:8080")]; !ok {
		t.Errorf("the first Service lost its externalIP: %s", k.dumpIPVS())
	}
	if _, ok := k.services[vsKey{model.TCP, addr("172.30.0.11"), 80}]; !ok {
		t.Errorf("the newcomer's ClusterIP was not programmed")
	}
	// When the first lets go, the second gets it on its retry.
	res = b.Apply(context.Background(), stateOf(second), changed("ns/first", "ns/second"))
	if res.Err != nil || len(res.Failed) > 0 {
		t.Fatalf("Apply: %v %v", res.Err, res.Failed)
	}
	if _, ok := k.services[eip].dests[addrPort("10.180.2.4:8080")]; !ok || len(k.services[eip].dests) != 1 {
		t.Errorf("externalIP not handed over: %s", k.dumpIPVS())
	}
}

// TestRandomFaultsConverge changes Services at random while 10% of kernel calls fail, then
// checks that syncs without faults leave exactly what a fresh node would have.
func TestRandomFaultsConverge(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 42))
			k := newFakeNode()
			b, clock := newTestBackend(t, k, Settings{})
			services := map[int]*model.ServicePort{}
			state := func() *model.NodeState {
				var ports []*model.ServicePort
				for i := range 12 {
					if sp := services[i]; sp != nil {
						ports = append(ports, sp)
					}
				}
				return stateOf(ports...)
			}
			k.fault = failRandomly(r, 0.1)
			needFull := true
			faulty := 0
			pending := map[types.NamespacedName]bool{}
			for step := range 60 {
				i := r.IntN(12)
				name := fmt.Sprintf("ns/s%d", i)
				if r.IntN(4) == 0 {
					delete(services, i)
				} else {
					services[i] = randomPort(r, name, i)
				}
				pending[nn(name)] = true
				if r.IntN(3) == 0 {
					if ep := randomDrain(r, k); ep != nil {
						ep.Active = 0
						ep.Inactive = 0
					}
				}
				if r.IntN(5) == 0 {
					for _, vs := range k.services {
						for _, d := range vs.dests {
							d.Active = r.IntN(2)
						}
					}
				}
				var names []string
				for n := range pending {
					names = append(names, n.String())
				}
				ch := changed(names...)
				ch.Full = needFull
				res := b.Apply(context.Background(), state(), ch)
				needFull = res.Err != nil
				if res.Err != nil || len(res.Failed) > 0 {
					faulty++
				}
				pending = map[types.NamespacedName]bool{}
				for n := range res.Failed {
					pending[n] = true
				}
				if res.Err != nil {
					for n := range ch.Services {
						pending[n] = true
					}
				}
				clock.step(time.Duration(r.IntN(10)) * time.Second)
				_ = step
			}
			if faulty == 0 {
				t.Fatalf("no sync saw a fault; the test tests nothing")
			}
			// No more faults, no more connections: everything converges.
			k.fault = nil
			for _, vs := range k.services {
				for _, d := range vs.dests {
					d.Active, d.Inactive = 0, 0
				}
			}
			clock.step(time.Minute)
			mustApply(t, b, state(), model.Changes{Full: true})

			fresh := newFakeNode()
			fb, _ := newTestBackend(t, fresh, Settings{})
			mustApply(t, fb, state(), model.Changes{Full: true})
			if diff := cmp.Diff(fresh.snapshot(), k.snapshot()); diff != "" {
				t.Errorf("kernel after faults differs from a fresh node's (-fresh +got):\n%s", diff)
			}
		})
	}
}

func randomPort(r *rand.Rand, name string, i int) *model.ServicePort {
	var eps []string
	for j := range r.IntN(4) {
		subnet := 1 + r.IntN(2) // 10.180.1.x are this node's pods
		ep := fmt.Sprintf("10.180.%d.%d:8080", subnet, 10+j+r.IntN(3))
		if subnet == 1 {
			ep += "@local"
		}
		eps = append(eps, ep)
	}
	withNodePort, withExternalIP, withLB, withExternalLocal := r.IntN(2) == 0, r.IntN(3) == 0, r.IntN(3) == 0, r.IntN(3) == 0
	var sched string
	if r.IntN(4) == 0 {
		sched = []string{"sh", "mh", "lc"}[r.IntN(3)]
	}
	var affinity int32
	if r.IntN(4) == 0 {
		affinity = int32(10 + r.IntN(100))
	}
	proto := model.TCP
	if r.IntN(4) == 0 {
		proto = model.UDP
	}
	p := fixture.ServicePort(name, "", proto, fmt.Sprintf("172.30.0.%d", 10+i), 80).Endpoints(eps...)
	if withNodePort {
		p.NodePort(int32(30000 + i))
	}
	if withExternalIP {
		// Unique per Service: conflicts have their own test, and their winner depends on
		// history, which a fresh node does not share.
		p.ExternalIPs(fmt.Sprintf("192.168.99.%d", i))
	}
	if withLB {
		p.LoadBalancer(fmt.Sprintf("5.6.7.%d", i)).SourceRanges("198.51.100.0/24")
	}
	if withExternalLocal {
		p.ExternalLocal()
	}
	return p.Scheduler(sched).Affinity(affinity).Build()
}

func randomDrain(r *rand.Rand, k *fakeKernel) *realServer {
	for _, vs := range k.services {
		for _, d := range vs.dests {
			if d.Weight == 0 && r.IntN(2) == 0 {
				return d
			}
		}
	}
	return nil
}

func TestNewFailsClearlyWithoutIPVS(t *testing.T) {
	k := newFakeNode()
	_, err := New(context.Background(), testConfig(model.IPv4), Settings{Scheduler: "wrr"}, withFake(k), func(o *options) {
		o.supported = func() (bool, error) { return false, nil }
	})
	if !errors.Is(err, ErrNoIPVS) {
		t.Fatalf("New = %v, want ErrNoIPVS", err)
	}
	for _, want := range []string{"kernel has no IPVS", "ip_vs_wrr", "nftables"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if len(k.calls) != 0 {
		t.Errorf("New touched the kernel: %v", k.calls)
	}
}

func TestNewChecksTheScheduler(t *testing.T) {
	k := newFakeNode()
	delete(k.schedulers, "mh")
	_, err := New(context.Background(), testConfig(model.IPv4), Settings{Scheduler: "mh"}, withFake(k))
	if err == nil || !strings.Contains(err.Error(), `IPVS scheduler "mh" is not available`) {
		t.Fatalf("New = %v, want the missing scheduler named", err)
	}
	_, err = New(context.Background(), testConfig(model.IPv4), Settings{Scheduler: "fastest"}, withFake(k))
	if err == nil || !strings.Contains(err.Error(), "not an IPVS scheduler") {
		t.Fatalf("New = %v, want an unknown scheduler refused", err)
	}
	if len(k.services) != 0 {
		t.Errorf("the probe virtual server was left: %s", k.dumpIPVS())
	}
}

func TestSysctlsAndTimeouts(t *testing.T) {
	tests := []struct {
		kernel    hostnet.KernelVersion
		strictARP bool
		reuse     int
	}{
		{hostnet.KernelVersion{Major: 4, Minor: 0, Patch: 0}, false, 7}, // too old: left alone
		{hostnet.KernelVersion{Major: 5, Minor: 4, Patch: 0}, false, 0},
		{hostnet.KernelVersion{Major: 5, Minor: 9, Patch: 0}, true, 1},
		{hostnet.KernelVersion{Major: 6, Minor: 1, Patch: 0}, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.kernel.String(), func(t *testing.T) {
			k := newFakeNode()
			k.sysctls[sysctlConnReuseMode] = 7
			_, err := New(context.Background(), testConfig(model.IPv4),
				Settings{StrictARP: tc.strictARP, TCPTimeout: 900 * time.Second, UDPTimeout: 10 * time.Second}, withFake(k),
				func(o *options) { o.kernel = func() (hostnet.KernelVersion, error) { return tc.kernel, nil } })
			if err != nil {
				t.Fatal(err)
			}
			if got := k.sysctls[sysctlConnReuseMode]; got != tc.reuse {
				t.Errorf("conn_reuse_mode = %d, want %d", got, tc.reuse)
			}
			wantARP := map[bool][2]int{false: {0, 0}, true: {1, 2}}[tc.strictARP]
			if got := [2]int{k.sysctls[sysctlARPIgnore], k.sysctls[sysctlARPAnnounce]}; got != wantARP {
				t.Errorf("arp_ignore, arp_announce = %v, want %v", got, wantARP)
			}
			if k.timeouts != [3]time.Duration{900 * time.Second, 0, 10 * time.Second} {
				t.Errorf("IPVS timeouts = %v", k.timeouts)
			}
		})
	}
}

func TestCleanupRemovesEverythingAndIsSafeWithoutIPVS(t *testing.T) {
	k := newFakeNode()
	b, _ := newTestBackend(t, k, Settings{})
	mustApply(t, b, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).NodePort(30080).Endpoints("10.180.2.3:8080").Build()), model.Changes{Full: true})
	// Another family's address stays, and so does the device holding it.
	k.links[dummyDevice] = append(k.links[dummyDevice], addr("fd00:172:30::10"))
	k.tables[tableFilter].order = append(k.tables[tableFilter].order, "KUBE-FIREWALL")

	deps := cleanupDeps{
		supported: func() (bool, error) { return true, nil },
		openIPVS:  func() (ipvsKernel, func(), error) { return fakeIPVS{k}, func() {}, nil },
		links:     fakeLinks{k}, sets: fakeIPSets{k}, runners: []xtables.Runner{fakeIPTables{k: k}},
	}
	if err := cleanup(context.Background(), model.IPv4, deps); err != nil {
		t.Fatal(err)
	}
	if len(k.services) != 0 || len(k.sets) != 0 {
		t.Errorf("left: %s sets %v", k.dumpIPVS(), k.sets)
	}
	if diff := cmp.Diff([]string{"fd00:172:30::10"}, k.dummyAddrs()); diff != "" {
		t.Errorf("kube-ipvs0 (-want +got):\n%s", diff)
	}
	for _, table := range []string{tableNAT, tableFilter} {
		for _, c := range k.tables[table].order {
			if c != "KUBE-FIREWALL" {
				t.Errorf("chain %s %s left", table, c)
			}
		}
		for _, builtin := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
			if rules := k.rules(table, builtin); len(rules) > 0 {
				t.Errorf("%s %s still has %v", table, builtin, rules)
			}
		}
	}
	// The other family's run takes the device.
	if err := cleanup(context.Background(), model.IPv6, deps); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.links[dummyDevice]; ok {
		t.Errorf("kube-ipvs0 left after both families")
	}

	// A host where the ipvs mode never ran: IPVS is not even asked about.
	k2 := newFakeNode()
	k2.services[vsKey{model.TCP, addr("10.0.0.1"), 80}] = &fakeVS{params: vsParams{Scheduler: "rr"}}
	deps2 := cleanupDeps{
		supported: func() (bool, error) {
			t.Error("IPVS probed on a host where the ipvs mode never ran")
			return false, nil
		},
		openIPVS: func() (ipvsKernel, func(), error) { return fakeIPVS{k2}, func() {}, nil },
		links:    fakeLinks{k2}, sets: fakeIPSets{k2}, runners: []xtables.Runner{fakeIPTables{k: k2}},
	}
	if err := cleanup(context.Background(), model.IPv4, deps2); err != nil {
		t.Fatal(err)
	}
	if len(k2.services) != 1 {
		t.Errorf("someone else's IPVS virtual server was deleted")
	}
	// Evidence of the ipvs mode on a kernel without IPVS: the rest is cleaned, no error.
	k3 := newFakeNode()
	k3.links[dummyDevice] = []netip.Addr{addr("172.30.0.10")}
	deps3 := cleanupDeps{
		supported: func() (bool, error) { return false, nil },
		openIPVS: func() (ipvsKernel, func(), error) {
			t.Error("IPVS opened on a kernel without it")
			return nil, nil, errors.New("no")
		},
		links: fakeLinks{k3}, sets: fakeIPSets{k3},
	}
	if err := cleanup(context.Background(), model.IPv4, deps3); err != nil {
		t.Fatal(err)
	}
	if _, ok := k3.links[dummyDevice]; ok {
		t.Errorf("kube-ipvs0 left")
	}
}

func TestIPv6UsesItsOwnSetsAndLeavesIPv4Alone(t *testing.T) {
	k := newFakeNode()
	clock := newClock()
	b6, err := New(context.Background(), testConfig(model.IPv6), Settings{}, withFake(k), WithClock(clock.now),
		func(o *options) { o.ipt = fakeIPTables{k: k, v6: true} })
	if err != nil {
		t.Fatal(err)
	}
	b4, _ := newTestBackend(t, k, Settings{})
	mustApply(t, b4, stateOf(fixture.ServicePort("ns/web", "", model.TCP, "172.30.0.10", 80).NodePort(30080).Endpoints("10.180.2.3:8080").Build()), model.Changes{Full: true})
	sp6 := fixture.ServicePort("ns/web", "", model.TCP, "fd00:172:30::10", 80).NodePort(30080).Endpoints("[fd00:10::3]:8080").Build()
	res := b6.Apply(context.Background(), stateOfFamily(model.IPv6, sp6), model.Changes{Full: true})
	if res.Err != nil || len(res.Failed) > 0 {
		t.Fatalf("Apply: %v %v", res.Err, res.Failed)
	}
	for _, name := range []string{"KUBE-6-CLUSTER-IP", "KUBE-6-NODE-PORT-TCP", "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS", "KUBE-CLUSTER-IP"} {
		if _, ok := k.sets[name]; !ok {
			t.Errorf("set %s missing", name)
		}
	}
	wantIPVS(t, k,
		"TCP 172.30.0.10:80 rr", "  -> 10.180.2.3:8080 1",
		"TCP 192.168.0.2:30080 rr", "  -> 10.180.2.3:8080 1",
		"TCP [2001:db8::1]:30080 rr", "  -> [fd00:10::3]:8080 1",
		"TCP [fd00:172:30::10]:80 rr", "  -> [fd00:10::3]:8080 1",
	)
	if diff := cmp.Diff([]string{"172.30.0.10", "fd00:172:30::10"}, k.dummyAddrs()); diff != "" {
		t.Errorf("kube-ipvs0 (-want +got):\n%s", diff)
	}
}

// wantIPVS compares the fake kernel's IPVS table (dumpIPVS) with lines, one line each.
func wantIPVS(t *testing.T, k *fakeKernel, lines ...string) {
	t.Helper()
	want := strings.Join(lines, "\n") + "\n"
	if diff := cmp.Diff(want, k.dumpIPVS()); diff != "" {
		t.Errorf("IPVS table (-want +got):\n%s", diff)
	}
}
