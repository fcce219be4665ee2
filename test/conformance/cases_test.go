//go:build conformance

package conformance

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/require"
	"github.com/sluiceproxy/sluice/test/topology"
)

// A conformance case: a name (run one with -run 'TestConformance/<name>') and a function
// that builds its Services and asserts on what clients receive, never on rules.
type conformanceCase struct {
	name string
	run  func(t *testing.T, e *env)
}

var cases = []conformanceCase{
	{"ClusterIPFromNodeAndPods", clusterIPFromNodeAndPods},
	{"NoEndpointsIsRefused", noEndpointsIsRefused},
	{"RemovedEndpointStopsReceiving", removedEndpointStopsReceiving},
	{"TerminatingEndpointsOnlyWhenNoReadyOnes", terminatingEndpointsOnlyWhenNoReadyOnes},
	{"TopologyHintsKeepTrafficInZone", topologyHintsKeepTrafficInZone},
	{"InternalTrafficPolicyLocal", internalTrafficPolicyLocal},
	{"NodePortFromExternalIsMasqueraded", nodePortFromExternalIsMasqueraded},
	{"ExternalTrafficPolicyLocalNodePort", externalTrafficPolicyLocalNodePort},
	{"LoadBalancerIP", loadBalancerIP},
	{"LoadBalancerLocalWithHealthCheck", loadBalancerLocalWithHealthCheck},
	{"LoadBalancerSourceRanges", loadBalancerSourceRanges},
	{"ExternalIP", externalIP},
	{"SessionAffinityClientIP", sessionAffinityClientIP},
	{"UDPFlowFollowsReplacedBackend", udpFlowFollowsReplacedBackend},
	{"HairpinPodReachesItself", hairpinPodReachesItself},
	{"SCTPClusterIPAndNodePort", sctpClusterIPAndNodePort},
	{"UnusedClusterIPPort", unusedClusterIPPort},
	{"LocalhostNodePort", localhostNodePort},
	{"DeletedServiceStopsAnswering", deletedServiceStopsAnswering},
	{"ServicePortChange", servicePortChange},
	{"EndpointsAcrossSlices", endpointsAcrossSlices},
	{"LocalPolicyDoesNotApplyToClusterClients", localPolicyDoesNotApplyToClusterClients},
	{"UDPFlowRecoversWhenEndpointsAppear", udpFlowRecoversWhenEndpointsAppear},
	{"LocalPolicyDrainsLocalTerminatingEndpoints", localPolicyDrainsLocalTerminatingEndpoints},
}

// disruptiveCases restart sluice or the apiserver, which every case depends on: they run
// alone, before the others.
var disruptiveCases = []conformanceCase{
	{"ProxyRestartKeepsTrafficFlowing", proxyRestartKeepsTrafficFlowing},
	{"APIServerOutageKeepsTrafficFlowing", apiServerOutageKeepsTrafficFlowing},
}

// TestConformance builds the environment once and runs every case against it: the
// disruptive ones one by one, then the others in parallel (each case owns its namespace,
// Services and virtual IPs).
func TestConformance(t *testing.T) {
	e := setup(t)
	for _, c := range disruptiveCases {
		t.Run(c.name, func(t *testing.T) {
			e.dumpOnFailure(t)
			c.run(t, e)
		})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e.dumpOnFailure(t)
			c.run(t, e)
		})
	}
}

// pods returns the topology's pods a0, a1, b0, b1.
func (e *env) pods() (a0, a1, b0, b1 *topology.Pod) {
	return e.topo.Pod("a0"), e.topo.Pod("a1"), e.topo.Pod("b0"), e.topo.Pod("b1")
}

func (e *env) nodes() (nodeA, nodeB *topology.Node) { return e.topo.Nodes[0], e.topo.Nodes[1] }

// externalV4 is the external client's k-th IPv4 address.
func (e *env) externalV4(k int) netip.Addr {
	var v4 []netip.Addr
	for _, a := range e.topo.ExternalIPs {
		if a.Is4() {
			v4 = append(v4, a)
		}
	}
	return v4[k]
}

