//go:build conformance

package conformance

// The environment every case runs in, built once per test binary:
//
//   - topology: nodes node-a (zone-a) and node-b (zone-b), pods a0 a1 on node-a and b0 b1 on
//     node-b, an external client with two addresses (172.18.0.100 and .101);
//   - a control plane (etcd + kube-apiserver) bound on the apiserver bridge, Service range
//     10.96.0.0/16 (plus fd00:10:96::/112 with -dualstack);
//   - Node objects created by the test (there is no kubelet) with InternalIP = the node's
//     underlay address and podCIDRs from the topology;
//   - an echo server in every pod on ports 8080 and 8081 (tcp, udp, and sctp where the
//     kernel has it);
//   - sluice in each node namespace, as system:kube-proxy, with minSyncPeriod 100ms.
//
// Cases create their own Services and write their own EndpointSlices (there is no
// endpointslice controller), each in a namespace of its own, so they can run in parallel.
// LoadBalancer IPs come from 192.0.2.0/24 and external IPs from 198.51.100.0/24, one per
// case; the external client routes each to the node the case chooses.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/topology"
)

const (
	// echoPort and echoPort2 are what every pod's echo server listens on.
	echoPort  = 8080
	echoPort2 = 8081
	// healthzPort is sluice's healthzBindAddress port inside each node.
	healthzPort = 10256
)

// convergeTimeout bounds every wait for sluice to program a change. sluice syncs within
// minSyncPeriod (100ms here) of a change; the margin covers a loaded 2-core CI machine.
var convergeTimeout = 30 * time.Second

// zoneOf is the zone label the suite gives each node.
var zoneOf = map[string]string{"node-a": "zone-a", "node-b": "zone-b"}

type env struct {
	backend string
	caps    capabilities
	topo    *topology.Cluster
	cp      *controlplane.ControlPlane
	kube    kubernetes.Interface
	// sctp reports whether the kernel has SCTP sockets (the IPVS VM's does, CI's does not).
	sctp     bool
	families []corev1.IPFamily
	sluice   map[string]*topology.Process

	vipSeq atomic.Int32
	nsSeq  atomic.Int32
}

// setup builds the whole environment for t, or fails it.
func setup(t *testing.T) *env {
	caps, ok := capabilityTable[backend()]
	if !ok {
		t.Fatalf("unknown backend %q (known: iptables, nftables, ipvs)", backend())
	}
	e := &env{backend: backend(), caps: caps, sluice: map[string]*topology.Process{}, families: []corev1.IPFamily{corev1.IPv4Protocol}}
	if *dualStack {
		e.families = append(e.families, corev1.IPv6Protocol)
	}
	t.Logf("backend %s, families %v", e.backend, e.families)

	e.topo = topology.New(t, topology.Options{Nodes: 2, PodsPerNode: 2, IPv6: *dualStack, ExternalAddresses: 2})
	if err := e.topo.Nodes[0].Do(func() error { e.sctp = echo.SCTPSupported(); return nil }); err != nil {
		t.Fatal(err)
	}

	cpOpts := controlplane.Options{
		BindAddress:         e.topo.APIAddress().String(),
		LogDir:              filepath.Join(e.topo.LogDir, "controlplane"),
		ReadyTimeout:        readyTimeout(t),
		ExtraAPIServerFlags: strings.Fields(os.Getenv("SLUICE_CONFORMANCE_APISERVER_FLAGS")),
	}
	if *dualStack {
		cpOpts.ServiceCIDRs = controlplane.DualStackServiceCIDRs()
	}
	e.cp = controlplane.StartForTest(t, cpOpts)
	e.kube = e.cp.AdminClient()

	for _, n := range e.topo.Nodes {
		e.registerNode(t, n)
	}
	e.topo.StartEcho(t, topology.EchoOptions{
		Binary:    os.Getenv("SLUICE_ECHOSERVER"),
		Ports:     []uint16{echoPort, echoPort2},
		Protocols: []echo.Protocol{echo.TCP, echo.UDP, echo.SCTP},
	})
	for _, n := range e.topo.Nodes {
		e.startSluice(t, n)
	}
	// Registered after the control plane's cleanup, so it runs first: sluice stops while
	// its apiserver is still there to say goodbye to.
	t.Cleanup(func() {
		for _, p := range e.sluice {
			p.Stop()
		}
	})
	for _, n := range e.topo.Nodes {
		e.waitHealthy(t, n)
	}
	return e
}

