//go:build conformance

package conformance

// TrafficCounters is a sluice-only case (issue 13): upstream kube-proxy has no per-Service
// traffic counters, so the case runs in sluice's iptables and nftables clusters only
// (conformanceCase.proxies) and nothing of it is compared with upstream. Its checks are
// recorded like any other, so the results still say what sluice showed.
//
// It asserts on what sluice's daemon says, on its /metrics (the page kube-proxy serves on
// :10249, here 127.0.0.1:10249 inside node-a) and through `sluice explain`, about real
// connections from a pod and from the external client: exact new-connection counts per
// path, packets and bytes at least what the clients sent, no series for a Service without
// the annotation, and counts that survive endpoint changes (partial syncs).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/promtext"
)

const (
	// counterConns is how many connections a counted burst makes to one target.
	counterConns = 5
	// counterPayload is how many bytes each of them sends (one line; one segment).
	counterPayload = 1000
	// counterNode is the node whose sluice the case reads: every client of the case
	// reaches the Service through it (a1 lives there; the external client is sent to
	// node-a's NodePort).
	counterNode = "node-a"
	// counterTimeout bounds one counted connection. It is not retried: a second
	// attempt would be a connection of its own, and the count exact no more.
	counterTimeout = 5 * time.Second
	// counterRounds bounds the measurements an iptables cluster may repeat because a
	// full sync ran in the middle of one (see measureCounts).
	counterRounds = 3
)

// The series the daemon exports (pkg/dataplane.TrafficCounterCollector).
const (
	metricNewConnections = "sluice_service_new_connections_total"
	metricPackets        = "sluice_service_packets_total"
	metricBytes          = "sluice_service_bytes_total"
)

// counterPaths are the values of the path label.
var counterPaths = []string{"cluster", "external", "local"}

// A Service annotated sluice.dev/traffic-counters: "true" is counted, per port and path;
// one without the annotation is not (no series at all). N connections from a pod to its
// ClusterIP count N new connections on path cluster; N from the external client to a
// NodePort count N on external (and N on cluster, where eTP Cluster picks the endpoint);
// each path's packets and bytes are at least the clients' handshake and data packets with
// their headers. The counts survive an endpoint change of the Service and of another
// Service, and `sluice explain NAMESPACE/NAME` shows what /metrics shows.
func trafficCountersCase(t *T) {
	counted := t.serviceWith("counted", corev1.ServiceTypeNodePort, func(s *corev1.Service) {
		s.Annotations = map[string]string{model.AnnotationTrafficCounters: "true"}
	}, httpPort)
	plain := t.service("plain", corev1.ServiceTypeNodePort, httpPort)
	t.endpoints(counted, ready("a0"), ready("b0"))
	t.endpoints(plain, ready("a0"), ready("b0"))
	cips := clusterIPs(t, counted, "http")
	nps := t.e.nodePorts(t, counted, "http", counterNode)

	// Programmed, and the Service without the annotation carried traffic on both paths too.
	t.expectBackends(from("a1"), cips, "a0", "b0")
	t.expectBackends(from("external"), nps, "a0", "b0")
	t.expectBackends(from("a1"), clusterIPs(t, plain, "http"), "a0", "b0")
	t.expectBackends(from("external"), t.e.nodePorts(t, plain, "http", counterNode), "a0", "b0")
	t.expectNoCounters(plain)

	for _, tg := range cips {
		t.expectCounted(from("a1"), tg, counted, "cluster", "cluster")
	}
	for _, tg := range nps {
		t.expectCounted(from("external"), tg, counted, "external", "external", "cluster")
	}

	// An endpoint change of the Service itself (a partial sync rewriting its chains in
	// iptables mode, its endpoint map in nftables mode), then of another Service.
	t.expectCountsSurvive("an endpoint change of the Service", from("a1"), cips, counted, counted,
		[]string{"a0", "b0"}, []string{"a0", "b0", "b1"})
	t.expectCountsSurvive("an endpoint change of another Service", from("a1"), cips, counted, plain,
		[]string{"a0", "b0"}, []string{"a0", "b1"})

	t.expectExplained(counted, true)
	t.expectExplained(plain, false)
}

