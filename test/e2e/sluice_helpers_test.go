//go:build e2e

package e2e

// Helpers for the tests that run sluice as a separate process against a real control
// plane and assert on what it exposes: the desired state and sync status on app.StatePath,
// /metrics, the health servers, and the Events it writes.
//
// Conventions (as in controlplane_test.go): Services in 10.96.0.0/16 (fd00:10:96::/112 for
// dual-stack), pod IPs in 10.244.0.0/16 (fd00:10:244::/64), this node "node-1" with
// 192.168.10.1 (and fd00:10::1), other nodes "node-2"...; external addresses from the
// documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24). Every subtest
// works in a namespace of its own, so names never clash and assertions can filter by it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/framework/promtext"
)

// Addresses of this node in the tests that run sluice in the root network namespace.
const (
	nodeIPv4 = "192.168.10.1"
	nodeIPv6 = "fd00:10::1"
)

// pollInterval is how often the wait helpers look again.
const pollInterval = 100 * time.Millisecond

// sluiceProcess is sluice running as a separate process against a control plane, with the
// recording backend: it programs nothing and serves the desired state on app.StatePath.
type sluiceProcess struct {
	cmd         *exec.Cmd
	metricsAddr string
	healthzAddr string
	logPath     string
	exited      chan error
}