// readyTimeout is how long etcd and kube-apiserver may take to become ready, at the start
// and when APIServerOutageKeepsTrafficFlowing restarts the apiserver:
// $SLUICE_CONFORMANCE_READY_TIMEOUT (a Go duration), else the control plane's default
// (90s). The IPVS VM sets it: under emulation (TCG) kube-apiserver takes minutes.
func readyTimeout(t *testing.T) time.Duration {
	s := os.Getenv("SLUICE_CONFORMANCE_READY_TIMEOUT")
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("$SLUICE_CONFORMANCE_READY_TIMEOUT=%q: want a positive duration such as 5m", s)
	}
	return d
}

func (e *env) registerNode(t *testing.T, n *topology.Node) {
	ctx := t.Context()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
			"kubernetes.io/hostname":      n.Name,
			"topology.kubernetes.io/zone": zoneOf[n.Name],
		}},
	}
	for i, c := range n.PodCIDRs {
		if i < len(e.families) {
			node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
		}
	}
	node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	created, err := e.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", n.Name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}
	if *dualStack {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IPv6.String()})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "ConformanceSuite",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("patching Node %s status: %v", n.Name, err)
	}
}

// sluiceConfig is the KubeProxyConfiguration each node's sluice runs with. minSyncPeriod is
// small so that the suite measures behaviour, not the default 1s rate limit; conntrack
// sizing is left alone (0) because nf_conntrack_max and the hash size are global to the
// machine, not per namespace.
func (e *env) sluiceConfig(n *topology.Node) string {
	clusterCIDR := topology.ClusterCIDRv4
	if *dualStack {
		clusterCIDR += "," + topology.ClusterCIDRv6
	}
	verbosity := 2
	if v := os.Getenv("SLUICE_V"); v != "" {
		_, _ = fmt.Sscan(v, &verbosity)
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clusterCIDR: %s
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
logging:
  verbosity: %d
iptables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
nftables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
ipvs:
  minSyncPeriod: 100ms
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, e.backend, n.Name, clusterCIDR, healthzPort, e.cp.ProxyKubeconfig(), verbosity)
}