// Every ready endpoint answers a ClusterIP, over TCP and UDP, from the node itself, from a
// pod on the same node and from a pod on the other node; pods keep their own source
// address (no masquerading for traffic from the cluster CIDR).
func clusterIPFromNodeAndPods(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "web", corev1.ServiceTypeClusterIP,
		port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	for _, fam := range e.families {
		ip := clusterIP(t, svc, fam)
		for _, sp := range svc.Spec.Ports {
			target, proto := at(ip, sp.Port), protoOf(sp.Protocol)
			e.expectBackends(t, from(&nodeA.Host), proto, target, "a0", "b0")
			r := e.expectBackends(t, from(&a1.Host), proto, target, "a0", "b0")
			expectSources(t, "a1 (same node)", r, familyAddr(&a1.Host, fam))
			r = e.expectBackends(t, from(&b1.Host), proto, target, "a0", "b0")
			expectSources(t, "b1 (other node)", r, familyAddr(&b1.Host, fam))
		}
	}
}

// A Service whose endpoints all went away refuses connections (TCP RST / ICMP port
// unreachable) instead of letting clients time out, for its ClusterIP and its NodePort.
func noEndpointsIsRefused(t *testing.T, e *env) {
	a0, _, _, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "empty", corev1.ServiceTypeNodePort,
		port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	// First prove the Service is programmed, so that a refusal below is sluice's and not
	// an unprogrammed address's.
	e.setEndpoints(t, svc, ready(a0))
	ip := clusterIP(t, svc, corev1.IPv4Protocol)
	http, dns := svcPort(t, svc, "http"), svcPort(t, svc, "dns")
	e.expectBackends(t, from(&b1.Host), echo.TCP, at(ip, http.Port), "a0")
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(nodeA.IPv4, http.NodePort), "a0")

	e.setEndpoints(t, svc)
	e.expectResult(t, from(&b1.Host), echo.TCP, at(ip, http.Port), echo.Refused)
	e.expectResult(t, from(&b1.Host), echo.UDP, at(ip, dns.Port), echo.Refused)
	e.expectResult(t, from(e.topo.External), echo.TCP, at(nodeA.IPv4, http.NodePort), echo.Refused)
	e.expectResult(t, from(e.topo.External), echo.UDP, at(nodeA.IPv4, dns.NodePort), echo.Refused)
}

// An endpoint removed from the EndpointSlice stops receiving new connections.
func removedEndpointStopsReceiving(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "shrink", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.setEndpoints(t, svc, ready(a0), ready(a1), ready(b0))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0", "a1", "b0")
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0", "b0")
}

// Terminating-but-serving endpoints are used only when no ready endpoint is left; when
// nothing is serving, the Service refuses.
func terminatingEndpointsOnlyWhenNoReadyOnes(t *testing.T, e *env) {
	a0, a1, b0, _ := e.pods()
	svc := e.createService(t, service(e.namespace(t), "rollout", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.setEndpoints(t, svc, ready(a0), terminating(b0, true))
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "a0")
	e.setEndpoints(t, svc, terminating(a0, false), terminating(b0, true))
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "b0")
	e.setEndpoints(t, svc, terminating(a0, false), terminating(b0, false))
	e.expectResult(t, from(&a1.Host), echo.TCP, target, echo.Refused)
}

// When every endpoint has zone hints, a node uses only the endpoints hinted for its zone;
// as soon as one endpoint lacks hints, all endpoints are used again.
func topologyHintsKeepTrafficInZone(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "zonal", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.setEndpoints(t, svc, ready(a0).hinted("zone-a"), ready(a1).hinted("zone-a"), ready(b0).hinted("zone-b"))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "b0")
	e.expectBackends(t, from(&nodeA.Host), echo.TCP, target, "a0", "a1")
	e.setEndpoints(t, svc, ready(a0).hinted("zone-a"), ready(a1).hinted("zone-a"), ready(b0))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0", "a1", "b0")
}

