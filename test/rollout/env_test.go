//go:build e2e

package rollout

// The scaffolding every rollout test shares (see the package documentation): Env, one
// node with two pods and a control plane; Sluice, one sluice process in that node.
//
// Conventions: the node namespace is the topology's node-a (172.18.0.2, fd00:172:18::2;
// pods a0 10.244.1.10 and a1 10.244.1.11, fd00:10:244:1::a and ::b); Services come from
// 10.96.0.0/16 and fd00:10:96::/112, port 80 → 8080 (a0's echo server, TCP).

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/framework/promtext"
	"github.com/sluiceproxy/sluice/test/netnstest"
	"github.com/sluiceproxy/sluice/test/topology"
)

const (
	// healthzPort and metricsPort are where sluice listens inside the node namespace (on
	// every address there); the test reaches them over the node's link to its namespace.
	healthzPort = 10256
	metricsPort = 10249
	// echoPort is a0's echo server; servicePort the Services' port.
	echoPort    = 8080
	servicePort = 80
)

// convergeTimeout bounds every wait for sluice to do something it does within a second or
// two on an idle machine; the margin is for a loaded 2-core one.
const convergeTimeout = 60 * time.Second

// Env is one test's world: a dual-stack topology with one node namespace (node-a) and two
// pods, a0 running the echo server (the endpoint of every Service EchoService creates) and
// a1 (a client), and a control plane the node reaches. Fields are read-only.
type Env struct {
	Topo *topology.Cluster
	// Node is the namespace sluice runs in; Node objects for it are made by RegisterNode.
	Node *topology.Node
	// Server runs the echo server; Client is another pod on the node.
	Server, Client *topology.Pod
	CP             *controlplane.ControlPlane
	// Kube is the admin client.
	Kube kubernetes.Interface
	// Families are the IP families every packet check covers.
	Families []corev1.IPFamily

	nsSeq atomic.Int32
}

// NewEnv builds an Env for t, torn down when t ends (processes, namespaces, control plane).
func NewEnv(t *testing.T) *Env {
	t.Helper()
	topo := topology.New(t, topology.Options{Nodes: 1, PodsPerNode: 2, IPv6: true})
	cp := controlplane.StartForTest(t, controlplane.Options{
		BindAddress:  topo.APIAddress().String(),
		ServiceCIDRs: controlplane.DualStackServiceCIDRs(),
		LogDir:       filepath.Join(topo.LogDir, "controlplane"),
	})
	e := &Env{
		Topo: topo, Node: topo.Nodes[0], Server: topo.Nodes[0].Pods[0], Client: topo.Nodes[0].Pods[1],
		CP: cp, Kube: cp.AdminClient(), Families: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
	}
	topo.StartEcho(t, topology.EchoOptions{
		Binary: os.Getenv("SLUICE_ECHOSERVER"), Ports: []uint16{echoPort}, Protocols: []echo.Protocol{echo.TCP},
	}, e.Server)
	return e
}

// NodeOptions shape a Node object.
type NodeOptions struct {
	// PodCIDRs gives the Node spec.podCIDRs (the topology node's, both families), as
	// kube-controller-manager's node IPAM does; without it the Node has none, as with a
	// CNI that allocates pod addresses itself.
	PodCIDRs bool
}

// RegisterNode creates a Node object called name for the node namespace, as its kubelet
// would: InternalIP addresses (IPv4, then IPv6), Ready. It returns name, which is what
// sluice's --hostname-override must say.
func (e *Env) RegisterNode(t *testing.T, name string, opts NodeOptions) string {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if opts.PodCIDRs {
		node.Spec.PodCIDRs = e.podCIDRs()
		node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	}
	created, err := e.Kube.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	for _, ip := range e.Node.IPs() {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "RolloutTest",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := e.Kube.CoreV1().Nodes().UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting the status of Node %s: %v", name, err)
	}
	return name
}

// SetPodCIDRs gives Node name the node namespace's pod CIDRs, as node IPAM would once it
// has allocated them.
func (e *Env) SetPodCIDRs(t *testing.T, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := e.Kube.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.PodCIDRs = e.podCIDRs()
		n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
		_, err = e.Kube.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("setting the pod CIDRs of Node %s: %v", name, err)
	}
}

func (e *Env) podCIDRs() []string {
	var out []string
	for _, c := range e.Node.PodCIDRs {
		out = append(out, c.String())
	}
	return out
}