func (e *env) startSluice(t *testing.T, n *topology.Node) {
	path := filepath.Join(e.topo.LogDir, "sluice-"+n.Name+".yaml")
	if err := os.WriteFile(path, []byte(e.sluiceConfig(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", path, "--hostname-override", n.Name, "--kubeconfig", e.cp.ProxyKubeconfig()}
	args = append(args, strings.Fields(os.Getenv("SLUICE_EXTRA_ARGS"))...)
	p, err := n.Start("sluice-"+n.Name, os.Getenv("SLUICE_BIN"), args...)
	if err != nil {
		t.Fatal(err)
	}
	e.sluice[n.Name] = p
}

// waitHealthy waits for sluice's /healthz in the node to answer 200, reached over the
// apiserver link, and then for its first sync (waitSynced). A sluice that exits fails the
// suite at once with its log.
func (e *env) waitHealthy(t *testing.T, n *topology.Node) {
	url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.APIAddress, healthzPort))
	client := &http.Client{Timeout: time.Second}
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		e.requireRunning(t)
		resp, err := client.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				e.waitSynced(t, n)
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("sluice on %s: %s never answered 200 (last: %s)\n%s", n.Name, url, last, e.sluice[n.Name].Tail(40))
}

// firstSyncTimeout bounds the wait for a sluice's first sync. On the host it takes a
// second; under emulation (the IPVS VM) each iptables command costs most of a second and
// a first sync of both families half a minute.
const firstSyncTimeout = 3 * time.Minute

// lastSyncMetric is the gauge sluice (and kube-proxy) set after every successful sync, per
// IP family.
const lastSyncMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// waitSynced waits until the proxy in node n has completed its first sync of every family
// the suite uses, as its metrics tell (metricsBindAddress 127.0.0.1:10249 in the node).
// /healthz answers 200 from the start, before anything is programmed; a case that starts
// before the first sync would measure how long that sync takes, not the behaviour it is
// about.
func (e *env) waitSynced(t *testing.T, n *topology.Node) {
	url := "http://127.0.0.1:10249/metrics"
	var last string
	deadline := time.Now().Add(firstSyncTimeout)
	for time.Now().Before(deadline) {
		e.requireRunning(t)
		body, err := httpGetBody(&n.Host, url)
		if err == nil {
			synced := syncedFamilies(body)
			missing := ""
			for _, f := range e.families {
				if !synced[string(f)] && !synced[""] {
					missing += " " + string(f)
				}
			}
			if missing == "" {
				return
			}
			last = "no successful sync yet for" + missing
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("sluice on %s: no first sync within %s (%s: %s)\n%s", n.Name, firstSyncTimeout, url, last, e.sluice[n.Name].Tail(40))
}

// syncedFamilies reads the last-sync gauge from a Prometheus text exposition: the families
// (ip_family label values; "" for a sample without one) that have synced at least once.
func syncedFamilies(metrics string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, lastSyncMetric)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		family := ""
		if i := strings.Index(rest, `ip_family="`); i >= 0 {
			family, _, _ = strings.Cut(rest[i+len(`ip_family="`):], `"`)
		}
		fields := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil && v > 0 {
			out[family] = true
		}
	}
	return out
}

// requireRunning fails t if a sluice process has exited.
func (e *env) requireRunning(t testing.TB) {
	t.Helper()
	for name, p := range e.sluice {
		if exited, err := p.Exited(); exited {
			t.Fatalf("sluice on %s exited: %v\n%s", name, err, p.Tail(40))
		}
	}
}

// dumpOnFailure logs the end of every sluice log when t fails.
func (e *env) dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for name, p := range e.sluice {
			t.Logf("last lines of sluice on %s (%s):\n%s", name, p.LogPath, p.Tail(25))
		}
	})
}

// ---- Kubernetes objects ------------------------------------------------------------------

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// namespace creates a namespace for one case, deleted when the case ends.
func (e *env) namespace(t *testing.T) string {
	name := nonName.ReplaceAllString(strings.ToLower(t.Name()), "-")
	name = strings.Trim(strings.TrimPrefix(name, "testconformance-"), "-")
	if len(name) > 50 {
		name = name[:50]
	}
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), e.nsSeq.Add(1))
	_, err := e.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Without a namespace controller the namespace itself lingers as Terminating;
		// deleting the Services makes sluice drop their rules, which is what matters.
		ctx := context.Background()
		_ = e.kube.DiscoveryV1().EndpointSlices(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		svcs, _ := e.kube.CoreV1().Services(name).List(ctx, metav1.ListOptions{})
		if svcs != nil {
			for _, s := range svcs.Items {
				_ = e.kube.CoreV1().Services(name).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = e.kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// port is a Service port whose targetPort is the echo server's port.
func port(name string, proto corev1.Protocol, p int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: p, TargetPort: intstr.FromInt32(echoPort)}
}

// service returns a Service of the given type in ns; cases adjust it before createService.
func service(ns, name string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: typ, Ports: ports},
	}
}