// internalTrafficPolicy: Local sends pods only to endpoints on their own node, and a node
// without local endpoints gets nothing (see capabilities.InternalNoLocalEndpoints).
func internalTrafficPolicyLocal(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	s := service(e.namespace(t), "node-local", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53))
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	svc := e.createService(t, s)
	ip := clusterIP(t, svc, corev1.IPv4Protocol)
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	for _, proto := range []echo.Protocol{echo.TCP, echo.UDP} {
		target := at(ip, 80)
		if proto == echo.UDP {
			target = at(ip, 53)
		}
		e.expectBackends(t, from(&a1.Host), proto, target, "a0")
		e.expectBackends(t, from(&b1.Host), proto, target, "b0")
	}
	e.setEndpoints(t, svc, ready(b0))
	e.expectBackends(t, from(&b1.Host), echo.TCP, at(ip, 80), "b0")
	e.expectResult(t, from(&a1.Host), echo.TCP, at(ip, 80), e.caps.InternalNoLocalEndpoints...)
	e.expectResult(t, from(&a1.Host), echo.UDP, at(ip, 53), e.caps.InternalNoLocalEndpoints...)
}

// A NodePort (externalTrafficPolicy Cluster) answers on every node, from the external
// client and from the node itself, with every endpoint; the external client's address is
// masqueraded to an address of the node it reached.
func nodePortFromExternalIsMasqueraded(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	svc := e.createService(t, service(e.namespace(t), "np", corev1.ServiceTypeNodePort,
		port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	for _, fam := range e.families {
		for _, n := range e.topo.Nodes {
			for _, sp := range svc.Spec.Ports {
				target, proto := at(familyAddr(&n.Host, fam), sp.NodePort), protoOf(sp.Protocol)
				r := e.expectBackends(t, from(e.topo.External), proto, target, "a0", "b0")
				expectSources(t, "external via "+n.Name, r, nodeAddrs(n)...)
				e.expectBackends(t, from(&n.Host), proto, target, "a0", "b0")
			}
		}
	}
}

// externalTrafficPolicy: Local on a NodePort: each node sends only to its own endpoints
// and the pod sees the external client's real address; a node without local endpoints
// gets nothing (capabilities.ExternalNoLocalEndpoints) while the other keeps answering.
func externalTrafficPolicyLocalNodePort(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, nodeB := e.nodes()
	s := service(e.namespace(t), "np-local", corev1.ServiceTypeNodePort, port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53))
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(t, s)
	http, dns := svcPort(t, svc, "http"), svcPort(t, svc, "dns")
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	ext := e.externalV4(0)
	for _, np := range []int32{http.NodePort, dns.NodePort} {
		proto := echo.TCP
		if np == dns.NodePort {
			proto = echo.UDP
		}
		r := e.expectBackends(t, from(e.topo.External), proto, at(nodeA.IPv4, np), "a0")
		expectSources(t, "external via node-a", r, ext)
		r = e.expectBackends(t, from(e.topo.External), proto, at(nodeB.IPv4, np), "b0")
		expectSources(t, "external via node-b", r, ext)
	}
	e.setEndpoints(t, svc, ready(b0))
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(nodeB.IPv4, http.NodePort), "b0")
	e.expectResult(t, from(e.topo.External), echo.TCP, at(nodeA.IPv4, http.NodePort), e.caps.ExternalNoLocalEndpoints...)
	e.expectResult(t, from(e.topo.External), echo.UDP, at(nodeA.IPv4, dns.NodePort), e.caps.ExternalNoLocalEndpoints...)
}

// A LoadBalancer ingress IP (status patched by the test, routed by the external client to
// a node) reaches every endpoint through whichever node receives it.
func loadBalancerIP(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, nodeB := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "lb", corev1.ServiceTypeLoadBalancer,
		port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	lb := e.vip(t, "192.0.2", nodeA)
	e.setLoadBalancerIngress(t, svc, lb)
	for _, via := range []*topology.Node{nodeA, nodeB} {
		e.routeVIP(t, lb, via)
		for _, sp := range svc.Spec.Ports {
			r := e.expectBackends(t, from(e.topo.External), protoOf(sp.Protocol), at(lb, sp.Port), "a0", "b0")
			expectSources(t, "external via "+via.Name, r, nodeAddrs(via)...)
		}
	}
}

