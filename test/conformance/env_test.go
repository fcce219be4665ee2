//go:build conformance

package conformance

// The environment every case runs in, built once per test binary:
//
//   - one control plane (etcd + kube-apiserver) on the apiserver bridge, dual-stack: Service
//     ranges 10.96.0.0/16 and fd00:10:96::/112;
//   - one cluster per proxy under test (-proxies, e.g. sluice/iptables and
//     kube-proxy/iptables): a topology of its own (nodes node-a in zone-a and node-b in
//     zone-b, pods a0 a1 and b0 b1, an external client with two addresses per family and
//     one in the secondary underlay subnet), every topology on the same addresses and on
//     the same apiserver bridge, and the proxy in each node;
//   - Node objects created by the test (there is no kubelet), shared by every cluster: their
//     nodes have the same names and addresses;
//   - an echo server in every pod on ports 8080 and 8081 (tcp, udp, and sctp where the
//     kernel has it).
//
// Cases create their own Services and write their own EndpointSlices (there is no
// endpointslice controller), each in a namespace of its own, so they can run in parallel.
// Every proxy programs every Service, and every check probes every cluster: the same
// objects, the same addresses, different proxies. LoadBalancer IPs come from 192.0.2.0/24
// and 2001:db8:0:2::/64, external IPs from 198.51.100.0/24 and 2001:db8:198:51::/64, one
// per case; each cluster's external client routes them to the node the case chooses.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
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

	"github.com/sluiceproxy/sluice/test/conformance/results"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/topology"
)

const (
	// echoPort and echoPort2 are what every pod's echo server listens on.
	echoPort  = 8080
	echoPort2 = 8081
	// healthzPort is the proxy's healthzBindAddress port inside each node.
	healthzPort = 10256
)

// convergeTimeout bounds every wait for a proxy to program a change. It syncs within
// minSyncPeriod (1s here) of a change; the margin covers a loaded 2-core CI machine.
// $SLUICE_CONFORMANCE_CONVERGE_TIMEOUT (a Go duration) overrides it: under emulation (the
// IPVS VM) a sync of upstream's ipvs mode, which rewrites everything, takes many seconds.
var convergeTimeout = durationFromEnv("SLUICE_CONFORMANCE_CONVERGE_TIMEOUT", 30*time.Second)

// durationFromEnv reads a Go duration from the environment variable, or returns def. A
// value that is not a positive duration panics: the suite must not run with a knob it
// misread.
func durationFromEnv(name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		panic(fmt.Sprintf("$%s=%q: want a positive duration such as 90s", name, s))
	}
	return d
}

// zoneOf is the zone label the suite gives each node.
var zoneOf = map[string]string{"node-a": "zone-a", "node-b": "zone-b"}

// nodePortAddresses are the proxies' nodePortAddresses: the primary underlay subnets (not
// the secondary one, nor the pod bridges or the apiserver link) and loopback, which keeps
// localhost NodePorts where the mode has them (iptables turns them off unless
// nodePortAddresses includes 127.0.0.0/8).
var nodePortAddresses = []string{"172.18.0.0/24", "fd00:172:18::/64", "127.0.0.0/8"}

// env is the whole environment: the control plane and one cluster per proxy under test.
type env struct {
	clusters []*cluster
	cp       *controlplane.ControlPlane
	kube     kubernetes.Interface
	// sctp reports whether the kernel has SCTP sockets (the IPVS VM's does, CI's does not).
	sctp bool
	// table and diffs are the capability table and the declared differences from upstream.
	table results.Table
	diffs []results.Difference

	vipSeq atomic.Int32
	nsSeq  atomic.Int32
}

// cluster is one proxy under test (a binary in a mode) in its own topology.
type cluster struct {
	name    string // "sluice/iptables"
	proxy   string // results.Sluice or results.Upstream
	backend string
	binary  string
	topo    *topology.Cluster

	// only names the cases the cluster runs, when -proxies restricts it (nil: every
	// case). A restricted cluster runs its cases first and then stops its proxies.
	only []string

	mu    sync.Mutex
	procs map[string]*topology.Process // the proxy in each node, by node name
	run   results.Run
}