// ---- reading the daemon ---------------------------------------------------------------------

// stateURL is sluice's state page (app.StatePath), served to loopback clients only.
const stateURL = "http://127.0.0.1:10249/debug/sluice/state"

// pathCount is one Service port's counters on one path.
type pathCount struct {
	conns, packets, bytes float64
	// hasPackets: the packets and bytes series exist.
	hasPackets bool
}

// counterSnapshot is one scrape's counters of one Service port, by path, and the metrics
// with a series of the Service (of any port or path).
type counterSnapshot struct {
	paths  map[string]pathCount
	series []string
}

// readCounters scrapes the sluice in counterNode and picks out svc's counters of port sp.
// A scrape reads the kernel's counters (the collector reads on scrape).
func (cl *cluster) readCounters(svc *corev1.Service, sp corev1.ServicePort) (counterSnapshot, error) {
	snap := counterSnapshot{paths: map[string]pathCount{}}
	body, err := httpGetBody(&cl.topo.Node(counterNode).Host, metricsURL)
	if err != nil {
		return snap, err
	}
	fams, err := promtext.Parse(body)
	if err != nil {
		return snap, err
	}
	for _, name := range []string{metricNewConnections, metricPackets, metricBytes} {
		if _, found := fams.Value(name, "namespace", svc.Namespace, "service", svc.Name); found {
			snap.series = append(snap.series, name)
		}
		for _, path := range counterPaths {
			v, found := fams.Value(name, "namespace", svc.Namespace, "service", svc.Name, "port", sp.Name, "protocol", string(sp.Protocol), "path", path)
			if !found {
				continue
			}
			pc := snap.paths[path]
			switch name {
			case metricNewConnections:
				pc.conns = v
			case metricPackets:
				pc.packets, pc.hasPackets = v, true
			case metricBytes:
				pc.bytes = v
			}
			snap.paths[path] = pc
		}
	}
	return snap, nil
}

// stateReport is the part of sluice's state page (app.StatusReport) the case reads.
type stateReport struct {
	Families []struct {
		Status struct {
			Family       string    `json:"family"`
			LastFullSync time.Time `json:"lastFullSync"`
		} `json:"status"`
		State struct {
			Services []struct {
				Namespace        string `json:"namespace"`
				Name             string `json:"name"`
				ClusterEndpoints []struct {
					IP string `json:"ip"`
				} `json:"clusterEndpoints"`
			} `json:"services"`
		} `json:"state"`
		Unapplied []string `json:"unapplied"`
	} `json:"families"`
}

// readState reads the state page of the sluice in counterNode.
func (cl *cluster) readState() (*stateReport, error) {
	body, err := httpGetBody(&cl.topo.Node(counterNode).Host, stateURL)
	if err != nil {
		return nil, err
	}
	r := &stateReport{}
	if err := json.Unmarshal([]byte(body), r); err != nil {
		return nil, fmt.Errorf("%s: %w", stateURL, err)
	}
	return r, nil
}