// A LoadBalancer with externalTrafficPolicy Local: the receiving node uses only its own
// endpoints and preserves the client address, and its healthCheckNodePort tells the
// load balancer which nodes have local endpoints (200) and which do not (503).
func loadBalancerLocalWithHealthCheck(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, nodeB := e.nodes()
	s := service(e.namespace(t), "lb-local", corev1.ServiceTypeLoadBalancer, port("http", corev1.ProtocolTCP, 80))
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(t, s)
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	lb := e.vip(t, "192.0.2", nodeA)
	svc = e.setLoadBalancerIngress(t, svc, lb)
	ext := e.externalV4(0)
	r := e.expectBackends(t, from(e.topo.External), echo.TCP, at(lb, 80), "a0")
	expectSources(t, "external via node-a", r, ext)
	e.routeVIP(t, lb, nodeB)
	r = e.expectBackends(t, from(e.topo.External), echo.TCP, at(lb, 80), "b0")
	expectSources(t, "external via node-b", r, ext)

	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	e.setEndpoints(t, svc, ready(a0))
	health := func(n *topology.Node) string {
		return fmt.Sprintf("http://%s/healthz", at(n.IPv4, svc.Spec.HealthCheckNodePort))
	}
	for n, want := range map[*topology.Node]int{nodeA: 200, nodeB: 503} {
		e.eventually(t, fmt.Sprintf("%s answers %d", health(n), want), func() error {
			code, err := httpGet(e.topo.External, health(n))
			if err != nil {
				return err
			}
			if code != want {
				return fmt.Errorf("status %d", code)
			}
			return nil
		})
	}
	e.expectResult(t, from(e.topo.External), echo.TCP, at(lb, 80), e.caps.ExternalNoLocalEndpoints...)
}

// With externalTrafficPolicy Local, a node whose local endpoints are all terminating but
// still serving keeps sending external traffic to them rather than dropping it (local and
// cluster endpoints fall back independently), while its healthCheckNodePort already
// answers 503, so the load balancer drains the node.
func localPolicyDrainsLocalTerminatingEndpoints(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, nodeB := e.nodes()
	s := service(e.namespace(t), "lb-drain", corev1.ServiceTypeLoadBalancer, port("http", corev1.ProtocolTCP, 80))
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(t, s)
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	lb := e.vip(t, "192.0.2", nodeA)
	svc = e.setLoadBalancerIngress(t, svc, lb)
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(lb, 80), "a0")

	e.setEndpoints(t, svc, terminating(a0, true), ready(b0))
	health := fmt.Sprintf("http://%s/healthz", at(nodeA.IPv4, svc.Spec.HealthCheckNodePort))
	e.eventually(t, health+" answers 503 once a0 terminates", func() error {
		code, err := httpGet(e.topo.External, health)
		if err != nil {
			return err
		}
		if code != 503 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(lb, 80), "a0")
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(nodeB.IPv4, svcPort(t, svc, "http").NodePort), "b0")
}

// loadBalancerSourceRanges admit the listed sources and drop every other one.
func loadBalancerSourceRanges(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, _ := e.nodes()
	allowed, other := e.externalV4(0), e.externalV4(1)
	s := service(e.namespace(t), "lb-ranges", corev1.ServiceTypeLoadBalancer, port("http", corev1.ProtocolTCP, 80))
	s.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(allowed, 32).String()}
	svc := e.createService(t, s)
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	lb := e.vip(t, "192.0.2", nodeA)
	e.setLoadBalancerIngress(t, svc, lb)
	c := from(e.topo.External)
	c.source = allowed
	e.expectBackends(t, c, echo.TCP, at(lb, 80), "a0", "b0")
	c.source = other
	e.expectResult(t, c, echo.TCP, at(lb, 80), echo.Timeout)
}