// createService creates svc (dual-stack when the suite is) and returns it as allocated.
func (e *env) createService(t *testing.T, svc *corev1.Service) *corev1.Service {
	if len(e.families) == 2 {
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	created, err := e.kube.CoreV1().Services(svc.Namespace).Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return created
}

// updateService applies change to the current Service and writes it back.
func (e *env) updateService(t *testing.T, svc *corev1.Service, change func(*corev1.Service)) *corev1.Service {
	cur, err := e.kube.CoreV1().Services(svc.Namespace).Get(t.Context(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(cur)
	updated, err := e.kube.CoreV1().Services(svc.Namespace).Update(t.Context(), cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return updated
}

// setLoadBalancerIngress writes status.loadBalancer.ingress, as a cloud controller would.
func (e *env) setLoadBalancerIngress(t *testing.T, svc *corev1.Service, ips ...netip.Addr) *corev1.Service {
	cur, err := e.kube.CoreV1().Services(svc.Namespace).Get(t.Context(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	updated, err := e.kube.CoreV1().Services(svc.Namespace).UpdateStatus(t.Context(), cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("setting load balancer status of %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return updated
}

// vip returns an address unique to this run for a LoadBalancer (192.0.2.x) or external IP
// (198.51.100.x), routed by the external client to via.
func (e *env) vip(t *testing.T, base string, via *topology.Node) netip.Addr {
	n := e.vipSeq.Add(1)
	if n > 250 {
		t.Fatal("out of virtual IPs")
	}
	a := netip.MustParseAddr(fmt.Sprintf("%s.%d", base, n))
	e.routeVIP(t, a, via)
	return a
}

// routeVIP points the external client's route for a at node via.
func (e *env) routeVIP(t *testing.T, a netip.Addr, via *topology.Node) {
	if err := e.topo.External.Route(netip.PrefixFrom(a, a.BitLen()), via.IP(a)); err != nil {
		t.Fatal(err)
	}
}

// endpoint is one EndpointSlice endpoint: a pod and its conditions.
type endpoint struct {
	pod                         *topology.Pod
	ready, serving, terminating bool
	zoneHint                    string
}

// ready is a ready, serving, not terminating endpoint.
func ready(p *topology.Pod) endpoint { return endpoint{pod: p, ready: true, serving: true} }

// terminating is a terminating endpoint, serving or not (ready is always false then).
func terminating(p *topology.Pod, serving bool) endpoint {
	return endpoint{pod: p, serving: serving, terminating: true}
}

// hinted adds a zone hint.
func (ep endpoint) hinted(zone string) endpoint { ep.zoneHint = zone; return ep }

// setEndpoints writes the Service's EndpointSlices (one per family) so that they hold
// exactly eps, creating or replacing them.
func (e *env) setEndpoints(t *testing.T, svc *corev1.Service, eps ...endpoint) {
	e.setSlice(t, svc, "", eps...)
}

// setSlice writes one EndpointSlice per family of the Service, named
// <service>-<family>[-<suffix>], holding exactly eps. Several suffixes give a Service
// several slices, as the endpointslice controller does past 100 endpoints.
func (e *env) setSlice(t *testing.T, svc *corev1.Service, suffix string, eps ...endpoint) {
	ctx := t.Context()
	for _, fam := range svc.Spec.IPFamilies {
		name := svc.Name + "-" + strings.ToLower(string(fam))
		if suffix != "" {
			name += "-" + suffix
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: svc.Namespace,
				Name:      name,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name,
					discoveryv1.LabelManagedBy:   "conformance.sluice.test",
				},
			},
			AddressType: discoveryv1.AddressType(fam),
			Endpoints:   []discoveryv1.Endpoint{},
		}
		for _, sp := range svc.Spec.Ports {
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{
				Name: ptr.To(sp.Name), Protocol: ptr.To(sp.Protocol), Port: ptr.To(sp.TargetPort.IntVal),
			})
		}
		for _, ep := range eps {
			addr := ep.pod.IPv4
			if fam == corev1.IPv6Protocol {
				addr = ep.pod.IPv6
			}
			d := discoveryv1.Endpoint{
				Addresses: []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{
					Ready: ptr.To(ep.ready), Serving: ptr.To(ep.serving), Terminating: ptr.To(ep.terminating),
				},
				NodeName: ptr.To(ep.pod.Node.Name),
				Zone:     ptr.To(zoneOf[ep.pod.Node.Name]),
			}
			if ep.zoneHint != "" {
				d.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: ep.zoneHint}}}
			}
			slice.Endpoints = append(slice.Endpoints, d)
		}
		slices := e.kube.DiscoveryV1().EndpointSlices(svc.Namespace)
		cur, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = slices.Create(ctx, slice, metav1.CreateOptions{})
		case err == nil:
			slice.ResourceVersion = cur.ResourceVersion
			_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("writing EndpointSlice %s/%s: %v", slice.Namespace, slice.Name, err)
		}
	}
}

// ---- addresses ---------------------------------------------------------------------------

// clusterIP is the Service's ClusterIP of a family.
func clusterIP(t *testing.T, svc *corev1.Service, fam corev1.IPFamily) netip.Addr {
	for _, s := range svc.Spec.ClusterIPs {
		a := netip.MustParseAddr(s)
		if a.Is4() == (fam == corev1.IPv4Protocol) {
			return a
		}
	}
	t.Fatalf("Service %s/%s has no %s ClusterIP (%v)", svc.Namespace, svc.Name, fam, svc.Spec.ClusterIPs)
	return netip.Addr{}
}

// svcPort finds a Service port by name.
func svcPort(t *testing.T, svc *corev1.Service, name string) corev1.ServicePort {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("Service %s/%s has no port %q", svc.Namespace, svc.Name, name)
	return corev1.ServicePort{}
}

func at(a netip.Addr, p int32) netip.AddrPort { return netip.AddrPortFrom(a, uint16(p)) }

func protoOf(p corev1.Protocol) echo.Protocol { return echo.Protocol(strings.ToLower(string(p))) }

// familyAddr picks the address of fam from a host.
func familyAddr(h *topology.Host, fam corev1.IPFamily) netip.Addr {
	if fam == corev1.IPv6Protocol {
		return h.IPv6
	}
	return h.IPv4
}

// ---- probing and waiting -----------------------------------------------------------------

// client is where probes come from: a host, optionally with a chosen source address.
type client struct {
	host   *topology.Host
	source netip.Addr
}

func from(h *topology.Host) client { return client{host: h} }

func (c client) String() string {
	if c.source.IsValid() {
		return fmt.Sprintf("%s (from %s)", c.host.Name, c.source)
	}
	return c.host.Name
}

func (c client) probe(proto echo.Protocol, target netip.AddrPort, timeout time.Duration) echo.Outcome {
	return c.host.Probe(proto, target, echo.ProbeOptions{Timeout: timeout, Source: c.source})
}

// eventually polls cond until it returns nil, failing t with cond's last error after
// convergeTimeout. It never sleeps a fixed time waiting for sluice: it stops as soon as
// what clients receive is right.
func (e *env) eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(convergeTimeout)
	for {
		e.requireRunning(t)
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not so after %s: %v", what, convergeTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tries is how many probes show that every one of n backends answers: with random
// selection the chance of missing one of n in 10n+10 tries is below 1e-4 for n <= 4, and
// a miss only costs another round.
func tries(n int) int { return 10*n + 10 }

// expectBackends waits until probes from c to target are all answered, by exactly the pods
// named in want, and returns the replies of the last round.
func (e *env) expectBackends(t *testing.T, c client, proto echo.Protocol, target netip.AddrPort, want ...string) []echo.Reply {
	t.Helper()
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w] = true
	}
	var replies []echo.Reply
	e.eventually(t, fmt.Sprintf("%s -> %s %s answered by exactly %v", c, proto, target, want), func() error {
		replies = replies[:0]
		seen := map[string]int{}
		for i := range tries(len(want)) {
			out := c.probe(proto, target, 0)
			if out.Result != echo.Answered {
				return fmt.Errorf("try %d: %s", i, out)
			}
			if !wanted[out.Reply.Pod] {
				return fmt.Errorf("try %d: answered by %s, not one of %v", i, out.Reply.Pod, want)
			}
			seen[out.Reply.Pod]++
			replies = append(replies, out.Reply)
		}
		if len(seen) != len(wanted) {
			return fmt.Errorf("answered by %v only", seen)
		}
		return nil
	})
	return replies
}

