//go:build conformance

package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/require"
)

// A conformance case: a name (run one with -run 'TestConformance/<name>/<variant>') and a
// function that builds its Services and asserts on what clients receive, never on rules.
type conformanceCase struct {
	name string
	run  func(t *T)
	// variants are the family variants the case runs in; nil means all three. A case
	// that is family-specific says so here and in its comment.
	variants []family
	// proxies are the clusters ("sluice/nftables") the case runs in; nil means all. A
	// case about a feature of sluice's that upstream does not have runs in sluice's
	// clusters only, and nothing of it is compared with upstream.
	proxies []string
}

var cases = []conformanceCase{
	{name: "ClusterIPFromNodeAndPods", run: clusterIPFromNodeAndPods},
	{name: "NoEndpointsIsRefused", run: noEndpointsIsRefused},
	{name: "RemovedEndpointStopsReceiving", run: removedEndpointStopsReceiving},
	{name: "TerminatingEndpointsOnlyWhenNoReadyOnes", run: terminatingEndpointsOnlyWhenNoReadyOnes},
	{name: "TopologyHintsKeepTrafficInZone", run: topologyHintsKeepTrafficInZone},
	{name: "InternalTrafficPolicyLocal", run: internalTrafficPolicyLocal},
	{name: "NodePortFromExternalIsMasqueraded", run: nodePortFromExternalIsMasqueraded},
	{name: "NodePortAddressesRestrictNodePorts", run: nodePortAddressesRestrictNodePorts},
	{name: "ExternalTrafficPolicyLocalNodePort", run: externalTrafficPolicyLocalNodePort},
	{name: "LoadBalancerIP", run: loadBalancerIP},
	{name: "LoadBalancerLocalWithHealthCheck", run: loadBalancerLocalWithHealthCheck},
	{name: "LoadBalancerSourceRanges", run: loadBalancerSourceRanges},
	{name: "LoadBalancerSourceRangesSpareNodePorts", run: loadBalancerSourceRangesSpareNodePorts},
	{name: "ExternalIP", run: externalIP},
	{name: "PodToExternalIP", run: podToExternalIP},
	{name: "SessionAffinityClientIP", run: sessionAffinityClientIP},
	{name: "UDPFlowFollowsReplacedBackend", run: udpFlowFollowsReplacedBackend},
	{name: "HairpinPodReachesItself", run: hairpinPodReachesItself},
	{name: "SCTPClusterIPAndNodePort", run: sctpClusterIPAndNodePort},
	{name: "UnusedClusterIPPort", run: unusedClusterIPPort},
	{name: "LocalhostNodePort", run: localhostNodePort, variants: []family{ipv4Only, ipv6Only}},
	{name: "DeletedServiceStopsAnswering", run: deletedServiceStopsAnswering},
	{name: "ServicePortChange", run: servicePortChange},
	{name: "EndpointsAcrossSlices", run: endpointsAcrossSlices},
	{name: "LocalPolicyDoesNotApplyToClusterClients", run: localPolicyDoesNotApplyToClusterClients},
	{name: "UDPFlowRecoversWhenEndpointsAppear", run: udpFlowRecoversWhenEndpointsAppear},
	{name: "LocalPolicyDrainsLocalTerminatingEndpoints", run: localPolicyDrainsLocalTerminatingEndpoints},
	{name: "TrafficCounters", run: trafficCountersCase, proxies: []string{"sluice/iptables", "sluice/nftables"}},
}

// disruptiveCases stop a proxy or the apiserver, which every case depends on: they run
// alone, before the others, each checking Services of every family variant across one
// disruption.
var disruptiveCases = []conformanceCase{
	{name: "ProxyRestartKeepsTrafficFlowing", run: proxyRestartKeepsTrafficFlowing},
	{name: "APIServerOutageKeepsTrafficFlowing", run: apiServerOutageKeepsTrafficFlowing},
	{name: "ServiceDeletedWhileProxyDown", run: serviceDeletedWhileProxyDown},
	{name: "DeletesMissedInAWatchGap", run: deletesMissedInAWatchGap},
}

// TestConformance builds the environment once and runs every case against it: first the
// cases a restricted cluster runs (-proxies "sluice/iptables:SCTPClusterIPAndNodePort"),
// each with its variants in parallel, after which the restricted clusters stop; then the
// disruptive ones one by one; then the others in parallel, each in every family variant
// (each case and variant owns its namespace, Services and virtual IPs).
func TestConformance(t *testing.T) {
	e := setup(t)
	variantsOf := func(c conformanceCase) func(t *testing.T) {
		return func(t *testing.T) {
			variants := c.variants
			if variants == nil {
				variants = familyVariants
			}
			for _, f := range variants {
				t.Run(f.name, func(t *testing.T) {
					t.Parallel()
					runCase(t, e, c.name, f, c.run)
				})
			}
		}
	}
	early := e.restrictedCases()
	for _, c := range cases {
		if slices.Contains(early, c.name) {
			t.Run(c.name, variantsOf(c))
		}
	}
	e.stopRestricted(t)
	for _, c := range disruptiveCases {
		t.Run(c.name, func(t *testing.T) { runCase(t, e, c.name, allFamilies, c.run) })
	}
	e.waitInSync(t)
	for _, c := range cases {
		if slices.Contains(early, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			variantsOf(c)(t)
		})
	}
}