// spec.externalIPs are served to the external client like a ClusterIP, through the node
// the address is routed to.
func externalIP(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	_, nodeB := e.nodes()
	ip := e.vip(t, "198.51.100", nodeB)
	s := service(e.namespace(t), "extip", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53))
	s.Spec.ExternalIPs = []string{ip.String()}
	svc := e.createService(t, s)
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	for _, sp := range svc.Spec.Ports {
		e.expectBackends(t, from(e.topo.External), protoOf(sp.Protocol), at(ip, sp.Port), "a0", "b0")
	}
}

// sessionAffinity ClientIP pins a client to one endpoint; once the client has been idle
// for timeoutSeconds, it may land elsewhere.
func sessionAffinityClientIP(t *testing.T, e *env) {
	const timeoutSeconds = 2
	a0, a1, b0, b1 := e.pods()
	s := service(e.namespace(t), "sticky", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80))
	s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](timeoutSeconds)}}
	svc := e.createService(t, s)
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.setEndpoints(t, svc, ready(a0), ready(a1), ready(b0))
	c := from(&b1.Host)

	var pinned string
	e.eventually(t, "b1 pinned to one endpoint for 20 connections", func() error {
		pinned = ""
		for i := range 20 {
			out := c.probe(echo.TCP, target, 0)
			if out.Result != echo.Answered {
				return fmt.Errorf("try %d: %s", i, out)
			}
			if pinned == "" {
				pinned = out.Reply.Pod
			} else if out.Reply.Pod != pinned {
				return fmt.Errorf("try %d: answered by %s after %s", i, out.Reply.Pod, pinned)
			}
		}
		return nil
	})

	// Waiting out the affinity timeout is the behaviour under test, not a wait for sluice:
	// after each idle period a new choice is made, and with three endpoints some round
	// lands elsewhere (each round stays on the same one with probability 1/3). Where closed
	// connections hold the affinity (capabilities.AffinityHeldByClosedConnections: IPVS's
	// TIME_WAIT), an idle period lasts that much longer, plus a margin for the kernel's
	// timers (IPVS checks an expired template's connections every timeoutSeconds).
	idle := (timeoutSeconds + 1) * time.Second
	if e.caps.AffinityHeldByClosedConnections > 0 {
		idle += e.caps.AffinityHeldByClosedConnections + 5*time.Second
		t.Logf("%s: closed connections hold the affinity for %s; idle periods of %s", e.backend, e.caps.AffinityHeldByClosedConnections, idle)
	}
	deadline := time.Now().Add(convergeTimeout + 2*idle)
	for round := 1; ; round++ {
		time.Sleep(idle)
		out := c.probe(echo.TCP, target, 0)
		if out.Result != echo.Answered {
			t.Fatalf("round %d: %s", round, out)
		}
		if out.Reply.Pod != pinned {
			t.Logf("affinity expired after round %d: %s -> %s", round, pinned, out.Reply.Pod)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still pinned to %s after %d idle periods of %s", pinned, round, idle)
		}
	}
}

// A UDP client that keeps its socket (same source port) follows the Service when its
// backend is replaced: the stale conntrack entry to the removed endpoint is cleaned up,
// even though the old pod is still alive and would still answer. Through a ClusterIP from a
// pod, and through a NodePort from the external client.
func udpFlowFollowsReplacedBackend(t *testing.T, e *env) {
	a0, a1, _, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "udp", corev1.ServiceTypeNodePort, port("dns", corev1.ProtocolUDP, 53)))
	dns := svcPort(t, svc, "dns")
	e.setEndpoints(t, svc, ready(a0))

	flows := []struct {
		name   string
		host   *topology.Host
		target netip.AddrPort
		udp    *echo.UDPClient
	}{
		{name: "b1 -> ClusterIP", host: &b1.Host, target: at(clusterIP(t, svc, corev1.IPv4Protocol), dns.Port)},
		{name: "external -> node-a NodePort", host: e.topo.External, target: at(nodeA.IPv4, dns.NodePort)},
	}
	for i := range flows {
		u, err := flows[i].host.DialUDP(flows[i].target, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		flows[i].udp = u
	}
	answeredBy := func(u *echo.UDPClient, pod string) func() error {
		return func() error {
			out := u.Send(500 * time.Millisecond)
			if out.Result != echo.Answered || out.Reply.Pod != pod {
				return fmt.Errorf("from %s: %s", u.LocalAddr(), out)
			}
			return nil
		}
	}
	for _, f := range flows {
		e.eventually(t, f.name+" answered by a0", answeredBy(f.udp, "a0"))
	}
	e.setEndpoints(t, svc, ready(a1))
	for _, f := range flows {
		e.eventually(t, f.name+" (same socket) answered by a1 after the replacement", answeredBy(f.udp, "a1"))
		for range 5 {
			if err := answeredBy(f.udp, "a1")(); err != nil {
				t.Errorf("%s went back: %v", f.name, err)
			}
		}
	}
}