// Config returns a configuration file for sluice on Node node in mode, as v1alpha1 YAML:
// the control plane's kubeconfig for system:kube-proxy, health and metrics on every
// address of the node namespace, clusterCIDR the topology's (both families), minSyncPeriod
// 100ms, and conntrack sizing left alone (maxPerCore 0: it is global to the machine).
// edit, when not nil, changes the configuration before it is written.
func (e *Env) Config(t *testing.T, node, mode string, edit func(*v1alpha1.KubeProxyConfiguration)) string {
	t.Helper()
	cfg := &v1alpha1.KubeProxyConfiguration{
		Mode:               v1alpha1.ProxyMode(mode),
		HostnameOverride:   node,
		ClusterCIDR:        topology.ClusterCIDRv4 + "," + topology.ClusterCIDRv6,
		HealthzBindAddress: fmt.Sprintf("0.0.0.0:%d", healthzPort),
		MetricsBindAddress: fmt.Sprintf("0.0.0.0:%d", metricsPort),
	}
	cfg.ClientConnection.Kubeconfig = e.CP.ProxyKubeconfig()
	cfg.Logging.Verbosity = 2
	cfg.IPTables.MinSyncPeriod = metav1.Duration{Duration: 100 * time.Millisecond}
	cfg.NFTables.MinSyncPeriod = metav1.Duration{Duration: 100 * time.Millisecond}
	cfg.Conntrack.MaxPerCore = ptr.To[int32](0)
	if edit != nil {
		edit(cfg)
	}
	data, err := config.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// SluiceOptions say how to run one sluice.
type SluiceOptions struct {
	// Node is the Node object sluice runs for (--hostname-override).
	Node string
	// Config is the content of its --config file.
	Config string
	// Wrap is a command line to run sluice under (ReadOnlyProcSys, WithoutCapability);
	// sluice's own command line is appended to it.
	Wrap []string
	// Args are more flags for sluice.
	Args []string
}

// ReadOnlyProcSys runs the command in a private mount namespace where /proc/sys is a
// read-only bind mount, as the container runtime gives every unprivileged container.
func ReadOnlyProcSys() []string {
	return []string{"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"`, "sh"}
}

// WithoutCapability runs the command without capability name (for example
// "sys_resource"), neither effective nor inheritable nor in the bounding set.
func WithoutCapability(name string) []string {
	return []string{"setpriv", "--inh-caps=-" + name, "--bounding-set=-" + name, "--"}
}

// Sluice is one sluice process in the node namespace.
type Sluice struct {
	Proc *topology.Process
	// Node is its Node object's name.
	Node string
	// Started is when the process was started.
	Started time.Time
	env     *Env
}

// StartSluice writes the configuration and starts sluice; it is stopped when t ends.
func (e *Env) StartSluice(t *testing.T, opts SluiceOptions) *Sluice {
	t.Helper()
	seq := e.nsSeq.Add(1)
	path := filepath.Join(e.Topo.LogDir, fmt.Sprintf("sluice-%s-%d.yaml", opts.Node, seq))
	if err := os.WriteFile(path, []byte(opts.Config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := append(append([]string{}, opts.Wrap...), os.Getenv("SLUICE_BIN"), "--config", path, "--hostname-override", opts.Node)
	cmd = append(cmd, opts.Args...)
	p, err := e.Node.Start(fmt.Sprintf("sluice-%s-%d", opts.Node, seq), cmd[0], cmd[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	s := &Sluice{Proc: p, Node: opts.Node, Started: time.Now(), env: e}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(40))
		}
		p.Stop()
	})
	return s
}

// Stop stops sluice (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (s *Sluice) Stop() { s.Proc.Stop() }

// Log returns what sluice has logged so far.
func (s *Sluice) Log() string {
	b, _ := os.ReadFile(s.Proc.LogPath)
	return string(b)
}

// RequireRunning fails t, with the end of sluice's log, if sluice has exited.
func (s *Sluice) RequireRunning(t *testing.T) {
	t.Helper()
	if exited, err := s.Proc.Exited(); exited {
		t.Fatalf("sluice for %s exited: %v\n%s", s.Node, err, s.Proc.Tail(40))
	}
}

// WaitExit waits for sluice to exit and returns its exit code.
func (s *Sluice) WaitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if exited, err := s.Proc.Exited(); exited {
			var exitErr *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &exitErr):
				return exitErr.ExitCode()
			}
			t.Fatalf("sluice for %s: %v", s.Node, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("sluice for %s still runs after %v\n%s", s.Node, timeout, s.Proc.Tail(20))
	return 0
}

// url is an address of sluice's servers, reached over the node's link to the test's
// namespace.
func (s *Sluice) url(port int, path string) string {
	return fmt.Sprintf("http://%s%s", netip.AddrPortFrom(s.env.Node.APIAddress, uint16(port)), path)
}

// get fetches one of sluice's URLs and returns the code and body.
func get(url string) (int, string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Get fetches path from sluice's health server (port healthzPort) or metrics server
// (metricsPort).
func (s *Sluice) Get(port int, path string) (int, string, error) { return get(s.url(port, path)) }

// WaitLivez waits until /livez answers 200 and returns how long after the start that was.
func (s *Sluice) WaitLivez(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	var last string
	for time.Since(s.Started) < timeout {
		s.RequireRunning(t)
		code, body, err := s.Get(healthzPort, "/livez")
		if err == nil && code == http.StatusOK {
			return time.Since(s.Started)
		}
		last = fmt.Sprintf("%d %s %v", code, body, err)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sluice for %s: /livez did not answer 200 within %v of the start (last: %s)\n%s", s.Node, timeout, last, s.Proc.Tail(30))
	return 0
}

// Metric returns the value of metric name summed over the series whose labels include
// labels (name, value pairs), and whether any series matched.
func (s *Sluice) Metric(name string, labels ...string) (float64, bool, error) {
	code, body, err := s.Get(metricsPort, "/metrics")
	if err != nil {
		return 0, false, err
	}
	if code != http.StatusOK {
		return 0, false, fmt.Errorf("/metrics: %d", code)
	}
	families, err := promtext.Parse(body)
	if err != nil {
		return 0, false, err
	}
	v, found := families.Value(name, labels...)
	return v, found, nil
}

// WaitMetric waits until metric name (with labels) has value want.
func (s *Sluice) WaitMetric(t *testing.T, name string, want float64, labels ...string) {
	t.Helper()
	var last string
	deadline := time.Now().Add(convergeTimeout)
	for time.Now().Before(deadline) {
		s.RequireRunning(t)
		v, found, err := s.Metric(name, labels...)
		if err == nil && found && v == want {
			return
		}
		last = fmt.Sprintf("value %v, found %v, err %v", v, found, err)
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("sluice for %s: %s%v is not %v (%s)", s.Node, name, labels, want, last)
}

// WaitSynced waits until every family has had a successful sync
// (kubeproxy_sync_proxy_rules_last_timestamp_seconds is set).
func (s *Sluice) WaitSynced(t *testing.T) {
	t.Helper()
	for _, f := range s.env.Families {
		deadline := time.Now().Add(convergeTimeout)
		for {
			s.RequireRunning(t)
			v, _, err := s.Metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", string(f))
			if err == nil && v > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sluice for %s: no successful %s sync within %v (%v)\n%s", s.Node, f, convergeTimeout, err, s.Proc.Tail(30))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// WaitLog waits until sluice's log contains every one of want.
func (s *Sluice) WaitLog(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(convergeTimeout)
	for {
		log := s.Log()
		missing := ""
		for _, w := range want {
			if !strings.Contains(log, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice for %s never logged %q\n%s", s.Node, missing, s.Proc.Tail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// EchoService creates, in a namespace of its own, a RequireDualStack ClusterIP Service
// (port 80 → 8080/TCP) whose EndpointSlices (one per family, written as the EndpointSlice
// controller would) hold a0, on Node node. Create it after the sluice that must serve it
// has started, so that only that sluice can have programmed it.
func (e *Env) EchoService(t *testing.T, node string) *corev1.Service {
	t.Helper()
	return e.EchoServiceIn(t, node, e.NewNamespaceName())
}

// NewNamespaceName returns a namespace name no Service of this Env has used, for
// EchoServiceIn when a test must know the Service's name before creating it.
func (e *Env) NewNamespaceName() string { return fmt.Sprintf("rollout-%d", e.nsSeq.Add(1)) }

// EchoServiceIn is EchoService in namespace ns (from NewNamespaceName), Service "echo".
func (e *Env) EchoServiceIn(t *testing.T, node, ns string) *corev1.Service {
	t.Helper()
	ctx := t.Context()
	if _, err := e.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	svc, err := e.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Ports:          []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(echoPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s/echo: %v", ns, err)
	}
	for _, fam := range svc.Spec.IPFamilies {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo-" + strings.ToLower(string(fam)), Labels: map[string]string{
				discoveryv1.LabelServiceName: "echo", discoveryv1.LabelManagedBy: "rollout.sluice.test",
			}},
			AddressType: discoveryv1.AddressType(fam),
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](echoPort)}},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{familyAddr(&e.Server.Host, fam).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(node),
			}},
		}
		if _, err := e.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating EndpointSlice %s/%s: %v", ns, slice.Name, err)
		}
	}
	return svc
}

// clusterIP is svc's ClusterIP of family fam.
func clusterIP(t *testing.T, svc *corev1.Service, fam corev1.IPFamily) netip.Addr {
	t.Helper()
	for _, c := range svc.Spec.ClusterIPs {
		if a := netip.MustParseAddr(c); a.Is4() == (fam == corev1.IPv4Protocol) {
			return a
		}
	}
	t.Fatalf("Service %s/%s has no %s ClusterIP: %v", svc.Namespace, svc.Name, fam, svc.Spec.ClusterIPs)
	return netip.Addr{}
}

func familyAddr(h *topology.Host, fam corev1.IPFamily) netip.Addr {
	if fam == corev1.IPv6Protocol {
		return h.IPv6
	}
	return h.IPv4
}

// ExpectServed waits until, for every family, connections from the client pod and from
// the node itself to the Service's ClusterIP are answered by a0, three times in a row.
// s is the sluice that must keep running meanwhile; nil when the rules must serve without
// one (after it stopped).
func (e *Env) ExpectServed(t *testing.T, s *Sluice, svc *corev1.Service) {
	t.Helper()
	for _, fam := range e.Families {
		target := netip.AddrPortFrom(clusterIP(t, svc, fam), servicePort)
		for _, from := range []*topology.Host{&e.Client.Host, &e.Node.Host} {
			deadline := time.Now().Add(convergeTimeout)
			answered := 0
			for answered < 3 {
				if s != nil {
					s.RequireRunning(t)
				}
				out := from.Probe(echo.TCP, target, echo.ProbeOptions{Timeout: time.Second})
				if out.Result == echo.Answered && out.Reply.Pod == e.Server.Name {
					answered++
					continue
				}
				answered = 0
				if time.Now().After(deadline) {
					tail := "(no sluice running)"
					if s != nil {
						tail = s.Proc.Tail(30)
					}
					t.Fatalf("%s -> %s (%s ClusterIP of %s/%s): %s, want an answer from %s\n%s",
						from.Name, target, fam, svc.Namespace, svc.Name, out, e.Server.Name, tail)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s -> %s (%s): answered by %s", from.Name, target, fam, e.Server.Name)
		}
	}
}

// WaitNodeEvent waits for a Warning Event with reason on Node node, as the API has it
// (events.k8s.io/v1; Events about cluster-scoped objects are in namespace default), and
// returns it.
func (e *Env) WaitNodeEvent(t *testing.T, node, reason string) *eventsv1.Event {
	t.Helper()
	deadline := time.Now().Add(convergeTimeout)
	var seen []string
	for {
		list, err := e.Kube.EventsV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{})
		if err == nil {
			seen = seen[:0]
			for i := range list.Items {
				ev := &list.Items[i]
				if ev.Regarding.Kind == "Node" && ev.Regarding.Name == node && ev.Reason == reason && ev.Type == corev1.EventTypeWarning {
					return ev
				}
				if ev.Regarding.Name == node {
					seen = append(seen, ev.Type+" "+ev.Reason+": "+ev.Note)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Warning Event %s on Node %s within %v (last error %v); its Events:\n%s", reason, node, convergeTimeout, err, strings.Join(seen, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Sysctl reads an integer sysctl ("net/netfilter/nf_conntrack_tcp_timeout_close_wait")
// of the node namespace.
func (e *Env) Sysctl(t *testing.T, name string) int {
	t.Helper()
	var v int
	err := netnstest.Do(e.Node.NetNS, func() error {
		b, err := os.ReadFile("/proc/sys/" + name)
		if err != nil {
			return err
		}
		v, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	if err != nil {
		t.Fatalf("reading %s in %s: %v", name, e.Node.Name, err)
	}
	return v
}

// SetSysctl writes an integer sysctl of the node namespace (never a global one).
func (e *Env) SetSysctl(t *testing.T, name string, value int) {
	t.Helper()
	err := netnstest.Do(e.Node.NetNS, func() error {
		return os.WriteFile("/proc/sys/"+name, []byte(strconv.Itoa(value)), 0o644)
	})
	if err != nil {
		t.Fatalf("setting %s=%d in %s: %v", name, value, e.Node.Name, err)
	}
}

// modes are the backends whose startup behaviour differs where it matters here (iptables
// sets route_localnet, nftables does not); ipvs runs only in the IPVS VM.
var modes = []string{"iptables", "nftables"}

// nodeName names the Node object of one sluice run: a test's prefix and the mode.
func nodeName(prefix, mode string) string { return prefix + "-" + mode }