// restrictedCases are the cases some restricted cluster runs. They run before the others,
// so that the restricted clusters can stop early: their proxies would otherwise program
// every other case's Services, for nothing (in the emulated IPVS VM, for minutes).
func (e *env) restrictedCases() []string {
	var out []string
	for _, cl := range e.clusters {
		for _, name := range cl.only {
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// stopRestricted stops the proxies of the restricted clusters, whose cases have run.
func (e *env) stopRestricted(t *testing.T) {
	for _, cl := range e.clusters {
		if cl.only == nil {
			continue
		}
		for _, p := range cl.processes() {
			p.Stop()
		}
		t.Logf("cluster %s ran its cases (%s) and stopped", cl.name, strings.Join(cl.only, ", "))
	}
}

// Outcomes the cases expect.
const (
	timeout = "timeout"
	refused = "refused"
	// refusedLate is a refusal a TCP client learns of only when it sends its SYN again
	// (see echo.Outcome.SYNRetransmits): an ICMPv6 error on the first SYN is a soft error.
	refusedLate = "refused after a SYN retransmission"
)

var (
	// refusals are the outcomes a refused client can see.
	refusals = []string{refused, refusedLate}
	// notAnswered are the outcomes of a client that gets no answer: a refusal or silence.
	notAnswered = []string{refused, refusedLate, timeout}
)

// service creates a Service named name in the case's own namespace and family variant.
func (t *T) service(name string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return t.serviceIn(t.fam, name, typ, ports...)
}

// serviceIn creates a Service in another variant (disruptive cases cover them all), in a
// namespace of its own.
func (t *T) serviceIn(f family, name string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return t.e.createService(t, f, service(t.e.namespace(t), name, typ, ports...))
}

// shape adjusts a Service before it is created.
func (t *T) serviceWith(name string, typ corev1.ServiceType, shape func(*corev1.Service), ports ...corev1.ServicePort) *corev1.Service {
	s := service(t.e.namespace(t), name, typ, ports...)
	shape(s)
	return t.e.createService(t, t.fam, s)
}

func (t *T) endpoints(svc *corev1.Service, eps ...endpoint) { t.e.setEndpoints(t, svc, eps...) }

var (
	httpPort = port("http", corev1.ProtocolTCP, 80)
	dnsPort  = port("dns", corev1.ProtocolUDP, 53)
)

// masqueradedBy says which address of node a pod sees a masqueraded client as: the pod
// bridge's when the pod is on that node, else the node's underlay address (MASQUERADE
// takes the address of the interface the packet leaves by).
func masqueradedBy(node string, pods ...string) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		if strings.HasSuffix(node, "-"+p[:1]) {
			out[p] = node + "/cbr0"
		} else {
			out[p] = node + "/eth0"
		}
	}
	return out
}

// seenAs says that every pod sees the client as the same address.
func seenAs(name string, pods ...string) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		out[p] = name
	}
	return out
}