// A pod reaches itself through its own Service (hairpin): the only endpoint is the
// client, over TCP and UDP.
func hairpinPodReachesItself(t *testing.T, e *env) {
	a0, _, _, _ := e.pods()
	svc := e.createService(t, service(e.namespace(t), "self", corev1.ServiceTypeClusterIP,
		port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	e.setEndpoints(t, svc, ready(a0))
	ip := clusterIP(t, svc, corev1.IPv4Protocol)
	e.expectBackends(t, from(&a0.Host), echo.TCP, at(ip, 80), "a0")
	e.expectBackends(t, from(&a0.Host), echo.UDP, at(ip, 53), "a0")
}

// SCTP Services work like TCP ones: ClusterIP from a pod and NodePort from the external
// client. Skipped where the kernel has no SCTP (the echo servers cannot listen then).
func sctpClusterIPAndNodePort(t *testing.T, e *env) {
	require.Feature(t, require.SCTP, e.sctp, "kernel has no SCTP sockets; this case runs in the IPVS VM (hack/ipvs-vm.sh)")
	a0, _, b0, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "sctp", corev1.ServiceTypeNodePort, port("sctp", corev1.ProtocolSCTP, 80)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	sp := svcPort(t, svc, "sctp")
	e.expectBackends(t, from(&b1.Host), echo.SCTP, at(clusterIP(t, svc, corev1.IPv4Protocol), sp.Port), "a0", "b0")
	e.expectBackends(t, from(e.topo.External), echo.SCTP, at(nodeA.IPv4, sp.NodePort), "a0", "b0")
}

// A ClusterIP port that no Service port uses (capabilities.UnusedClusterIPPort): never
// answered; rejected where the backend claims whole ClusterIPs.
func unusedClusterIPPort(t *testing.T, e *env) {
	a0, _, _, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "oneport", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0))
	ip := clusterIP(t, svc, corev1.IPv4Protocol)
	e.expectBackends(t, from(&b1.Host), echo.TCP, at(ip, 80), "a0")
	e.expectResult(t, from(&b1.Host), echo.TCP, at(ip, 81), e.caps.UnusedClusterIPPort...)
	e.expectResult(t, from(&b1.Host), echo.UDP, at(ip, 81), e.caps.UnusedClusterIPPort...)
}

// NodePorts on 127.0.0.1 from the node itself (capabilities.LocalhostNodePorts).
func localhostNodePort(t *testing.T, e *env) {
	a0, _, b0, _ := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "localhost", corev1.ServiceTypeNodePort, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	np := svcPort(t, svc, "http").NodePort
	e.expectBackends(t, from(&nodeA.Host), echo.TCP, at(nodeA.IPv4, np), "a0", "b0")
	loopback := at(netip.MustParseAddr("127.0.0.1"), np)
	if e.caps.LocalhostNodePorts {
		e.expectBackends(t, from(&nodeA.Host), echo.TCP, loopback, "a0", "b0")
	} else {
		e.expectResult(t, from(&nodeA.Host), echo.TCP, loopback, echo.Refused, echo.Timeout)
	}
}