// runs reports whether the cluster takes part in the named case.
func (cl *cluster) runs(caseName string) bool {
	if ps, ok := caseProxies[caseName]; ok && !slices.Contains(ps, cl.name) {
		return false
	}
	return cl.only == nil || slices.Contains(cl.only, caseName)
}

// caseProxies are the clusters each case restricted to some runs in (conformanceCase.proxies),
// by case name; filled from cases by init, which the cases' functions cannot refer to.
var caseProxies map[string][]string

func init() {
	caseProxies = map[string][]string{}
	for _, c := range cases {
		if c.proxies != nil {
			caseProxies[c.name] = c.proxies
		}
	}
}

// setup builds the whole environment for t, or fails it.
func setup(t *testing.T) *env {
	started := time.Now()
	e := &env{}
	var err error
	if e.table, err = results.ParseTable(capabilitiesJSON); err != nil {
		t.Fatal(err)
	}
	if e.diffs, err = results.ParseDifferences(differencesYAML); err != nil {
		t.Fatal(err)
	}
	specs, err := proxiesUnderTest()
	if err != nil {
		t.Fatal(err)
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	for i, s := range specs {
		cl := &cluster{name: s.proxy + "/" + s.backend, proxy: s.proxy, backend: s.backend, binary: s.binary, only: s.only, procs: map[string]*topology.Process{}}
		cl.run = results.Run{Proxy: s.proxy, Backend: s.backend, Kernel: strings.TrimSpace(string(kernel)), Complete: runFilter() == "" && s.only == nil}
		if v, err := exec.Command(s.binary, "--version").CombinedOutput(); err == nil {
			cl.run.Version = strings.TrimSpace(string(v))
		}
		opts := topology.Options{Nodes: 2, PodsPerNode: 2, IPv6: true, ExternalAddresses: 2, SecondaryUnderlay: true}
		if i > 0 {
			opts.APIOf = e.clusters[0].topo
		}
		cl.topo = topology.New(t, opts)
		e.clusters = append(e.clusters, cl)
		t.Logf("cluster %s: %s (%s), topology %s", cl.name, cl.binary, cl.run.Version, cl.topo.ID)
	}
	first := e.clusters[0].topo
	if err := first.Nodes[0].Do(func() error { e.sctp = echo.SCTPSupported(); return nil }); err != nil {
		t.Fatal(err)
	}

	e.cp = controlplane.StartForTest(t, controlplane.Options{
		BindAddress:         first.APIAddress().String(),
		ServiceCIDRs:        controlplane.DualStackServiceCIDRs(),
		LogDir:              filepath.Join(first.LogDir, "controlplane"),
		ReadyTimeout:        readyTimeout(),
		ExtraAPIServerFlags: strings.Fields(os.Getenv("SLUICE_CONFORMANCE_APISERVER_FLAGS")),
	})
	e.kube = e.cp.AdminClient()
	for _, n := range first.Nodes {
		e.registerNode(t, n)
	}
	for _, cl := range e.clusters {
		cl.topo.StartEcho(t, topology.EchoOptions{
			Binary:    os.Getenv("SLUICE_ECHOSERVER"),
			Ports:     []uint16{echoPort, echoPort2},
			Protocols: []echo.Protocol{echo.TCP, echo.UDP, echo.SCTP},
			// 0 on the host (the default applies); the VM's readiness limit there.
			ReadyTimeout: readyTimeout(),
		})
		for _, n := range cl.topo.Nodes {
			if err := e.startProxy(cl, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Registered after the control plane's cleanup, so it runs first: the proxies stop
	// while their apiserver is still there to say goodbye to. The results are written last
	// of all (this cleanup runs after the subtests').
	t.Cleanup(func() {
		for _, cl := range e.clusters {
			for _, p := range cl.processes() {
				p.Stop()
			}
		}
		e.saveResults(t, time.Since(started))
	})
	for _, cl := range e.clusters {
		for _, n := range cl.topo.Nodes {
			if err := e.waitHealthy(cl, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

// proxySpec is one entry of -proxies.
type proxySpec struct {
	proxy, backend, binary string
	only                   []string // the cases the cluster is restricted to; nil: every case
}

// proxiesUnderTest reads -proxies ("sluice/iptables,kube-proxy/iptables"; default
// "sluice/<backend>"), with the binaries from $SLUICE_BIN and $KUBE_PROXY_BIN. An entry
// may restrict its cluster to some cases: "sluice/iptables:SCTPClusterIPAndNodePort" (cases
// joined by "+").
func proxiesUnderTest() ([]proxySpec, error) {
	list := *proxiesFlag
	if list == "" {
		list = results.Sluice + "/" + backend()
	}
	var specs []proxySpec
	for _, item := range strings.Split(list, ",") {
		item, restrict, restricted := strings.Cut(strings.TrimSpace(item), ":")
		proxy, mode, ok := strings.Cut(item, "/")
		if !ok {
			return nil, fmt.Errorf("-proxies: %q is not <proxy>/<mode>[:<case>+...]", item)
		}
		var only []string
		if restricted {
			for _, name := range strings.Split(restrict, "+") {
				if !slices.ContainsFunc(cases, func(c conformanceCase) bool { return c.name == name }) {
					return nil, fmt.Errorf("-proxies: %s: %q is not a case a cluster can be restricted to (the disruptive cases need every cluster)", item, name)
				}
				only = append(only, name)
			}
		}
		switch mode {
		case "iptables", "nftables", "ipvs":
		default:
			return nil, fmt.Errorf("-proxies: unknown mode %q (known: iptables, nftables, ipvs)", mode)
		}
		var bin string
		switch proxy {
		case results.Sluice:
			bin = os.Getenv("SLUICE_BIN")
		case results.Upstream:
			bin = os.Getenv("KUBE_PROXY_BIN")
		default:
			return nil, fmt.Errorf("-proxies: unknown proxy %q (known: %s, %s)", proxy, results.Sluice, results.Upstream)
		}
		if bin == "" {
			return nil, fmt.Errorf("-proxies: no binary for %s (TestMain prepares $SLUICE_BIN and $KUBE_PROXY_BIN)", proxy)
		}
		specs = append(specs, proxySpec{proxy: proxy, backend: mode, binary: bin, only: only})
	}
	return specs, nil
}

// runFilter is the -test.run pattern, empty when every case runs.
func runFilter() string {
	if f := flag.Lookup("test.run"); f != nil {
		return f.Value.String()
	}
	return ""
}

// saveResults writes each cluster's results to -results (or $SLUICE_CONFORMANCE_RESULTS),
// and logs the summary.
func (e *env) saveResults(t *testing.T, took time.Duration) {
	dir := *resultsFlag
	var runs []*results.Run
	for _, cl := range e.clusters {
		cl.mu.Lock()
		cl.run.Seconds = took.Seconds()
		run := cl.run
		cl.mu.Unlock()
		runs = append(runs, &run)
		if dir == "" {
			continue
		}
		if err := run.Save(dir); err != nil {
			t.Errorf("saving the results of %s: %v", cl.name, err)
		}
	}
	where := dir
	if where == "" {
		where = "not saved: no -results"
	}
	t.Logf("results (%s):\n%s", where, results.Summary(runs))
}

// readyTimeout is how long etcd and kube-apiserver may take to become ready, at the start
// and when a case restarts the apiserver: $SLUICE_CONFORMANCE_READY_TIMEOUT (a Go
// duration), else the control plane's default (90s). The IPVS VM sets it: under emulation
// (TCG) kube-apiserver takes minutes.
func readyTimeout() time.Duration { return durationFromEnv("SLUICE_CONFORMANCE_READY_TIMEOUT", 0) }

func (e *env) registerNode(t *testing.T, n *topology.Node) {
	ctx := t.Context()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
			"kubernetes.io/hostname":      n.Name,
			"topology.kubernetes.io/zone": zoneOf[n.Name],
		}},
	}
	for _, c := range n.PodCIDRs {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
	}
	node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	created, err := e.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", n.Name, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.IPv4.String()},
		{Type: corev1.NodeInternalIP, Address: n.IPv6.String()},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	created.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "ConformanceSuite",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if _, err := e.kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("patching Node %s status: %v", n.Name, err)
	}
}

// proxyConfig is the KubeProxyConfiguration each node's proxy runs with. minSyncPeriod is
// upstream's default, 1s: every proxy programs every cluster's Services, and with dozens of
// cases changing Services at once, a shorter one makes eight proxies rewrite their rules
// (iptables-restore is a process per family) many times a second, starving the probes of
// CPU on a 2-core machine; a change waits at most a second. Conntrack sizing is left alone
// (0) because nf_conntrack_max and the hash size are global to the machine, not per
// namespace. The client-go reflector logs at level 4, so that a watch
// that ended with "too old resource version" (and the relist after it) shows in the log.
func (e *env) proxyConfig(cl *cluster, n *topology.Node) string {
	verbosity := 2
	if v := os.Getenv("SLUICE_V"); v != "" {
		_, _ = fmt.Sscan(v, &verbosity)
	}
	var npa strings.Builder
	for _, c := range nodePortAddresses {
		fmt.Fprintf(&npa, "\n- %s", c)
	}
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clusterCIDR: %s,%s
nodePortAddresses:%s
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
logging:
  verbosity: %d
  vmodule:
  - filePattern: reflector
    verbosity: 4
iptables:
  minSyncPeriod: 1s
  syncPeriod: 30s
nftables:
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  minSyncPeriod: 1s
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, cl.backend, n.Name, topology.ClusterCIDRv4, topology.ClusterCIDRv6, npa.String(), healthzPort, e.cp.ProxyKubeconfig(), verbosity)
}

// startProxy starts the cluster's proxy in node n (again, after a stop).
func (e *env) startProxy(cl *cluster, n *topology.Node) error {
	path := filepath.Join(cl.topo.LogDir, "proxy-"+n.Name+".yaml")
	if err := os.WriteFile(path, []byte(e.proxyConfig(cl, n)), 0o644); err != nil {
		return err
	}
	args := []string{"--config", path, "--hostname-override", n.Name, "--kubeconfig", e.cp.ProxyKubeconfig()}
	args = append(args, strings.Fields(os.Getenv("SLUICE_EXTRA_ARGS"))...)
	p, err := n.Start(cl.proxy+"-"+n.Name, cl.binary, args...)
	if err != nil {
		return err
	}
	cl.mu.Lock()
	cl.procs[n.Name] = p
	cl.mu.Unlock()
	return nil
}

// proc is the cluster's proxy in the named node.
func (cl *cluster) proc(node string) *topology.Process {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.procs[node]
}

func (cl *cluster) processes() []*topology.Process {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []*topology.Process
	for _, p := range cl.procs {
		out = append(out, p)
	}
	return out
}

// waitHealthy waits for the proxy's /healthz in node n to answer 200, reached over the
// apiserver link, and then for its first sync (waitSynced). A proxy that exits fails the
// suite at once with its log.
func (e *env) waitHealthy(cl *cluster, n *topology.Node) error {
	url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.APIAddress, healthzPort))
	client := &http.Client{Timeout: time.Second}
	var last string
	deadline := time.Now().Add(healthzTimeout())
	for time.Now().Before(deadline) {
		if err := cl.running(); err != nil {
			return err
		}
		resp, err := client.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e.waitSynced(cl, n)
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s on %s: %s never answered 200 (last: %s)\n%s", cl.name, n.Name, url, last, cl.proc(n.Name).Tail(40))
}

// healthzTimeout bounds the wait for a started proxy's /healthz. On the host a proxy
// answers within seconds; in the IPVS VM, with a dozen proxies and the control plane
// sharing two emulated CPUs, a restarted kube-proxy once printed nothing for a minute, so
// there the wait is the control plane's readiness limit.
func healthzTimeout() time.Duration {
	return max(time.Minute, readyTimeout())
}

// firstSyncTimeout bounds the wait for a proxy's first sync. On the host it takes a
// second; under emulation (the IPVS VM) each iptables command costs most of a second, and
// a first sync of both families half a minute, or minutes on a busy host: there it is
// twice the control plane's readiness limit.
func firstSyncTimeout() time.Duration {
	return max(3*time.Minute, 2*readyTimeout())
}

// metricsURL is the proxies' metrics page (metricsBindAddress), inside each node.
const metricsURL = "http://127.0.0.1:10249/metrics"

// lastSyncMetric is the gauge sluice (and kube-proxy) set after every successful sync, per
// IP family.
const lastSyncMetric = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"

// waitSynced waits until the proxy in node n has completed its first sync of both
// families, as its metrics tell (metricsBindAddress 127.0.0.1:10249 in the node).
// /healthz answers 200 from the start, before anything is programmed; a case that starts
// before the first sync would measure how long that sync takes, not the behaviour it is
// about.
func (e *env) waitSynced(cl *cluster, n *topology.Node) error {
	url := metricsURL
	var last string
	deadline := time.Now().Add(firstSyncTimeout())
	for time.Now().Before(deadline) {
		if err := cl.running(); err != nil {
			return err
		}
		body, err := httpGetBody(&n.Host, url)
		if err == nil {
			synced := syncedFamilies(body)
			missing := ""
			for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
				if !synced[string(f)] && !synced[""] {
					missing += " " + string(f)
				}
			}
			if missing == "" {
				return nil
			}
			last = "no successful sync yet for" + missing
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s on %s: no first sync within %s (%s: %s)\n%s", cl.name, n.Name, firstSyncTimeout(), url, last, cl.proc(n.Name).Tail(40))
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

// running returns an error, with the end of its log, if a proxy of the cluster has exited.
func (cl *cluster) running() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for node, p := range cl.procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s on %s exited: %w\n%s", cl.name, node, err, p.Tail(40))
		}
	}
	return nil
}

// ---- Kubernetes objects ------------------------------------------------------------------

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// namespace creates a namespace for one case, deleted when the case ends.
func (e *env) namespace(t testing.TB) string {
	name := nonName.ReplaceAllString(strings.ToLower(t.Name()), "-")
	name = strings.Trim(strings.TrimPrefix(name, "testconformance-"), "-")
	if len(name) > 50 {
		name = name[:50]
	}
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), e.nsSeq.Add(1))
	namespaces := e.kube.CoreV1().Namespaces()
	_, err := createOrFind(
		func() (*corev1.Namespace, error) {
			return namespaces.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		},
		func() (*corev1.Namespace, error) { return namespaces.Get(t.Context(), name, metav1.GetOptions{}) })
	if err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Without a namespace controller the namespace itself lingers as Terminating;
		// deleting the Services makes the proxies drop their rules, which is what matters.
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