// Every ready endpoint answers a ClusterIP, over TCP and UDP, from the node itself, from a
// pod on the same node and from a pod on the other node; pods keep their own source
// address (no masquerading for traffic from the cluster CIDR).
func clusterIPFromNodeAndPods(t *T) {
	svc := t.service("web", corev1.ServiceTypeClusterIP, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	for _, p := range []string{"http", "dns"} {
		tgs := clusterIPs(t, svc, p)
		t.expectBackends(from("node-a"), tgs, "a0", "b0")
		t.expectSeenAs(from("a1"), tgs, seenAs("a1", "a0", "b0"))
		t.expectSeenAs(from("b1"), tgs, seenAs("b1", "a0", "b0"))
	}
}

// A Service whose endpoints all went away refuses connections (TCP RST or ICMP port
// unreachable) instead of letting clients time out, for its ClusterIP and its NodePort
// (capability NoEndpoints: how the refusal reaches a TCP client depends on the family).
func noEndpointsIsRefused(t *T) {
	svc := t.service("empty", corev1.ServiceTypeNodePort, httpPort, dnsPort)
	// First prove the Service is programmed, so that a refusal below is the proxy's and
	// not an unprogrammed address's.
	t.endpoints(svc, ready("a0"))
	t.expectBackends(from("b1"), clusterIPs(t, svc, "http"), "a0")
	t.expectBackends(from("external"), t.e.nodePorts(t, svc, "http", "node-a"), "a0")

	t.endpoints(svc)
	for _, p := range []string{"http", "dns"} {
		t.expectCapability("NoEndpoints", refusals, from("b1"), clusterIPs(t, svc, p))
		t.expectCapability("NoEndpoints", refusals, from("external"), t.e.nodePorts(t, svc, p, "node-a"))
	}
}

// An endpoint removed from the EndpointSlice stops receiving new connections.
func removedEndpointStopsReceiving(t *T) {
	svc := t.service("shrink", corev1.ServiceTypeClusterIP, httpPort)
	tgs := clusterIPs(t, svc, "http")
	t.endpoints(svc, ready("a0"), ready("a1"), ready("b0"))
	t.expectBackends(from("b1"), tgs, "a0", "a1", "b0")
	t.endpoints(svc, ready("a0"), ready("b0"))
	t.expectBackends(from("b1"), tgs, "a0", "b0")
}

// Terminating-but-serving endpoints are used only when no ready endpoint is left; when
// nothing is serving, the Service refuses like one without endpoints.
func terminatingEndpointsOnlyWhenNoReadyOnes(t *T) {
	svc := t.service("rollout", corev1.ServiceTypeClusterIP, httpPort)
	tgs := clusterIPs(t, svc, "http")
	t.endpoints(svc, ready("a0"), terminating("b0", true))
	t.expectBackends(from("a1"), tgs, "a0")
	t.endpoints(svc, terminating("a0", false), terminating("b0", true))
	t.expectBackends(from("a1"), tgs, "b0")
	t.endpoints(svc, terminating("a0", false), terminating("b0", false))
	t.expectCapability("NoEndpoints", refusals, from("a1"), tgs)
}

// When every endpoint has zone hints, a node uses only the endpoints hinted for its zone;
// as soon as one endpoint lacks hints, all endpoints are used again.
func topologyHintsKeepTrafficInZone(t *T) {
	svc := t.service("zonal", corev1.ServiceTypeClusterIP, httpPort)
	tgs := clusterIPs(t, svc, "http")
	t.endpoints(svc, ready("a0").hinted("zone-a"), ready("a1").hinted("zone-a"), ready("b0").hinted("zone-b"))
	t.expectBackends(from("b1"), tgs, "b0")
	t.expectBackends(from("node-a"), tgs, "a0", "a1")
	t.endpoints(svc, ready("a0").hinted("zone-a"), ready("a1").hinted("zone-a"), ready("b0"))
	t.expectBackends(from("b1"), tgs, "a0", "a1", "b0")
}

// internalTrafficPolicy: Local sends pods only to endpoints on their own node, and a node
// without local endpoints gets nothing (capability InternalNoLocalEndpoints).
func internalTrafficPolicyLocal(t *T) {
	svc := t.serviceWith("node-local", corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	for _, p := range []string{"http", "dns"} {
		t.expectBackends(from("a1"), clusterIPs(t, svc, p), "a0")
		t.expectBackends(from("b1"), clusterIPs(t, svc, p), "b0")
	}
	t.endpoints(svc, ready("b0"))
	t.expectBackends(from("b1"), clusterIPs(t, svc, "http"), "b0")
	for _, p := range []string{"http", "dns"} {
		t.expectCapability("InternalNoLocalEndpoints", notAnswered, from("a1"), clusterIPs(t, svc, p))
	}
}

// A NodePort (externalTrafficPolicy Cluster) answers on every node, from the external
// client and from the node itself, with every endpoint; the external client's address is
// masqueraded to the address of the receiving node that faces the endpoint.
func nodePortFromExternalIsMasqueraded(t *T) {
	svc := t.service("np", corev1.ServiceTypeNodePort, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	for _, node := range []string{"node-a", "node-b"} {
		for _, p := range []string{"http", "dns"} {
			tgs := t.e.nodePorts(t, svc, p, node)
			t.expectSeenAs(from("external"), tgs, masqueradedBy(node, "a0", "b0"))
			t.expectBackends(from(node), tgs, "a0", "b0")
		}
	}
}

// nodePortAddresses restricts NodePorts to the node addresses in its CIDRs (the suite's
// proxies have the primary underlay subnets and loopback): a NodePort answers on a node's
// primary address, but not on its secondary one, outside the CIDRs, where the node's own
// stack answers (capability NodePortOutsideNodePortAddresses).
func nodePortAddressesRestrictNodePorts(t *T) {
	svc := t.service("np-addresses", corev1.ServiceTypeNodePort, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	for _, p := range []string{"http", "dns"} {
		t.expectBackends(from("external"), t.e.nodePorts(t, svc, p, "node-a"), "a0", "b0")
		t.expectCapability("NodePortOutsideNodePortAddresses", notAnswered, from("external"), t.e.secondaryNodePorts(t, svc, p, "node-a"))
	}
}

// externalTrafficPolicy: Local on a NodePort: each node sends only to its own endpoints
// and the pod sees the external client's real address; a node without local endpoints
// gets nothing (capability ExternalNoLocalEndpoints) while the other keeps answering.
func externalTrafficPolicyLocalNodePort(t *T) {
	svc := t.serviceWith("np-local", corev1.ServiceTypeNodePort, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	for _, p := range []string{"http", "dns"} {
		t.expectSeenAs(from("external"), t.e.nodePorts(t, svc, p, "node-a"), seenAs("external", "a0"))
		t.expectSeenAs(from("external"), t.e.nodePorts(t, svc, p, "node-b"), seenAs("external", "b0"))
	}
	t.endpoints(svc, ready("b0"))
	t.expectBackends(from("external"), t.e.nodePorts(t, svc, "http", "node-b"), "b0")
	for _, p := range []string{"http", "dns"} {
		t.expectCapability("ExternalNoLocalEndpoints", notAnswered, from("external"), t.e.nodePorts(t, svc, p, "node-a"))
	}
}

// A LoadBalancer ingress IP (status patched by the test, routed by the external client to
// a node) reaches every endpoint through whichever node receives it, masqueraded.
func loadBalancerIP(t *T) {
	svc := t.service("lb", corev1.ServiceTypeLoadBalancer, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	lbs := t.e.vips(t, loadBalancerVIP, svc, "node-a")
	t.e.setLoadBalancerIngress(t, svc, lbs...)
	for _, via := range []string{"node-a", "node-b"} {
		for _, a := range lbs {
			t.e.routeVIP(t, a, via)
		}
		for _, p := range []string{"http", "dns"} {
			t.expectSeenAs(from("external"), vipTargets(t, loadBalancerVIP, lbs, svc, p), masqueradedBy(via, "a0", "b0"))
		}
	}
}

// healthCheck is the check that the Service's healthCheckNodePort on node answers code,
// over each family of the Service.
func (t *T) expectHealthCheck(svc *corev1.Service, node string, code int) {
	t.Helper()
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	for _, tg := range t.e.nodePorts(t, svc, svc.Spec.Ports[0].Name, node) {
		url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(tg.addr.Addr(), uint16(svc.Spec.HealthCheckNodePort)))
		t.run(check{
			what: fmt.Sprintf("external -> %s healthCheckNodePort %s", node, tg.fam()),
			want: []string{fmt.Sprintf("HTTP %d", code)},
			observe: func(cl *cluster) string {
				got, err := httpGet(cl.topo.External, url)
				if err != nil {
					return "error: " + err.Error()
				}
				return fmt.Sprintf("HTTP %d", got)
			},
		})
	}
}

// A LoadBalancer with externalTrafficPolicy Local: the receiving node uses only its own
// endpoints and preserves the client address, and its healthCheckNodePort tells the
// load balancer which nodes have local endpoints (200) and which do not (503).
func loadBalancerLocalWithHealthCheck(t *T) {
	svc, lbs, tgs := t.localLoadBalancer("lb-local")
	t.expectSeenAs(from("external"), tgs, seenAs("external", "a0"))
	for _, a := range lbs {
		t.e.routeVIP(t, a, "node-b")
	}
	t.expectSeenAs(from("external"), tgs, seenAs("external", "b0"))

	t.endpoints(svc, ready("a0"))
	t.expectHealthCheck(svc, "node-a", 200)
	t.expectHealthCheck(svc, "node-b", 503)
	t.expectCapability("ExternalNoLocalEndpoints", notAnswered, from("external"), tgs)
}

// localLoadBalancer creates a LoadBalancer Service (http) with externalTrafficPolicy
// Local, endpoints a0 and b0, and an ingress IP per family routed to node-a; it returns the
// Service, those IPs and their http targets.
func (t *T) localLoadBalancer(name string) (*corev1.Service, []netip.Addr, []target) {
	svc := t.serviceWith(name, corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, httpPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	lbs := t.e.vips(t, loadBalancerVIP, svc, "node-a")
	svc = t.e.setLoadBalancerIngress(t, svc, lbs...)
	return svc, lbs, vipTargets(t, loadBalancerVIP, lbs, svc, "http")
}

// With externalTrafficPolicy Local, a node whose local endpoints are all terminating but
// still serving keeps sending external traffic to them rather than dropping it (local and
// cluster endpoints fall back independently), while its healthCheckNodePort already
// answers 503, so the load balancer drains the node.
func localPolicyDrainsLocalTerminatingEndpoints(t *T) {
	svc, _, tgs := t.localLoadBalancer("lb-drain")
	t.expectBackends(from("external"), tgs, "a0")

	t.endpoints(svc, terminating("a0", true), ready("b0"))
	t.expectHealthCheck(svc, "node-a", 503)
	t.expectBackends(from("external"), tgs, "a0")
	t.expectBackends(from("external"), t.e.nodePorts(t, svc, "http", "node-b"), "b0")
}

// sourceRanges allows the external client's primary address of each family of svc.
func (t *T) sourceRanges(s *corev1.Service) {
	topo := t.e.clusters[0].topo
	for _, f := range t.fam.families {
		a := familyAddr(topo.External, f)
		s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, netip.PrefixFrom(a, a.BitLen()).String())
	}
}

// loadBalancerSourceRanges admit the listed sources and drop every other one.
func loadBalancerSourceRanges(t *T) {
	svc := t.serviceWith("lb-ranges", corev1.ServiceTypeLoadBalancer, t.sourceRanges, httpPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	lbs := t.e.vips(t, loadBalancerVIP, svc, "node-a")
	t.e.setLoadBalancerIngress(t, svc, lbs...)
	tgs := vipTargets(t, loadBalancerVIP, lbs, svc, "http")
	t.expectBackends(from("external").via("external"), tgs, "a0", "b0")
	t.expectResult(from("external").via("external-2"), tgs, timeout)
}

// loadBalancerSourceRanges restrict the load balancer IPs only: the Service's NodePorts
// answer every source, as upstream documents (NodePorts are not subject to
// loadBalancerSourceRanges).
func loadBalancerSourceRangesSpareNodePorts(t *T) {
	svc := t.serviceWith("lb-ranges-np", corev1.ServiceTypeLoadBalancer, t.sourceRanges, httpPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	lbs := t.e.vips(t, loadBalancerVIP, svc, "node-a")
	t.e.setLoadBalancerIngress(t, svc, lbs...)
	t.expectBackends(from("external").via("external"), vipTargets(t, loadBalancerVIP, lbs, svc, "http"), "a0", "b0")
	for _, node := range []string{"node-a", "node-b"} {
		t.expectBackends(from("external").via("external-2"), t.e.nodePorts(t, svc, "http", node), "a0", "b0")
	}
}

// spec.externalIPs are served to the external client through the node the address is
// routed to, masqueraded to that node's address facing the endpoint.
func externalIP(t *T) {
	svc, ips := t.serviceWithExternalIPs("extip", "node-b")
	for _, p := range []string{"http", "dns"} {
		t.expectSeenAs(from("external"), vipTargets(t, externalVIP, ips, svc, p), masqueradedBy("node-b", "a0", "b0"))
	}
}

// A pod reaches a Service's external IP through its own node, as it would from outside
// the cluster: every endpoint answers, and sees the pod masqueraded to its node's address
// facing the endpoint.
func podToExternalIP(t *T) {
	svc, ips := t.serviceWithExternalIPs("pod-extip", "node-b")
	for _, p := range []string{"http", "dns"} {
		t.expectSeenAs(from("a1"), vipTargets(t, externalVIP, ips, svc, p), masqueradedBy("node-a", "a0", "b0"))
	}
}

// serviceWithExternalIPs creates a ClusterIP Service (http and dns) with an external IP
// per family routed to node, and endpoints a0 and b0.
func (t *T) serviceWithExternalIPs(name, node string) (*corev1.Service, []netip.Addr) {
	svc := t.service(name, corev1.ServiceTypeClusterIP, httpPort, dnsPort)
	ips := t.e.vips(t, externalVIP, svc, node)
	svc = t.e.updateService(t, svc, func(s *corev1.Service) {
		for _, a := range ips {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, a.String())
		}
	})
	t.endpoints(svc, ready("a0"), ready("b0"))
	return svc, ips
}

// The ClientIP affinity settings of SessionAffinityClientIP: timeoutSeconds, how long an
// idle period below it lasts, how many of them, and how many idle periods past it show
// that the affinity is still held.
const (
	affinityTimeout   = 12 * time.Second
	affinityBelow     = affinityTimeout - 3*time.Second
	affinityBelowRuns = 3
	affinityPast      = affinityTimeout + 1500*time.Millisecond
	affinityPastRuns  = 8
)

// ipvsTCPTimeWait is IPVS's fixed TIME_WAIT timeout for TCP connections (2 minutes,
// net/netfilter/ipvs/ip_vs_proto_tcp.c); ipvsadm --set changes only established, FIN_WAIT
// and UDP. An IPVS persistence template lives until the connections it controls have left
// IPVS's table.
const ipvsTCPTimeWait = 2 * time.Minute

// sessionAffinity ClientIP pins a client to one endpoint for its whole timeout: after
// idle periods just below timeoutSeconds it is still on the same pod, and once idle for
// longer it lands on the endpoints at random again. Where closed connections hold the
// affinity (capability AffinityHeldByClosedConnections: IPVS keeps a closed connection in
// TIME_WAIT for two minutes, and its persistence template with it), a client stays
// pinned through every idle period past timeoutSeconds, and moves only once it has been
// idle for that long too.
func sessionAffinityClientIP(t *T) {
	svc := t.serviceWith("sticky", corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{
			TimeoutSeconds: ptr.To(int32(affinityTimeout / time.Second)),
		}}
	}, httpPort)
	// Four endpoints, so that a client that is not pinned any more stays on its pod
	// through affinityPastRuns idle periods by chance with probability 4^-8.
	t.endpoints(svc, ready("a0"), ready("a1"), ready("b0"), ready("b1"))
	c := from("node-a")
	tgs := clusterIPs(t, svc, "http")

	// The affinity's sequence runs for every target of every cluster at once: it is made
	// of waits.
	outcomes := byCluster[map[string][]string]{}
	t.each(func(cl *cluster) error {
		var mu sync.Mutex
		var wg sync.WaitGroup
		per := map[string][]string{}
		for _, tg := range tgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := cl.affinitySequence(c, tg)
				mu.Lock()
				per[tg.name] = o
				mu.Unlock()
			}()
		}
		wg.Wait()
		outcomes.set(cl, per)
		return nil
	})
	for _, tg := range tgs {
		what := fmt.Sprintf("%s -> %s", c, tg.name)
		phase := func(i int) func(cl *cluster) string {
			return func(cl *cluster) string { return outcomes.get(cl)[tg.name][i] }
		}
		t.run(check{what: what + ": 20 connections", want: []string{"one pod"}, observe: phase(0), once: true})
		t.run(check{what: what + fmt.Sprintf(": after %d idle periods of timeoutSeconds-3s", affinityBelowRuns), want: []string{"the same pod"}, observe: phase(1), once: true})
		t.run(check{
			what: what + ": idle periods of timeoutSeconds+1.5s", capability: "AffinityHeldByClosedConnections",
			variant: fmt.Sprintf("%s %s", tg.proto, tg.fam()), allowed: []string{affinityExpired, affinityHeld},
			observe: phase(2), once: true,
		})
	}
}

// The outcomes of the last phase of the affinity sequence.
var (
	affinityExpired = "another pod after the first idle periods"
	affinityHeld    = fmt.Sprintf("the same pod through %d idle periods; another once idle for %s more (IPVS's TIME_WAIT)", affinityPastRuns, ipvsTCPTimeWait)
)

// affinitySequence runs the affinity's phases from c to tg and returns their outcomes, one
// per phase: pinned, held below the timeout, and what happens past it.
func (cl *cluster) affinitySequence(c client, tg target) []string {
	out := []string{"not reached", "not reached", "not reached"}
	var pinned string
	var last time.Time // when the last probe started: its SYN refreshed the affinity
	deadline := time.Now().Add(convergeTimeout)
	for {
		pinned = ""
		ok := true
		for range 20 {
			last = time.Now()
			o := cl.probe(c, tg, 0)
			if o.Result != echo.Answered || (pinned != "" && o.Reply.Pod != pinned) {
				ok = false
				out[0] = "not one pod: " + cl.token(o, false)
				break
			}
			pinned = o.Reply.Pod
		}
		if ok {
			out[0] = "one pod"
			break
		}
		if time.Now().After(deadline) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Waiting is the behaviour under test here, not a wait for the proxy. Idle periods
	// count from the start of the last probe (its SYN refreshed the affinity), not from
	// its answer, which a busy machine may delay. A probe that times out says nothing
	// about the affinity (its SYN may not even have reached the node), so it is made
	// again at once, with a short timeout: the second try is still well inside
	// timeoutSeconds.
	for i := range affinityBelowRuns {
		time.Sleep(time.Until(last.Add(affinityBelow)))
		last = time.Now()
		o := cl.probe(c, tg, echo.DefaultTimeout)
		if o.Result == echo.Timeout {
			last = time.Now()
			o = cl.probe(c, tg, echo.DefaultTimeout)
		}
		if o.Result != echo.Answered || o.Reply.Pod != pinned {
			out[1] = fmt.Sprintf("after idle period %d: %s, pinned to %s", i+1, cl.token(o, false), pinned)
			return out
		}
	}
	out[1] = "the same pod"
	// movedAfter probes runs times, each after an idle period: what a probe got when it was
	// not answered, label when the client landed on another pod, "" while it stayed on
	// the pinned one. A lost SYN says nothing either way, so a timed-out probe is made
	// again at once.
	movedAfter := func(runs int, idle time.Duration, label string) string {
		for range runs {
			time.Sleep(idle)
			o := cl.probe(c, tg, 0)
			if o.Result == echo.Timeout {
				o = cl.probe(c, tg, 0)
			}
			if o.Result != echo.Answered {
				return cl.token(o, false)
			}
			if o.Reply.Pod != pinned {
				return label
			}
		}
		return ""
	}
	if out[2] = movedAfter(affinityPastRuns, affinityPast, affinityExpired); out[2] != "" {
		return out
	}
	// Still pinned: closed connections hold the affinity. Once idle for the TIME_WAIT
	// too (and a margin for the kernel's timers), the client moves; it may land on the
	// same pod again by chance (one in four), so keep going for a while.
	if out[2] = movedAfter(6, affinityPast+ipvsTCPTimeWait+5*time.Second, affinityHeld); out[2] != "" {
		return out
	}
	out[2] = fmt.Sprintf("the same pod after idle periods of %s", affinityPast+ipvsTCPTimeWait+5*time.Second)
	return out
}

// udpFlow is a UDP socket in every cluster that keeps its source port across sends.
type udpFlow struct {
	c    client
	tg   target
	sock byCluster[*echo.UDPClient]
}

// dialUDP opens the flow's socket in every cluster, closed when the case ends.
func (t *T) dialUDP(c client, tg target) *udpFlow {
	f := &udpFlow{c: c, tg: tg}
	t.each(func(cl *cluster) error {
		u, err := cl.host(c.host).DialUDP(tg.addr, netip.Addr{})
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = u.Close() })
		f.sock.set(cl, u)
		return nil
	})
	return f
}

// expectFlow waits until the flow's next datagram gets want ("answered by a1",
// "refused"), from the same socket.
func (t *T) expectFlow(f *udpFlow, what string, want string) {
	t.Helper()
	t.run(check{
		what:    fmt.Sprintf("%s -> %s (one socket)%s", f.c, f.tg.name, what),
		want:    []string{want},
		observe: f.send,
	})
}

// send sends one datagram from the flow's socket in the cluster and returns the outcome.
func (f *udpFlow) send(cl *cluster) string {
	out := f.sock.get(cl).Send(500 * time.Millisecond)
	if out.Result == echo.Answered {
		return answeredBy(out.Reply.Pod)
	}
	return cl.token(out, false)
}

// A UDP client that keeps its socket (same source port) follows the Service when its
// backend is replaced: the stale conntrack entry to the removed endpoint is cleaned up,
// even though the old pod is still alive and would still answer. Through a ClusterIP from a
// pod, and through a NodePort from the external client, in each family.
func udpFlowFollowsReplacedBackend(t *T) {
	svc := t.service("udp", corev1.ServiceTypeNodePort, dnsPort)
	t.endpoints(svc, ready("a0"))
	flows := t.dnsFlows(svc)
	for _, f := range flows {
		t.expectFlow(f, "", answeredBy("a0"))
	}
	t.endpoints(svc, ready("a1"))
	for _, f := range flows {
		t.expectFlow(f, " after the replacement", answeredBy("a1"))
		// The next answers come from a1 too: an answer from a0 fails at once (a lost
		// datagram is only sent again).
		for i := range 5 {
			t.run(check{
				what: fmt.Sprintf("%s -> %s (one socket) stays on a1, answer %d", f.c, f.tg.name, i+1),
				want: []string{answeredBy("a1")}, fatal: []string{answeredBy("a0")},
				observe: f.send,
			})
		}
	}
}

// A pod reaches itself through its own Service (hairpin): the only endpoint is the
// client, over TCP and UDP, and it sees itself masqueraded to its node's pod bridge
// address (else its reply would go straight back to itself, unNATed).
func hairpinPodReachesItself(t *T) {
	svc := t.service("self", corev1.ServiceTypeClusterIP, httpPort, dnsPort)
	t.endpoints(svc, ready("a0"))
	for _, p := range []string{"http", "dns"} {
		t.expectSeenAs(from("a0"), clusterIPs(t, svc, p), seenAs("node-a/cbr0", "a0"))
	}
}

// SCTP Services work like TCP ones: ClusterIP from a pod and NodePort from the external
// client. Skipped where the kernel has no SCTP (the echo servers cannot listen then).
func sctpClusterIPAndNodePort(t *T) {
	require.Feature(t, require.SCTP, t.e.sctp, "kernel has no SCTP sockets; this case runs in the IPVS VM (hack/ipvs-vm.sh)")
	svc := t.service("sctp", corev1.ServiceTypeNodePort, port("sctp", corev1.ProtocolSCTP, 80))
	t.endpoints(svc, ready("a0"), ready("b0"))
	t.expectBackends(from("b1"), clusterIPs(t, svc, "sctp"), "a0", "b0")
	t.expectBackends(from("external"), t.e.nodePorts(t, svc, "sctp", "node-a"), "a0", "b0")
}

// A ClusterIP port that no Service port uses (capability UnusedClusterIPPort): never
// answered; refused where the backend claims whole ClusterIPs.
func unusedClusterIPPort(t *T) {
	svc := t.service("oneport", corev1.ServiceTypeClusterIP, httpPort)
	t.endpoints(svc, ready("a0"))
	tgs := clusterIPs(t, svc, "http")
	t.expectBackends(from("b1"), tgs, "a0")
	for _, tg := range tgs {
		t.expectCapability("UnusedClusterIPPort", notAnswered, from("b1"), []target{tg.onPort(81, corev1.ProtocolTCP), tg.onPort(81, corev1.ProtocolUDP)})
	}
}

// NodePorts on the node's loopback address from the node itself (capability
// LocalhostNodePorts). Family-specific: 127.0.0.1 in the IPv4 variant, ::1 in the IPv6 one
// (a dual-stack Service adds nothing: it is the same two addresses).
func localhostNodePort(t *T) {
	svc := t.service("localhost", corev1.ServiceTypeNodePort, httpPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	t.expectBackends(from("node-a"), t.e.nodePorts(t, svc, "http", "node-a"), "a0", "b0")
	loopback := netip.MustParseAddr("127.0.0.1")
	if t.fam.name == "IPv6" {
		loopback = netip.IPv6Loopback()
	}
	tgs := addrTargets(t, "localhost NodePort", []netip.Addr{loopback}, svc, "http", true)
	t.expectCapability("LocalhostNodePorts", append([]string{answeredBy("a0", "b0")}, notAnswered...), from("node-a"), tgs)
}

// Deleting a Service removes everything the proxy programmed for it: its ClusterIP is no
// longer answered, nor refused (no stale reject rule survives): the packet leaves the node
// like any other, and the underlay drops it.
func deletedServiceStopsAnswering(t *T) {
	svc := t.service("doomed", corev1.ServiceTypeClusterIP, httpPort)
	t.endpoints(svc, ready("a0"))
	tgs := clusterIPs(t, svc, "http")
	t.expectBackends(from("b1"), tgs, "a0")
	t.e.deleteService(t, svc)
	t.expectResult(from("b1"), tgs, timeout)
}

// Changing a Service's port moves it: the new port is answered, the old one behaves like
// any unused ClusterIP port (capability UnusedClusterIPPort).
func servicePortChange(t *T) {
	svc := t.service("moving", corev1.ServiceTypeClusterIP, httpPort)
	t.endpoints(svc, ready("a0"), ready("b0"))
	old := clusterIPs(t, svc, "http")
	t.expectBackends(from("b1"), old, "a0", "b0")
	svc = t.e.updateService(t, svc, func(s *corev1.Service) { s.Spec.Ports[0].Port = 90 })
	t.expectBackends(from("b1"), clusterIPs(t, svc, "http"), "a0", "b0")
	for _, tg := range old {
		t.expectCapability("UnusedClusterIPPort", notAnswered, from("b1"), []target{tg.onPort(80, corev1.ProtocolTCP)})
	}
}

// A Service's endpoints are the union of all its EndpointSlices; an address listed in two
// slices counts once, and its ready entry wins over a terminating one.
func endpointsAcrossSlices(t *T) {
	svc := t.service("sliced", corev1.ServiceTypeClusterIP, httpPort)
	tgs := clusterIPs(t, svc, "http")
	t.e.setSlice(t, svc, "one", ready("a0"))
	t.e.setSlice(t, svc, "two", ready("b0"), terminating("a0", false))
	t.expectBackends(from("b1"), tgs, "a0", "b0")
	t.e.setSlice(t, svc, "one", ready("a1"))
	t.expectBackends(from("b1"), tgs, "a1", "b0")
}

// externalTrafficPolicy Local governs external traffic only: a pod, or the node itself,
// reaching a LoadBalancer IP is sent to any endpoint, even from a node without local ones.
func localPolicyDoesNotApplyToClusterClients(t *T) {
	svc := t.serviceWith("lb-local-internal", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}, httpPort)
	t.endpoints(svc, ready("b0"))
	lbs := t.e.vips(t, loadBalancerVIP, svc, "node-b")
	t.e.setLoadBalancerIngress(t, svc, lbs...)
	tgs := vipTargets(t, loadBalancerVIP, lbs, svc, "http")
	t.expectBackends(from("external"), tgs, "b0")
	t.expectBackends(from("a1"), tgs, "b0")
	t.expectBackends(from("node-a"), tgs, "b0")
}

// dnsFlows opens a UDP flow to the Service's dns port from b1 to each ClusterIP and from
// the external client to each of node-a's NodePorts.
func (t *T) dnsFlows(svc *corev1.Service) []*udpFlow {
	var flows []*udpFlow
	for _, tg := range clusterIPs(t, svc, "dns") {
		flows = append(flows, t.dialUDP(from("b1"), tg))
	}
	for _, tg := range t.e.nodePorts(t, svc, "dns", "node-a") {
		flows = append(flows, t.dialUDP(from("external"), tg))
	}
	return flows
}

// A UDP client that started sending before the Service had endpoints (refused) gets
// through, from the same socket, once endpoints appear: the flow's conntrack entry, made
// without NAT, is cleaned up. Through a ClusterIP from a pod and a NodePort from outside,
// in each family.
func udpFlowRecoversWhenEndpointsAppear(t *T) {
	svc := t.service("udp-late", corev1.ServiceTypeNodePort, dnsPort)
	t.endpoints(svc)
	flows := t.dnsFlows(svc)
	for _, f := range flows {
		t.expectFlow(f, " while the Service has no endpoints", refused)
	}
	t.endpoints(svc, ready("a0"))
	for _, f := range flows {
		t.expectFlow(f, " once it has endpoints", answeredBy("a0"))
	}
}