// Deleting a Service removes everything sluice programmed for it: its ClusterIP is no
// longer answered, nor refused (no stale reject rule survives).
func deletedServiceStopsAnswering(t *testing.T, e *env) {
	a0, _, _, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "doomed", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0")
	if err := e.kube.CoreV1().Services(svc.Namespace).Delete(t.Context(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectResult(t, from(&b1.Host), echo.TCP, target, echo.Timeout, echo.Unreachable)
}

// Changing a Service's port moves it: the new port is answered, the old one behaves like
// any unused ClusterIP port (capabilities.UnusedClusterIPPort).
func servicePortChange(t *testing.T, e *env) {
	a0, _, b0, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "moving", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	ip := clusterIP(t, svc, corev1.IPv4Protocol)
	e.expectBackends(t, from(&b1.Host), echo.TCP, at(ip, 80), "a0", "b0")
	e.updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports[0].Port = 90 })
	e.expectBackends(t, from(&b1.Host), echo.TCP, at(ip, 90), "a0", "b0")
	e.expectResult(t, from(&b1.Host), echo.TCP, at(ip, 80), e.caps.UnusedClusterIPPort...)
}

// A Service's endpoints are the union of all its EndpointSlices; an address listed in two
// slices counts once, and its ready entry wins over a terminating one.
func endpointsAcrossSlices(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "sliced", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.setSlice(t, svc, "one", ready(a0))
	e.setSlice(t, svc, "two", ready(b0), terminating(a0, false))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0", "b0")
	e.setSlice(t, svc, "one", ready(a1))
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a1", "b0")
}

// externalTrafficPolicy Local governs external traffic only: a pod, or the node itself,
// reaching a LoadBalancer IP is sent to any endpoint, even from a node without local ones.
func localPolicyDoesNotApplyToClusterClients(t *testing.T, e *env) {
	_, a1, b0, _ := e.pods()
	nodeA, nodeB := e.nodes()
	s := service(e.namespace(t), "lb-local-internal", corev1.ServiceTypeLoadBalancer, port("http", corev1.ProtocolTCP, 80))
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(t, s)
	e.setEndpoints(t, svc, ready(b0))
	lb := e.vip(t, "192.0.2", nodeB)
	e.setLoadBalancerIngress(t, svc, lb)
	e.expectBackends(t, from(e.topo.External), echo.TCP, at(lb, 80), "b0")
	e.expectBackends(t, from(&a1.Host), echo.TCP, at(lb, 80), "b0")
	e.expectBackends(t, from(&nodeA.Host), echo.TCP, at(lb, 80), "b0")
}

// A UDP client that started sending before the Service had endpoints (refused) gets
// through, from the same socket, once endpoints appear: the flow's conntrack entry, made
// without NAT, is cleaned up. Through a ClusterIP from a pod and a NodePort from outside.
func udpFlowRecoversWhenEndpointsAppear(t *testing.T, e *env) {
	a0, _, _, b1 := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "udp-late", corev1.ServiceTypeNodePort, port("dns", corev1.ProtocolUDP, 53)))
	e.setEndpoints(t, svc)
	dns := svcPort(t, svc, "dns")
	flows := []struct {
		name   string
		host   *topology.Host
		target netip.AddrPort
	}{
		{"b1 -> ClusterIP", &b1.Host, at(clusterIP(t, svc, corev1.IPv4Protocol), dns.Port)},
		{"external -> node-a NodePort", e.topo.External, at(nodeA.IPv4, dns.NodePort)},
	}
	clients := make([]*echo.UDPClient, len(flows))
	for i, f := range flows {
		u, err := f.host.DialUDP(f.target, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		clients[i] = u
		e.eventually(t, f.name+" refused while the Service has no endpoints", func() error {
			if out := u.Send(500 * time.Millisecond); out.Result != echo.Refused {
				return fmt.Errorf("from %s: %s", u.LocalAddr(), out)
			}
			return nil
		})
	}
	e.setEndpoints(t, svc, ready(a0))
	for i, f := range flows {
		u := clients[i]
		e.eventually(t, f.name+" (same socket) answered by a0 once it has endpoints", func() error {
			if out := u.Send(500 * time.Millisecond); out.Result != echo.Answered || out.Reply.Pod != "a0" {
				return fmt.Errorf("from %s: %s", u.LocalAddr(), out)
			}
			return nil
		})
	}
}

