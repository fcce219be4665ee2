//go:build conformance

package conformance

// The disruptive cases stop a proxy or the apiserver. Each runs alone, and checks a
// Service of every family variant across one disruption (their family is "all"; the
// targets' names say which variant's Service they belong to).

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/conformance/results"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// variantServices creates one Service per family variant, each in a namespace of its own,
// with endpoints eps, and returns them with the targets of portName on their ClusterIPs,
// named after their variant ("DualStack Service: ClusterIP IPv6 http/tcp").
func (t *T) variantServices(name string, typ corev1.ServiceType, eps []endpoint, ports ...corev1.ServicePort) ([]*corev1.Service, []target) {
	var svcs []*corev1.Service
	var tgs []target
	for _, f := range familyVariants {
		svc := t.serviceIn(f, name, typ, ports...)
		t.endpoints(svc, eps...)
		svcs = append(svcs, svc)
		tgs = append(tgs, variantTargets(f, clusterIPs(t, svc, ports[0].Name))...)
	}
	return svcs, tgs
}

// variantTargets names targets after the variant of their Service.
func variantTargets(f family, tgs []target) []target {
	out := make([]target, len(tgs))
	for i, tg := range tgs {
		tg.name = f.name + " Service: " + tg.name
		out[i] = tg
	}
	return out
}

// stopProxies stops the proxy in node in every cluster still in the case.
func (t *T) stopProxies(node string) {
	t.each(func(cl *cluster) error {
		cl.proc(node).Stop()
		return nil
	})
}

// startProxies starts the proxy in node again in every cluster, and waits for its first
// sync.
func (t *T) startProxies(node string) {
	t.each(func(cl *cluster) error {
		n := cl.topo.Node(node)
		if err := t.e.startProxy(cl, n); err != nil {
			return err
		}
		return t.e.waitHealthy(cl, n)
	})
}

// stream is one established TCP connection to the echo server, kept open across a
// disruption.
type stream struct {
	conn net.Conn
	r    *bufio.Reader
	pod  string
}