// sluiceBinary is the sluice this package runs: $SLUICE_E2E_BIN (hack/test-e2e.sh sets it to a
// build with the race detector), else $SLUICE_BIN, else bin/sluice.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	for _, env := range []string{"SLUICE_E2E_BIN", "SLUICE_BIN"} {
		if p := os.Getenv(env); p != "" {
			return p
		}
	}
	p, err := filepath.Abs("../../bin/sluice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("sluice binary not found at %s (run make build or set SLUICE_BIN)", p)
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// freeNodePort returns a port of the apiserver's default NodePort range (30000-32767) that
// is free on 127.0.0.1 now, for a healthCheckNodePort the test chooses rather than leaving
// it to the apiserver's random pick.
func freeNodePort(t *testing.T) int32 {
	t.Helper()
	for range 100 {
		port := 30000 + rand.IntN(2768)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close() // only probed the port is free
		return int32(port)
	}
	t.Fatal("no free port in 30000-32767 on 127.0.0.1")
	return 0
}

// startSluice runs sluice in recording mode for node, with a config file holding extra
// (a YAML fragment of KubeProxyConfiguration fields, may be empty), and stops it at the
// end of the test. Its log is printed when the test fails.
//
// nodePortAddresses is loopback only, so that per-Service health checks listen on
// 127.0.0.1 (and [::1]) rather than on every address of the machine.
func startSluice(t *testing.T, cp *controlplane.ControlPlane, node, extra string, args ...string) *sluiceProcess {
	t.Helper()
	dir := t.TempDir()
	p := &sluiceProcess{
		metricsAddr: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		healthzAddr: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		logPath:     filepath.Join(dir, "sluice.log"),
		exited:      make(chan error, 1),
	}
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
metricsBindAddress: %s
healthzBindAddress: %s
nodePortAddresses: ["127.0.0.0/8", "::1/128"]
iptables:
  minSyncPeriod: 100ms
%s`, cp.ProxyKubeconfig(), node, p.metricsAddr, p.healthzAddr, extra)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	all := append([]string{"--config", cfgPath, "--backend", "recording", "-v", "2"}, args...)
	p.start(t, exec.Command(sluiceBinary(t), all...))
	return p
}

// start runs cmd with its output in p.logPath, and stops it (SIGTERM, then SIGKILL of its
// process group) when the test ends.
func (p *sluiceProcess) start(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = cmd
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("starting sluice: %v", err)
	}
	go func() { p.exited <- p.cmd.Wait(); _ = logFile.Close() }() // the child wrote through its own descriptor
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		// Stopping at the end of a test: how sluice exited is not what this cleanup checks.
		select {
		case <-p.exited: //nolint:errcheck // see above
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited //nolint:errcheck // see above
		}
		if log := p.log(); strings.Contains(log, raceReport) {
			t.Errorf("the race detector found a data race in sluice:\n%s", raceReports(log))
		} else if t.Failed() {
			t.Logf("sluice log (last 200 lines):\n%s", lastLines(log, 200))
		}
	})
}

// raceReport starts what a binary built with -race writes to stderr on a data race (and
// it goes on running; it exits 66 at the end).
const raceReport = "WARNING: DATA RACE"

// raceReports returns the race detector's reports in a log, each up to its closing line.
func raceReports(log string) string {
	var out []string
	in := false
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, raceReport) {
			in = true
		}
		if in {
			out = append(out, line)
		}
		if in && strings.HasPrefix(line, "==================") && len(out) > 1 {
			in = false
		}
	}
	return strings.Join(out, "\n")
}

// log returns what sluice has written so far.
func (p *sluiceProcess) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// checkRunning fails the test if sluice has exited.
func (p *sluiceProcess) checkRunning(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("sluice exited: %v", err)
	default:
	}
}

// waitExit waits for sluice to exit and returns its exit code, failing the test after
// timeout.
func (p *sluiceProcess) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("sluice still running after %v", timeout)
		return 0
	}
}

// state fetches the daemon's current status report.
func (p *sluiceProcess) state(ctx context.Context) (*app.StatusReport, error) {
	a, err := httpGet(ctx, "http://"+p.metricsAddr+app.StatePath)
	if err != nil {
		return nil, err
	}
	if a.code != http.StatusOK {
		return nil, fmt.Errorf("%d: %s", a.code, a.body)
	}
	var r app.StatusReport
	if err := json.Unmarshal(a.body, &r); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", a.body, err)
	}
	return &r, nil
}

// waitFor polls the daemon's state until cond accepts it, failing the test (with the last
// state) after timeout.
func (p *sluiceProcess) waitFor(t *testing.T, what string, timeout time.Duration, cond func(*app.StatusReport) bool) *app.StatusReport {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *app.StatusReport
	var lastErr error
	for {
		p.checkRunning(t)
		r, err := p.state(t.Context())
		if err == nil {
			last = r
			if cond(r) {
				return r
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(pollInterval)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	if len(b) > 20000 {
		b = append(b[:20000], "\n... (cut)"...)
	}
	t.Fatalf("timed out after %v waiting for %s; last error %v; last state:\n%s", timeout, what, lastErr, b)
	return nil
}

// familyReport returns the report of family ("IPv4" or "IPv6"), or nil.
func familyReport(r *app.StatusReport, family model.IPFamily) *app.FamilyReport {
	for i := range r.Families {
		if r.Families[i].Status.Family == family.String() || r.Families[i].State.Family == family.String() {
			return &r.Families[i]
		}
	}
	return nil
}

// hasFamily reports whether sluice proxies family.
func hasFamily(r *app.StatusReport, family model.IPFamily) bool {
	return familyReport(r, family) != nil
}

// portRef names one TCP Service port in the state.
type portRef struct {
	family    model.IPFamily
	namespace string
	name      string
	portName  string
}

func (ref portRef) String() string {
	return fmt.Sprintf("%s %s/%s:%s", ref.family, ref.namespace, ref.name, ref.portName)
}

// find returns the port's view in r, or nil when the family or the port is absent.
func (ref portRef) find(r *app.StatusReport) *model.ServicePortView {
	f := familyReport(r, ref.family)
	if f == nil {
		return nil
	}
	return f.State.Find(ref.namespace, ref.name, ref.portName, model.TCP)
}

// waitForPort waits until cond accepts the port's view (nil when the port is absent) in a
// state that has been synced at least once, and returns that view.
func (p *sluiceProcess) waitForPort(t *testing.T, what string, ref portRef, cond func(*model.ServicePortView) bool) *model.ServicePortView {
	t.Helper()
	var found *model.ServicePortView
	p.waitFor(t, ref.String()+": "+what, 30*time.Second, func(r *app.StatusReport) bool {
		f := familyReport(r, ref.family)
		if f == nil || f.Status.LastSuccess.IsZero() {
			return false
		}
		found = ref.find(r)
		return cond(found)
	})
	return found
}

// problemsOf returns the problems of Service ns/name in family's state.
func problemsOf(r *app.StatusReport, family model.IPFamily, ns, name string) []model.ProblemView {
	f := familyReport(r, family)
	if f == nil {
		return nil
	}
	var out []model.ProblemView
	for _, pr := range f.State.Problems {
		if pr.Namespace == ns && pr.Name == name {
			out = append(out, pr)
		}
	}
	return out
}

// endpointAddrs returns "ip:port" of each endpoint, in the view's order.
func endpointAddrs(eps []model.EndpointView) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, net.JoinHostPort(ep.IP, strconv.Itoa(int(ep.Port))))
	}
	return out
}

// equalStrings reports whether a and b hold the same strings in the same order; nil and
// empty are equal.
func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// httpAnswer is a response read to the end.
type httpAnswer struct {
	code   int
	header http.Header
	body   []byte
}

// httpGet GETs url with a short timeout and reads the whole answer.
func httpGet(ctx context.Context, url string) (*httpAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// A fresh connection each time: health servers are opened and closed under the test.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &httpAnswer{code: resp.StatusCode, header: resp.Header, body: body}, nil
}

// waitForHTTP polls url until cond accepts an answer, and returns it.
func waitForHTTP(t *testing.T, what, url string, timeout time.Duration, cond func(*httpAnswer) bool) *httpAnswer {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *httpAnswer
	var lastErr error
	for {
		a, err := httpGet(t.Context(), url)
		if err == nil {
			last = a
			if cond(a) {
				return a
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(pollInterval)
	}
	if last != nil {
		t.Fatalf("timed out after %v waiting for %s from %s; last answer %d %v: %s", timeout, what, url, last.code, last.header, last.body)
	}
	t.Fatalf("timed out after %v waiting for %s from %s; last error %v", timeout, what, url, lastErr)
	return nil
}

// metricFamilies is one scrape of /metrics.
type metricFamilies map[string]*dto.MetricFamily

// scrape reads and parses the Prometheus text exposition at url.
func scrape(ctx context.Context, url string) (metricFamilies, error) {
	a, err := httpGet(ctx, url)
	if err != nil {
		return nil, err
	}
	if a.code != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s", url, a.code, a.body)
	}
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(strings.NewReader(string(a.body)))
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return mf, nil
}

// metrics scrapes sluice's /metrics.
func (p *sluiceProcess) metrics(ctx context.Context) (metricFamilies, error) {
	return scrape(ctx, "http://"+p.metricsAddr+"/metrics")
}

// value returns the sum over the series of metric name whose labels include labels
// (name=value pairs): the value of a counter, gauge or untyped metric, the sample count of
// a histogram or summary. found is false when no series matches.
func (m metricFamilies) value(name string, labels ...string) (v float64, found bool) {
	return promtext.Value(m[name], labels...)
}

// waitForMetrics polls /metrics until cond accepts a scrape, and returns it.
func (p *sluiceProcess) waitForMetrics(t *testing.T, what string, timeout time.Duration, cond func(metricFamilies) bool) metricFamilies {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		p.checkRunning(t)
		m, err := p.metrics(t.Context())
		if err == nil && cond(m) {
			return m
		}
		lastErr = err
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(pollInterval)
	}
	t.Fatalf("timed out after %v waiting for metrics: %s (last error %v)", timeout, what, lastErr)
	return nil
}

// createNode creates this test's Node with InternalIP addresses, as a kubelet would
// register it.
func createNode(t *testing.T, c kubernetes.Interface, name string, ips ...string) *corev1.Node {
	t.Helper()
	ctx := t.Context()
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	for _, ip := range ips {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	node, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("setting addresses of node %s: %v", name, err)
	}
	return node
}

// newNamespace creates a namespace named after prefix and returns its name.
func newNamespace(t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// clusterIPService returns a single-stack ClusterIP Service with one TCP port "http" 80 →
// 8080.
func clusterIPService(ns, name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

func createService(t *testing.T, c kubernetes.Interface, svc *corev1.Service) *corev1.Service {
	t.Helper()
	created, err := c.CoreV1().Services(svc.Namespace).Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return created
}

// updateService applies mutate to the current Service and writes it, retrying on
// conflicts.
func updateService(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*corev1.Service)) *corev1.Service {
	t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(svc)
		out, err = c.CoreV1().Services(ns).Update(t.Context(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating service %s/%s: %v", ns, name, err)
	}
	return out
}

// updateServiceStatus applies mutate to the current Service's status and writes it, as a
// load-balancer controller would.
func updateServiceStatus(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*corev1.ServiceStatus)) *corev1.Service {
	t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(&svc.Status)
		out, err = c.CoreV1().Services(ns).UpdateStatus(t.Context(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating status of service %s/%s: %v", ns, name, err)
	}
	return out
}

func deleteService(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	if err := c.CoreV1().Services(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting service %s/%s: %v", ns, name, err)
	}
}

// endpoint returns an endpoint with one address on node with explicit conditions.
func endpoint(ip, node string, ready, serving, terminating bool) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)},
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	return ep
}

// readyEndpoint is a ready, serving, not terminating endpoint on node.
func readyEndpoint(ip, node string) discoveryv1.Endpoint {
	return endpoint(ip, node, true, true, false)
}

// tcpPort is an EndpointSlice port.
func tcpPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}
}

// endpointSlice returns an EndpointSlice of Service ns/service as the EndpointSlice
// controller would label it.
func endpointSlice(ns, service, name string, addressType discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: ns,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: service,
				discoveryv1.LabelManagedBy:   "sluice-e2e",
			},
		},
		AddressType: addressType,
		Endpoints:   eps,
		Ports:       ports,
	}
}

func createSlice(t *testing.T, c kubernetes.Interface, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	created, err := c.DiscoveryV1().EndpointSlices(s.Namespace).Create(t.Context(), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating endpointslice %s/%s: %v", s.Namespace, s.Name, err)
	}
	return created
}

// updateSlice applies mutate to the current EndpointSlice and writes it, retrying on
// conflicts.
func updateSlice(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	t.Helper()
	var out *discoveryv1.EndpointSlice
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := c.DiscoveryV1().EndpointSlices(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(s)
		out, err = c.DiscoveryV1().EndpointSlices(ns).Update(t.Context(), s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating endpointslice %s/%s: %v", ns, name, err)
	}
	return out
}

func deleteSlice(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	if err := c.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting endpointslice %s/%s: %v", ns, name, err)
	}
}

// waitForAPIEvent polls the events.k8s.io/v1 Events of namespace ns (as the admin) until
// one matches, and returns it.
func waitForAPIEvent(t *testing.T, c kubernetes.Interface, ns, what string, timeout time.Duration, match func(*eventsv1.Event) bool) *eventsv1.Event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []string
	for {
		list, err := c.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err == nil {
			seen = seen[:0]
			for i := range list.Items {
				ev := &list.Items[i]
				if match(ev) {
					return ev
				}
				seen = append(seen, fmt.Sprintf("%s %s %s/%s: %s", ev.Type, ev.Reason, ev.Regarding.Kind, ev.Regarding.Name, ev.Note))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for the Event %s in namespace %q (last error %v); events seen:\n%s",
				timeout, what, ns, err, strings.Join(seen, "\n"))
		}
		time.Sleep(pollInterval)
	}
}