// Restarting sluice on a node drops nothing: rules stay in place while it is down, the new
// process takes over without a gap (it must not flush on start), an established
// connection survives, and the new process programs later changes.
func proxyRestartKeepsTrafficFlowing(t *testing.T, e *env) {
	a0, a1, b0, _ := e.pods()
	nodeA, _ := e.nodes()
	svc := e.createService(t, service(e.namespace(t), "steady", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "a0", "b0")
	stream := openStream(t, &a1.Host, target)

	watch := watchTraffic(from(&a1.Host), echo.TCP, target, "a0", "b0")
	e.sluice[nodeA.Name].Stop()
	time.Sleep(time.Second) // traffic keeps flowing while no proxy runs: that is the point
	e.startSluice(t, nodeA)
	e.waitHealthy(t, nodeA)
	// Let the new process do its first full sync under the watch.
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "a0", "b0")
	watch.finish(t, "traffic from a1 while sluice on node-a restarted")
	stream.expectSamePod(t)

	e.setEndpoints(t, svc, ready(a0))
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "a0")
}

// While the apiserver is down, sluice keeps what it programmed (traffic flows); when the
// apiserver is back, sluice picks up changes made after the outage.
func apiServerOutageKeepsTrafficFlowing(t *testing.T, e *env) {
	a0, a1, b0, b1 := e.pods()
	svc := e.createService(t, service(e.namespace(t), "outage", corev1.ServiceTypeClusterIP, port("http", corev1.ProtocolTCP, 80)))
	e.setEndpoints(t, svc, ready(a0), ready(b0))
	target := at(clusterIP(t, svc, corev1.IPv4Protocol), 80)
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "a0", "b0")
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "a0", "b0")

	watchA := watchTraffic(from(&a1.Host), echo.TCP, target, "a0", "b0")
	watchB := watchTraffic(from(&b1.Host), echo.TCP, target, "a0", "b0")
	if err := e.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // an outage: traffic must flow all along
	e.requireRunning(t)
	if err := e.cp.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	watchA.finish(t, "traffic from a1 during the apiserver outage")
	watchB.finish(t, "traffic from b1 during the apiserver outage")

	e.setEndpoints(t, svc, ready(b0))
	e.expectBackends(t, from(&a1.Host), echo.TCP, target, "b0")
	e.expectBackends(t, from(&b1.Host), echo.TCP, target, "b0")
}

// stream is one established TCP connection to the echo server, kept open across a
// disruption.
type stream struct {
	conn net.Conn
	r    *bufio.Reader
	pod  string
}

// openStream connects from h to target and reads the first reply.
func openStream(t *testing.T, h *topology.Host, target netip.AddrPort) *stream {
	var conn net.Conn
	if err := h.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", target.String(), echo.DefaultTimeout)
		return err
	}); err != nil {
		t.Fatalf("%s -> %s: %v", h.Name, target, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s := &stream{conn: conn, r: bufio.NewReader(conn)}
	r := s.exchange(t, false)
	s.pod = r.Pod
	return s
}

// exchange reads one reply line, after sending one line when send is true.
func (s *stream) exchange(t *testing.T, send bool) echo.Reply {
	t.Helper()
	_ = s.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if send {
		if _, err := s.conn.Write([]byte("again\n")); err != nil {
			t.Fatalf("established connection: write: %v", err)
		}
	}
	line, err := s.r.ReadString('\n')
	if err != nil {
		t.Fatalf("established connection: read: %v", err)
	}
	r, err := echo.ParseReply(line)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expectSamePod checks that the established connection still talks to its first pod.
func (s *stream) expectSamePod(t *testing.T) {
	t.Helper()
	if r := s.exchange(t, true); r.Pod != s.pod {
		t.Errorf("established connection now answered by %s, was %s", r.Pod, s.pod)
	}
}