// expectResult waits until three probes in a row from c to target end in one of want
// (several when a capability allows more than one, see capabilities).
func (e *env) expectResult(t *testing.T, c client, proto echo.Protocol, target netip.AddrPort, want ...echo.Result) {
	t.Helper()
	e.eventually(t, fmt.Sprintf("%s -> %s %s gets %v", c, proto, target, want), func() error {
		for i := range 3 {
			// A second is plenty to tell silence from an answer or a refusal here.
			out := c.probe(proto, target, time.Second)
			if !resultIn(out.Result, want) {
				return fmt.Errorf("try %d: %s", i, out)
			}
		}
		return nil
	})
}

func resultIn(r echo.Result, set []echo.Result) bool {
	for _, s := range set {
		if r == s {
			return true
		}
	}
	return false
}

// expectSources checks that every reply saw a source address in want.
func expectSources(t *testing.T, what string, replies []echo.Reply, want ...netip.Addr) {
	t.Helper()
	for _, r := range replies {
		ok := false
		for _, w := range want {
			ok = ok || r.Remote.Addr() == w
		}
		if !ok {
			t.Errorf("%s: %s saw the client as %s, want one of %v", what, r.Pod, r.Remote.Addr(), want)
			return
		}
	}
}

// nodeAddrs are every address a node may masquerade to.
func nodeAddrs(n *topology.Node) []netip.Addr {
	out := append([]netip.Addr{}, n.IPs()...)
	out = append(out, n.BridgeIPs...)
	return append(out, n.APIAddress)
}