// createService creates svc in the families of f (single-stack IPv4 or IPv6, or
// RequireDualStack) and returns it as allocated.
func (e *env) createService(t testing.TB, f family, svc *corev1.Service) *corev1.Service {
	svc.Spec.IPFamilies = f.families
	svc.Spec.IPFamilyPolicy = ptr.To(f.policy)
	services := e.kube.CoreV1().Services(svc.Namespace)
	created, err := createOrFind(
		func() (*corev1.Service, error) { return services.Create(t.Context(), svc, metav1.CreateOptions{}) },
		func() (*corev1.Service, error) { return services.Get(t.Context(), svc.Name, metav1.GetOptions{}) })
	if err != nil {
		t.Fatalf("creating Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return created
}

// createAttempts bounds the creates of one object that kube-apiserver times out. Under
// emulation (the IPVS VM, no KVM) a busy apiserver now and then answers a create with
// "Timeout: request did not complete within requested timeout" (the 2026-12-02 CI run:
// one of ~500 Services), and the write may or may not have happened.
const createAttempts = 3

// createOrFind calls create; when kube-apiserver timed the request out, it looks the
// object up with get (the write may have happened) before creating it again. Any other
// error, and AlreadyExists on the first attempt (a real name clash), is returned as is.
func createOrFind[T any](create, get func() (T, error)) (T, error) {
	var zero T
	var err error
	for attempt := range createAttempts {
		var obj T
		obj, err = create()
		switch {
		case err == nil:
			return obj, nil
		case attempt > 0 && apierrors.IsAlreadyExists(err):
			return get() // the timed-out attempt's write landed after the lookup
		case !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err):
			return zero, err
		}
		if obj, getErr := get(); getErr == nil {
			return obj, nil
		}
	}
	return zero, fmt.Errorf("%d attempts timed out: %w", createAttempts, err)
}

// updateService applies change to the current Service and writes it back.
func (e *env) updateService(t testing.TB, svc *corev1.Service, change func(*corev1.Service)) *corev1.Service {
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

// deleteService deletes svc.
func (e *env) deleteService(t testing.TB, svc *corev1.Service) {
	if err := e.kube.CoreV1().Services(svc.Namespace).Delete(t.Context(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

// setLoadBalancerIngress writes status.loadBalancer.ingress, as a cloud controller would.
func (e *env) setLoadBalancerIngress(t testing.TB, svc *corev1.Service, ips ...netip.Addr) *corev1.Service {
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

// The ranges virtual IPs come from, per kind and family.
const (
	loadBalancerVIP = "LoadBalancer"
	externalVIP     = "externalIP"
)

var vipBases = map[string][2]string{
	loadBalancerVIP: {"192.0.2.%d", "2001:db8:0:2::%x"},
	externalVIP:     {"198.51.100.%d", "2001:db8:198:51::%x"},
}

// vips returns one address per family of svc, unique to this run, for a LoadBalancer or
// external IP, routed by every cluster's external client to the node called via.
func (e *env) vips(t testing.TB, kind string, svc *corev1.Service, via string) []netip.Addr {
	n := e.vipSeq.Add(1)
	if n > 250 {
		t.Fatal("out of virtual IPs")
	}
	var out []netip.Addr
	for _, fam := range svc.Spec.IPFamilies {
		base := vipBases[kind][0]
		if fam == corev1.IPv6Protocol {
			base = vipBases[kind][1]
		}
		a := netip.MustParseAddr(fmt.Sprintf(base, n))
		e.routeVIP(t, a, via)
		out = append(out, a)
	}
	return out
}

// routeVIP points every cluster's external client's route for a at the node called via.
func (e *env) routeVIP(t testing.TB, a netip.Addr, via string) {
	for _, cl := range e.clusters {
		n := cl.topo.Node(via)
		if err := cl.topo.External.Route(netip.PrefixFrom(a, a.BitLen()), n.IP(a)); err != nil {
			t.Fatal(err)
		}
	}
}

// endpoint is one EndpointSlice endpoint: a pod (by name) and its conditions.
type endpoint struct {
	pod                         string
	ready, serving, terminating bool
	zoneHint                    string
}

// ready is a ready, serving, not terminating endpoint.
func ready(pod string) endpoint { return endpoint{pod: pod, ready: true, serving: true} }

// terminating is a terminating endpoint, serving or not (ready is always false then).
func terminating(pod string, serving bool) endpoint {
	return endpoint{pod: pod, serving: serving, terminating: true}
}

// hinted adds a zone hint.
func (ep endpoint) hinted(zone string) endpoint { ep.zoneHint = zone; return ep }

// setEndpoints writes the Service's EndpointSlices (one per family) so that they hold
// exactly eps, creating or replacing them.
func (e *env) setEndpoints(t testing.TB, svc *corev1.Service, eps ...endpoint) {
	e.setSlice(t, svc, "", eps...)
}

// setSlice writes one EndpointSlice per family of the Service, named
// <service>-<family>[-<suffix>], holding exactly eps. Several suffixes give a Service
// several slices, as the endpointslice controller does past 100 endpoints. Pod addresses
// are the same in every cluster's topology.
func (e *env) setSlice(t testing.TB, svc *corev1.Service, suffix string, eps ...endpoint) {
	ctx := t.Context()
	topo := e.clusters[0].topo
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
			pod := topo.Pod(ep.pod)
			addr := pod.IPv4
			if fam == corev1.IPv6Protocol {
				addr = pod.IPv6
			}
			d := discoveryv1.Endpoint{
				Addresses: []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{
					Ready: ptr.To(ep.ready), Serving: ptr.To(ep.serving), Terminating: ptr.To(ep.terminating),
				},
				NodeName: ptr.To(pod.Node.Name),
				Zone:     ptr.To(zoneOf[pod.Node.Name]),
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

// ---- talking to hosts ----------------------------------------------------------------------

// httpGetBody fetches url from inside host's namespace and returns the body of a 200 answer.
// The timeout is generous: kube-proxy's metrics page is long, and under emulation it takes
// seconds to write.
func httpGetBody(h *topology.Host, url string) (string, error) {
	client := &http.Client{Transport: hostTransport(h), Timeout: 15 * time.Second}
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

// logSince returns what the process logged after offset bytes (a length taken earlier).
func logSince(p *topology.Process, offset int64) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// logSize is the current length of the process's log, for logSince.
func logSize(p *topology.Process) int64 {
	st, err := os.Stat(p.LogPath)
	if err != nil {
		return 0
	}
	return st.Size()
}