// openStreams connects from c to tg in every cluster and reads the first reply; the
// connections close when the case ends.
func (t *T) openStreams(c client, tg target) *byCluster[*stream] {
	streams := &byCluster[*stream]{}
	t.each(func(cl *cluster) error {
		var conn net.Conn
		if err := cl.host(c.host).Do(func() (err error) {
			conn, err = net.DialTimeout("tcp", tg.addr.String(), echo.DefaultTimeout)
			return err
		}); err != nil {
			return fmt.Errorf("%s -> %s: %w", c, tg.name, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		s := &stream{conn: conn, r: bufio.NewReader(conn)}
		r, err := s.exchange(false)
		if err != nil {
			return err
		}
		s.pod = r.Pod
		streams.set(cl, s)
		return nil
	})
	return streams
}

// exchange reads one reply line, after sending one line when send is true.
func (s *stream) exchange(send bool) (echo.Reply, error) {
	_ = s.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if send {
		if _, err := s.conn.Write([]byte("again\n")); err != nil {
			return echo.Reply{}, fmt.Errorf("established connection: write: %w", err)
		}
	}
	line, err := s.r.ReadString('\n')
	if err != nil {
		return echo.Reply{}, fmt.Errorf("established connection: read: %w", err)
	}
	return echo.ParseReply(line)
}

// expectStreams checks that each established connection still talks to its first pod.
func (t *T) expectStreams(c client, tg target, streams *byCluster[*stream]) {
	t.run(check{
		what: fmt.Sprintf("%s -> %s: the connection established before", c, tg.name),
		want: []string{"still answered by its pod"}, once: true,
		observe: func(cl *cluster) string {
			s := streams.get(cl)
			r, err := s.exchange(true)
			switch {
			case err != nil:
				return err.Error()
			case r.Pod != s.pod:
				return fmt.Sprintf("answered by %s, was %s", r.Pod, s.pod)
			}
			return "still answered by its pod"
		},
	})
}

// trafficWatch probes from a client in the background, to prove that traffic never stops
// while something is disrupted (a proxy restart, an apiserver outage).
type trafficWatch struct {
	stop     chan struct{}
	done     chan struct{}
	probes   int
	failures []string
}

// watchTraffic starts probing each target from c every 50ms in every cluster, until
// finishWatches. Every probe must be answered by one of the pods.
//
// Upstream keeps the conntrack entries of connection attempts that reached a target before
// its rules did (sluice deletes them when it programs the target: pkg/conntrack); a later
// probe that happens to reuse such an attempt's source port would go nowhere, for up to
// 120 s. That is the setup racing the proxy, not what a watch measures, so the entries are
// cleared from upstream's nodes before its watches start; sluice's nodes are left alone.
func (t *T) watchTraffic(c client, tgs []target, pods ...string) *byCluster[[]*trafficWatch] {
	watches := &byCluster[[]*trafficWatch]{}
	t.each(func(cl *cluster) error {
		if cl.proxy == results.Upstream {
			if err := clearUnansweredTCP(t.Context(), cl, tgs); err != nil {
				return err
			}
		}
		var ws []*trafficWatch
		for _, tg := range tgs {
			w := &trafficWatch{stop: make(chan struct{}), done: make(chan struct{})}
			go func() {
				defer close(w.done)
				for {
					select {
					case <-w.stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					out := cl.probe(c, tg, 0)
					w.probes++
					ok := out.Result == echo.Answered
					if ok {
						ok = false
						for _, p := range pods {
							ok = ok || out.Reply.Pod == p
						}
					}
					if !ok {
						w.failures = append(w.failures, time.Now().Format("15:04:05.000")+" "+out.String())
					}
				}
			}()
			ws = append(ws, w)
		}
		watches.set(cl, ws)
		return nil
	})
	return watches
}

// clearUnansweredTCP deletes, on every node of cl, the TCP conntrack entries to tgs that
// were never DNATed and never answered.
func clearUnansweredTCP(ctx context.Context, cl *cluster, tgs []target) error {
	for _, fam := range []model.IPFamily{model.IPv4, model.IPv6} {
		var frontends []netip.AddrPort
		for _, tg := range tgs {
			if tg.proto == echo.TCP && tg.addr.Addr().Is4() == (fam == model.IPv4) {
				frontends = append(frontends, tg.addr)
			}
		}
		if len(frontends) == 0 {
			continue
		}
		for _, n := range cl.topo.Nodes {
			err := n.Do(func() error {
				_, err := conntrack.DeleteUnansweredTCP(ctx, fam, frontends)
				return err
			})
			if err != nil {
				return fmt.Errorf("clearing unanswered TCP entries on %s: %w", n.Name, err)
			}
		}
	}
	return nil
}

// finishWatches stops the watches and checks that no probe failed.
func (t *T) finishWatches(c client, tgs []target, watches *byCluster[[]*trafficWatch], during string) {
	t.each(func(cl *cluster) error {
		for _, w := range watches.get(cl) {
			close(w.stop)
			<-w.done
		}
		return nil
	})
	for i, tg := range tgs {
		t.run(check{
			what: fmt.Sprintf("%s -> %s, every 50ms %s", c, tg.name, during),
			want: []string{"every probe answered"}, once: true,
			observe: func(cl *cluster) string {
				w := watches.get(cl)[i]
				if len(w.failures) > 0 {
					return fmt.Sprintf("%d of %d probes failed, first ones: %v", len(w.failures), w.probes, w.failures[:min(5, len(w.failures))])
				}
				t.Logf("[%s] %s -> %s %s: all %d probes answered", cl.name, c, tg.name, during, w.probes)
				return "every probe answered"
			},
		})
	}
}

// Restarting the proxy on a node drops nothing: rules stay in place while it is down, the
// new process takes over without a gap (it must not flush on start), an established
// connection survives, and the new process programs later changes.
func proxyRestartKeepsTrafficFlowing(t *T) {
	svcs, tgs := t.variantServices("steady", corev1.ServiceTypeClusterIP, []endpoint{ready("a0"), ready("b0")}, httpPort)
	c := from("a1")
	t.expectBackends(c, tgs, "a0", "b0")
	streams := make([]*byCluster[*stream], len(tgs))
	for i, tg := range tgs {
		streams[i] = t.openStreams(c, tg)
	}

	watches := t.watchTraffic(c, tgs, "a0", "b0")
	t.stopProxies("node-a")
	time.Sleep(time.Second) // traffic keeps flowing while no proxy runs: that is the point
	t.startProxies("node-a")
	// Let the new process do its first full sync under the watch.
	t.expectBackends(c, tgs, "a0", "b0")
	t.finishWatches(c, tgs, watches, "while the proxy on node-a restarted")
	for i, tg := range tgs {
		t.expectStreams(c, tg, streams[i])
	}

	for i, svc := range svcs {
		t.endpoints(svc, ready("a0"))
		t.expectBackends(c, variantTargets(familyVariants[i], clusterIPs(t, svc, "http")), "a0")
	}
}

// While the apiserver is down, the proxies keep what they programmed (traffic flows); when
// the apiserver is back, they pick up changes made after the outage.
func apiServerOutageKeepsTrafficFlowing(t *T) {
	svcs, tgs := t.variantServices("outage", corev1.ServiceTypeClusterIP, []endpoint{ready("a0"), ready("b0")}, httpPort)
	clients := []client{from("a1"), from("b1")}
	for _, c := range clients {
		t.expectBackends(c, tgs, "a0", "b0")
	}
	watches := []*byCluster[[]*trafficWatch]{t.watchTraffic(clients[0], tgs, "a0", "b0"), t.watchTraffic(clients[1], tgs, "a0", "b0")}
	if err := t.e.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // an outage: traffic must flow all along
	if err := t.e.cp.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		t.finishWatches(c, tgs, watches[i], "during the apiserver outage")
	}

	for i, svc := range svcs {
		t.endpoints(svc, ready("b0"))
		for _, c := range clients {
			t.expectBackends(c, variantTargets(familyVariants[i], clusterIPs(t, svc, "http")), "b0")
		}
	}
}

// A Service deleted while the proxy on a node was down is gone once it is back: the new
// process removes what the old one programmed for it (its ClusterIP is then not answered
// from that node's pods, and its NodePort on that node is refused by the node's own
// stack), and keeps the Services that still exist.
func serviceDeletedWhileProxyDown(t *T) {
	eps := []endpoint{ready("a0"), ready("b0")}
	_, kept := t.variantServices("kept", corev1.ServiceTypeClusterIP, eps, httpPort)
	doomed, gone := t.variantServices("doomed", corev1.ServiceTypeNodePort, eps, httpPort)
	var goneNodePorts []target
	for i, svc := range doomed {
		goneNodePorts = append(goneNodePorts, variantTargets(familyVariants[i], t.e.nodePorts(t, svc, "http", "node-a"))...)
	}
	t.expectBackends(from("a1"), append(append([]target{}, kept...), gone...), "a0", "b0")
	t.expectBackends(from("external"), goneNodePorts, "a0", "b0")

	t.stopProxies("node-a")
	for _, svc := range doomed {
		t.e.deleteService(t, svc)
	}
	t.startProxies("node-a")
	t.expectBackends(from("a1"), kept, "a0", "b0")
	t.expectResult(from("a1"), gone, timeout)
	t.expectResult(from("external"), goneNodePorts, refused)
}

// Deletes a proxy missed while its watch was down are applied once the apiserver says its
// resource version is gone (410 Gone, "too old resource version") and the informer lists
// again. The proxies on node-a are frozen (SIGSTOP) so that they read nothing while the
// apiserver restarts (its new watch cache starts past what they saw) and Services are
// deleted; once thawed, their watches resume from the old version, get 410, and relist.
// Their logs must show that path (the reflector logs at level 4), not just the outcome.
func deletesMissedInAWatchGap(t *T) {
	eps := []endpoint{ready("a0"), ready("b0")}
	_, kept := t.variantServices("kept", corev1.ServiceTypeClusterIP, eps, httpPort)
	doomed, gone := t.variantServices("doomed", corev1.ServiceTypeClusterIP, eps, httpPort)
	t.expectBackends(from("a1"), append(append([]target{}, kept...), gone...), "a0", "b0")

	offsets := byCluster[int64]{}
	t.each(func(cl *cluster) error {
		p := cl.proc("node-a")
		offsets.set(cl, logSize(p))
		if err := syscall.Kill(p.Pid(), syscall.SIGSTOP); err != nil {
			return fmt.Errorf("freezing the proxy on node-a: %w", err)
		}
		t.Cleanup(func() { _ = syscall.Kill(p.Pid(), syscall.SIGCONT) })
		return nil
	})
	// A write while they are frozen, so the resource version moves on even if the
	// apiserver's restart writes nothing.
	t.e.namespace(t)
	if err := t.e.cp.RestartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, svc := range doomed {
		t.e.deleteService(t, svc)
	}
	t.each(func(cl *cluster) error {
		return syscall.Kill(cl.proc("node-a").Pid(), syscall.SIGCONT)
	})

	t.expectBackends(from("a1"), kept, "a0", "b0")
	t.expectResult(from("a1"), gone, timeout)
	t.run(check{
		what: "node-a proxy's Service informer after the gap",
		want: []string{relisted}, once: true,
		observe: func(cl *cluster) string {
			return relistEvidence(logSince(cl.proc("node-a"), offsets.get(cl)))
		},
	})
}

// relisted is what the log of a proxy whose Service watch hit 410 Gone and relisted shows.
const relisted = "watch ended with 410 Gone (too old resource version), then relisted"

// relistEvidence reads a proxy's log for the reflector's account of a relist: a watch of
// Services closed with "too old resource version" (level 4), then "Caches populated" for
// Services again (level 2).
func relistEvidence(log string) string {
	lines := strings.Split(log, "\n")
	gone := -1
	for i, l := range lines {
		if strings.Contains(l, "too old resource version") && strings.Contains(l, `v1.Service"`) {
			gone = i
			break
		}
	}
	if gone < 0 {
		return "no 410 Gone for the Service watch in the log"
	}
	for _, l := range lines[gone:] {
		if strings.Contains(l, "Caches populated") && strings.Contains(l, `v1.Service"`) {
			return relisted
		}
	}
	return "410 Gone for the Service watch, but no relist after it in the log"
}

// syncTimeout bounds waitInSync. After an apiserver restart a proxy's informers may be
// backing off from failed watches (up to 30s, client-go's reflector) before they relist.
const syncTimeout = 3 * time.Minute

// waitInSync waits until every proxy has caught up with the apiserver after the disruptive
// cases: a new dual-stack Service is answered over both its ClusterIPs from a pod on each
// node of every cluster. Without it, the first cases after an apiserver restart would
// measure how long a proxy's informers back off, not what they are about.
func (e *env) waitInSync(t *testing.T) {
	started := time.Now()
	ns := e.namespace(t)
	svc := e.createService(t, dualStack, service(ns, "in-sync", corev1.ServiceTypeClusterIP, httpPort))
	defer e.deleteService(t, svc)
	e.setEndpoints(t, svc, ready("a0"))
	tgs := clusterIPs(t, svc, "http")
	var wg sync.WaitGroup
	errs := make(chan error, len(e.clusters)*2*len(tgs))
	for _, cl := range e.clusters {
		if cl.only != nil {
			continue // stopped
		}
		for _, pod := range []string{"a1", "b1"} {
			for _, tg := range tgs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					deadline := time.Now().Add(syncTimeout)
					for {
						o := cl.probe(from(pod), tg, 0)
						if o.Result == echo.Answered {
							return
						}
						if time.Now().After(deadline) {
							errs <- fmt.Errorf("[%s] %s -> %s: %s after %s", cl.name, pod, tg.name, o, syncTimeout)
							return
						}
						time.Sleep(200 * time.Millisecond)
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errs)
	// Only its own errors stop the suite: a disruptive case that failed has already said
	// so, and the other cases still run.
	behind := false
	for err := range errs {
		t.Errorf("after the disruptive cases, a proxy did not catch up: %v", err)
		behind = true
	}
	if behind {
		t.FailNow()
	}
	t.Logf("every proxy in sync %.1fs after the disruptive cases", time.Since(started).Seconds())
}