// httpGetBody fetches url from inside host's namespace and returns the body of a 200 answer.
func httpGetBody(h *topology.Host, url string) (string, error) {
	client := &http.Client{Transport: hostTransport(h), Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

// hostTransport dials from inside host's namespace.
func hostTransport(h *topology.Host) *http.Transport {
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := h.Do(func() (err error) {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}
}

// httpGet fetches url from inside host's namespace and returns the status code.
func httpGet(h *topology.Host, url string) (int, error) {
	client := &http.Client{Transport: hostTransport(h), Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// trafficWatch probes from a client in the background, to prove that traffic never stops
// while something is disrupted (a proxy restart, an apiserver outage).
type trafficWatch struct {
	stop     chan struct{}
	done     chan struct{}
	probes   int
	failures []string
}

// watchTraffic starts probing target from c every 50ms until the returned watch is
// stopped. Every probe must be answered by one of the pods in want.
func watchTraffic(c client, proto echo.Protocol, target netip.AddrPort, want ...string) *trafficWatch {
	w := &trafficWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			out := c.probe(proto, target, 0)
			w.probes++
			ok := out.Result == echo.Answered
			if ok {
				ok = false
				for _, p := range want {
					ok = ok || out.Reply.Pod == p
				}
			}
			if !ok {
				w.failures = append(w.failures, time.Now().Format("15:04:05.000")+" "+out.String())
			}
		}
	}()
	return w
}

// finish stops the watch and fails t if any probe failed.
func (w *trafficWatch) finish(t *testing.T, what string) {
	t.Helper()
	close(w.stop)
	<-w.done
	if len(w.failures) > 0 {
		t.Errorf("%s: %d of %d probes failed, first ones: %v", what, len(w.failures), w.probes, w.failures[:min(5, len(w.failures))])
	} else {
		t.Logf("%s: all %d probes answered", what, w.probes)
	}
}