// fullSyncs says when each family's last full sync was, as one comparable string.
func (r *stateReport) fullSyncs() string {
	var out []string
	for _, f := range r.Families {
		out = append(out, f.Status.Family+"@"+f.Status.LastFullSync.Format(time.RFC3339Nano))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// programmed reports whether every family of svc has been synced with exactly the
// endpoints of pods (by name) as its Cluster endpoints.
func (r *stateReport) programmed(cl *cluster, svc *corev1.Service, pods []string) bool {
	key := svc.Namespace + "/" + svc.Name
	seen := 0
	for _, f := range r.Families {
		if slices.Contains(f.Unapplied, key) {
			return false
		}
		for _, p := range f.State.Services {
			if p.Namespace != svc.Namespace || p.Name != svc.Name {
				continue
			}
			var want, got []string
			for _, pod := range pods {
				pp := cl.topo.Pod(pod)
				if f.Status.Family == string(corev1.IPv6Protocol) {
					want = append(want, pp.IPv6.String())
				} else {
					want = append(want, pp.IPv4.String())
				}
			}
			for _, ep := range p.ClusterEndpoints {
				got = append(got, ep.IP)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(want, got) {
				return false
			}
			seen++
		}
	}
	return seen == len(svc.Spec.IPFamilies)
}

// fullSyncMarks reads when the last full syncs were, once the state page's cache
// (app's stateMinAge, 250 ms) can no longer hide a sync that just ended.
func (cl *cluster) fullSyncMarks() (string, error) {
	time.Sleep(300 * time.Millisecond)
	r, err := cl.readState()
	if err != nil {
		return "", err
	}
	return r.fullSyncs(), nil
}

// ---- counted connections ----------------------------------------------------------------------

// talk makes one TCP connection from c to tg: it reads the echo server's greeting, sends
// a line of counterPayload bytes, reads the answer to it and closes.
func (cl *cluster) talk(c client, tg target) error {
	return cl.host(c.host).Do(func() error {
		conn, err := net.DialTimeout("tcp", tg.addr.String(), counterTimeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(counterTimeout))
		r := bufio.NewReader(conn)
		for i := range 2 {
			line, err := r.ReadString('\n')
			if err != nil {
				return fmt.Errorf("reading answer %d: %w", i+1, err)
			}
			if _, err := echo.ParseReply(line); err != nil {
				return err
			}
			if i == 0 {
				if _, err := conn.Write([]byte(strings.Repeat("x", counterPayload-1) + "\n")); err != nil {
					return fmt.Errorf("sending: %w", err)
				}
			}
		}
		return nil
	})
}

// burst makes counterConns connections from c to tg, one after the other; every one must
// be answered.
func (cl *cluster) burst(c client, tg target) error {
	for i := range counterConns {
		if err := cl.talk(c, tg); err != nil {
			return fmt.Errorf("%s -> %s: connection %d of %d: %w", c, tg.name, i+1, counterConns, err)
		}
	}
	return nil
}

// ipHeader is the smallest IP header of tg's family (TCP's header comes on top: 20 bytes).
func ipHeader(tg target) float64 {
	if tg.addr.Addr().Is4() {
		return 20
	}
	return 40
}

// sentAtLeast is what n connections to tg send at least, as the original direction's
// packets: the SYN, the ACK completing the handshake and the data segment, each with
// its IP and TCP headers.
func sentAtLeast(tg target, n int) (packets, bytes float64) {
	const perConn = 3
	return float64(n * perConn), float64(n)*counterPayload + float64(n*perConn)*(ipHeader(tg)+20)
}

// countsAfter compares two snapshots: every path in connPaths must have counted exactly
// conns more new connections, every other path none; packetPath must have counted at
// least the packets and bytes of conns connections to tg. It returns "" when they do, or
// what is wrong.
func countsAfter(before, after counterSnapshot, tg target, conns int, packetPath string, connPaths ...string) string {
	var wrong []string
	for _, p := range counterPaths {
		want := 0.0
		if slices.Contains(connPaths, p) {
			want = float64(conns)
		}
		if got := after.paths[p].conns - before.paths[p].conns; got != want {
			wrong = append(wrong, fmt.Sprintf("new connections on %s +%.0f, want +%.0f", p, got, want))
		}
	}
	a, b := after.paths[packetPath], before.paths[packetPath]
	wantP, wantB := sentAtLeast(tg, conns)
	switch {
	case !a.hasPackets:
		wrong = append(wrong, fmt.Sprintf("no %s or %s series on %s", metricPackets, metricBytes, packetPath))
	default:
		if got := a.packets - b.packets; got < wantP {
			wrong = append(wrong, fmt.Sprintf("packets on %s +%.0f, want at least +%.0f", packetPath, got, wantP))
		}
		if got := a.bytes - b.bytes; got < wantB {
			wrong = append(wrong, fmt.Sprintf("bytes on %s +%.0f, want at least +%.0f", packetPath, got, wantB))
		}
	}
	return strings.Join(wrong, "; ")
}

// countedOutcome is the outcome a counted check wants.
func countedOutcome(conns int, packetPath string, connPaths ...string) string {
	return fmt.Sprintf("+%d new connections on %s; packets and bytes of %d connections on %s",
		conns, strings.Join(connPaths, " and "), conns, packetPath)
}

// measureCounts reads svc's counters, runs traffic, then reads them again, and compares
// (countsAfter). In iptables mode a full sync rewrites every chain and carries each
// counter across (pkg/dataplane/iptables README, "Survival"), but what is counted between
// its read of the counters and its restore is lost, by design. When a measurement in
// iptables mode came out short and a full sync (syncPeriod 30 s) ran during it, it is
// made again, up to counterRounds times; a short count without a full sync, or in
// nftables mode (whose full syncs never rewrite a counted chain), fails at once.
func (cl *cluster) measureCounts(svc *corev1.Service, traffic func() error, check func(before, after counterSnapshot) string) string {
	var problem string
	for round := 1; round <= counterRounds; round++ {
		marks, err := cl.fullSyncMarks()
		if err != nil {
			return err.Error()
		}
		before, err := cl.readCounters(svc, httpPort)
		if err != nil {
			return err.Error()
		}
		if err := traffic(); err != nil {
			return err.Error()
		}
		after, err := cl.readCounters(svc, httpPort)
		if err != nil {
			return err.Error()
		}
		problem = check(before, after)
		if problem == "" {
			return ""
		}
		marksAfter, err := cl.fullSyncMarks()
		if err != nil {
			return err.Error()
		}
		if cl.backend != "iptables" || marksAfter == marks {
			return problem
		}
		problem = fmt.Sprintf("%s (a full sync ran in each of %d measurements)", problem, round)
	}
	return problem
}

// expectCounted makes counterConns connections from c to tg, a frontend of svc, and
// checks the counters of counterNode's sluice: exactly counterConns more new connections
// on each of connPaths and none on the others, and at least their packets and bytes on
// packetPath.
func (t *T) expectCounted(c client, tg target, svc *corev1.Service, packetPath string, connPaths ...string) {
	t.Helper()
	want := countedOutcome(counterConns, packetPath, connPaths...)
	t.run(check{
		what: fmt.Sprintf("%s -> %s x%d: %s's traffic counters", c, tg.name, counterConns, counterNode),
		want: []string{want}, once: true,
		observe: func(cl *cluster) string {
			problem := cl.measureCounts(svc, func() error { return cl.burst(c, tg) }, func(before, after counterSnapshot) string {
				return countsAfter(before, after, tg, counterConns, packetPath, connPaths...)
			})
			if problem != "" {
				return problem
			}
			return want
		},
	})
}

// expectNoCounters checks that counterNode's sluice exports no traffic counter series of
// svc: a Service without the annotation is not counted (the default).
func (t *T) expectNoCounters(svc *corev1.Service) {
	t.Helper()
	t.run(check{
		what: fmt.Sprintf("%s's traffic counters of a Service without the annotation", counterNode),
		want: []string{"no series"}, once: true,
		observe: func(cl *cluster) string {
			snap, err := cl.readCounters(svc, httpPort)
			switch {
			case err != nil:
				return err.Error()
			case len(snap.series) > 0:
				return "series of " + strings.Join(snap.series, ", ")
			}
			return "no series"
		},
	})
}

// expectCountsSurvive checks that svc's counters keep what they counted across a change
// of changed's endpoints (svc itself or another Service) from the pods of was to those of
// becomes: it reads the counters, makes counterConns connections from c to each of tgs
// (frontends of svc), makes the change, waits until counterNode's sluice has programmed
// it (its state page says so; a connection to find out would count), and reads the
// counters again, which must have counted every one of those connections on path cluster.
// No scrape comes between the connections and the change: the collector keeps its series
// monotonic across a restarted kernel counter by adding what it finds after the restart,
// which would hide the restart had it read the connections' counts before it.
//
// The change is made once for every cluster, between the connections and the wait. A
// measurement that came out short in iptables mode while a full sync ran during it (see
// measureCounts) is made again with the change back (and forth), up to counterRounds times.
func (t *T) expectCountsSurvive(what string, c client, tgs []target, svc, changed *corev1.Service, was, becomes []string) {
	t.Helper()
	conns := counterConns * len(tgs)
	want := fmt.Sprintf("+%d new connections on cluster across %s", conns, what)
	disturbed := fmt.Sprintf("%s, disturbed by a full sync", want)
	befores := &byCluster[counterSnapshot]{}
	marks := &byCluster[string]{}
	again := &byCluster[bool]{}
	for round := 1; round <= counterRounds; round++ {
		in := func(cl *cluster) bool { return round == 1 || again.get(cl) }
		if !slices.ContainsFunc(t.clusters(), in) {
			return
		}
		pods := becomes
		if round%2 == 0 {
			pods = was
		}
		// The traffic of the measurement, before the change.
		t.run(check{
			what: fmt.Sprintf("%s -> %s x%d, before %s (round %d)", c, tgNames(tgs), counterConns, what, round),
			want: []string{"answered"}, once: true, only: in,
			observe: func(cl *cluster) string {
				m, err := cl.fullSyncMarks()
				if err != nil {
					return err.Error()
				}
				marks.set(cl, m)
				before, err := cl.readCounters(svc, httpPort)
				if err != nil {
					return err.Error()
				}
				befores.set(cl, before)
				for _, tg := range tgs {
					if err := cl.burst(c, tg); err != nil {
						return err.Error()
					}
				}
				return "answered"
			},
		})
		var eps []endpoint
		for _, p := range pods {
			eps = append(eps, ready(p))
		}
		t.endpoints(changed, eps...)
		ok := []string{want}
		if round < counterRounds {
			ok = append(ok, disturbed)
		}
		t.run(check{
			what: fmt.Sprintf("%s's traffic counters across %s (round %d)", counterNode, what, round),
			want: ok, once: true, only: in,
			observe: func(cl *cluster) string {
				again.set(cl, false)
				if err := cl.waitProgrammed(changed, pods); err != nil {
					return err.Error()
				}
				after, err := cl.readCounters(svc, httpPort)
				if err != nil {
					return err.Error()
				}
				before := befores.get(cl)
				got := after.paths["cluster"].conns - before.paths["cluster"].conns
				var problem string
				switch {
				case got == float64(conns) && after.paths["external"].conns == before.paths["external"].conns:
					return want
				case got == float64(conns):
					problem = fmt.Sprintf("new connections on external +%.0f across %s, want +0", after.paths["external"].conns-before.paths["external"].conns, what)
				default:
					problem = fmt.Sprintf("+%.0f new connections on cluster across %s, want +%d", got, what, conns)
				}
				if m, err := cl.fullSyncMarks(); err == nil && m != marks.get(cl) && cl.backend == "iptables" {
					if round < counterRounds {
						again.set(cl, true)
						return disturbed
					}
					problem += " (a full sync ran during each measurement)"
				}
				return problem
			},
		})
	}
}

// waitProgrammed waits until counterNode's sluice has programmed svc with the endpoints
// of pods in every family.
func (cl *cluster) waitProgrammed(svc *corev1.Service, pods []string) error {
	deadline := time.Now().Add(convergeTimeout)
	for {
		r, err := cl.readState()
		if err == nil && r.programmed(cl, svc, pods) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%s/%s with endpoints %v is not programmed after %s", svc.Namespace, svc.Name, pods, convergeTimeout)
			}
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tgNames joins the names of targets.
func tgNames(tgs []target) string {
	var names []string
	for _, tg := range tgs {
		names = append(names, tg.name)
	}
	return strings.Join(names, ", ")
}

// explained is the part of `sluice explain NAMESPACE/NAME -o json` the case reads.
type explained struct {
	TrafficCounters struct {
		Counted bool `json:"counted"`
		Ports   []struct {
			Port           string   `json:"port"`
			Protocol       string   `json:"protocol"`
			Path           string   `json:"path"`
			NewConnections float64  `json:"newConnections"`
			Packets        *float64 `json:"packets"`
			Bytes          *float64 `json:"bytes"`
		} `json:"ports"`
		Error string `json:"error"`
	} `json:"trafficCounters"`
}

// expectExplained runs `sluice explain NAMESPACE/NAME -o json` in counterNode, against its
// running sluice, and checks that it says whether svc is counted and, when it is, shows
// exactly the counters /metrics shows (read just before; nothing reaches the Service in
// between).
func (t *T) expectExplained(svc *corev1.Service, counted bool) {
	t.Helper()
	want := "not counted"
	if counted {
		want = "counted, with the counters of /metrics"
	}
	t.run(check{
		what: fmt.Sprintf("sluice explain %s/%s on %s", svc.Namespace, svc.Name, counterNode),
		want: []string{want}, once: true,
		observe: func(cl *cluster) string {
			snap, err := cl.readCounters(svc, httpPort)
			if err != nil {
				return err.Error()
			}
			out, err := cl.topo.Node(counterNode).Run(cl.binary, "explain", svc.Namespace+"/"+svc.Name, "-o", "json")
			if err != nil {
				return err.Error()
			}
			var es []explained
			if err := json.Unmarshal([]byte(out), &es); err != nil {
				return fmt.Sprintf("sluice explain -o json: %v: %s", err, out)
			}
			if len(es) != len(svc.Spec.IPFamilies) {
				return fmt.Sprintf("sluice explain: %d explanations, want one per family (%d)", len(es), len(svc.Spec.IPFamilies))
			}
			for _, e := range es {
				tc := e.TrafficCounters
				switch {
				case tc.Error != "":
					return "sluice explain: counters not read: " + tc.Error
				case tc.Counted != counted:
					return fmt.Sprintf("sluice explain: counted %v", tc.Counted)
				case !counted && len(tc.Ports) > 0:
					return fmt.Sprintf("sluice explain: %d counter rows of a Service not counted", len(tc.Ports))
				}
				rows := 0
				for _, p := range tc.Ports {
					if p.Port != "http" || p.Protocol != "TCP" {
						return fmt.Sprintf("sluice explain: a row for port %s/%s", p.Port, p.Protocol)
					}
					m, ok := snap.paths[p.Path]
					switch {
					case !ok:
						return fmt.Sprintf("sluice explain: path %s, which /metrics does not show", p.Path)
					case p.NewConnections != m.conns:
						return fmt.Sprintf("sluice explain: %.0f new connections on %s, /metrics %.0f", p.NewConnections, p.Path, m.conns)
					case (p.Packets != nil) != m.hasPackets || (p.Bytes != nil) != m.hasPackets:
						return fmt.Sprintf("sluice explain: packets and bytes shown %v, /metrics has them %v", p.Packets != nil, m.hasPackets)
					case m.hasPackets && (*p.Packets != m.packets || *p.Bytes != m.bytes):
						return fmt.Sprintf("sluice explain: %.0f packets and %.0f bytes on %s, /metrics %.0f and %.0f", *p.Packets, *p.Bytes, p.Path, m.packets, m.bytes)
					}
					rows++
				}
				if rows != len(snap.paths) {
					return fmt.Sprintf("sluice explain: %d paths, /metrics %d", rows, len(snap.paths))
				}
			}
			return want
		},
	})
}
