package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/topology"
)

// Ports sluice serves on inside each node.
const (
	metricsPort = 10249
	healthzPort = 10256
)

// Options shape a sandbox.
type Options struct {
	// Mode is sluice's mode: iptables, nftables or ipvs.
	Mode string
	// RunDir holds the state file, the logs, the kubeconfig, the control plane's files and
	// copies of the binaries; Close removes it. It must not hold another sandbox's state.
	RunDir string
	// Sluice and EchoServer are the binaries to run (make build's bin/sluice and
	// bin/echoserver).
	Sluice, EchoServer string
	// Binaries are kube-apiserver and etcd; empty fields are found as the e2e tests find
	// them ($KUBE_APISERVER, $ETCD, else hack/control-plane.sh).
	Binaries controlplane.Binaries
	// Progress receives one line per step while the sandbox builds; Log receives the
	// details (topology, warnings). Either may be nil.
	Progress, Log io.Writer
	// ConvergeTimeout bounds the wait for every probe to give the expected result.
	ConvergeTimeout time.Duration
}

// Sandbox is a running sandbox. Close tears it down.
type Sandbox struct {
	opts  Options
	state *State
	tb    *runTB
	topo  *topology.Cluster
	cp    *controlplane.ControlPlane
	kube  kubernetes.Interface
	svcs  map[string]*corev1.Service

	sluice     map[string]*topology.Process
	kubeconfig string
	cases      []*probeCase
	started    time.Time
}

// Up builds the sandbox. On error everything built so far is torn down.
func Up(ctx context.Context, opts Options) (s *Sandbox, err error) {
	if err := checkOptions(&opts); err != nil {
		return nil, err
	}
	if st, err := ReadState(opts.RunDir); err == nil {
		if st.Alive() {
			return nil, fmt.Errorf("a sandbox is already running from %s (pid %d); stop it first (make demo-down), or choose another run directory", opts.RunDir, st.PID)
		}
		// A sandbox that was killed: clear what it left before building anew.
		if err := Down(opts.RunDir, func(f string, a ...any) { logTo(opts.Log, f, a...) }); err != nil {
			return nil, fmt.Errorf("removing the leftovers of an earlier sandbox: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(opts.RunDir, "tmp"), 0o755); err != nil {
		return nil, err
	}
	// Everything the control plane and the processes put in temporary directories lands in
	// the run directory, which Close (or Down) removes whole.
	if err := os.Setenv("TMPDIR", filepath.Join(opts.RunDir, "tmp")); err != nil {
		return nil, err
	}

	s = &Sandbox{opts: opts, state: newState(opts.Mode, opts.RunDir), sluice: map[string]*topology.Process{}, started: time.Now()}
	if err := s.state.write(); err != nil {
		return nil, fmt.Errorf("writing the state file: %w", err)
	}
	s.tb = newRunTB(ctx, func(f string, a ...any) { logTo(opts.Log, f, a...) }, func(f string, a ...any) { logTo(opts.Progress, f, a...) })
	defer func() {
		if err != nil {
			if closeErr := s.Close(); closeErr != nil {
				err = fmt.Errorf("%w\n(and tearing down: %w)", err, closeErr)
			}
			s = nil
		}
	}()
	if err := catch(func() { s.build(ctx) }); err != nil {
		return s, err
	}
	return s, ctx.Err()
}

func checkOptions(opts *Options) error {
	switch opts.Mode {
	case "iptables", "nftables":
	case "ipvs":
		if err := checkIPVS(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("mode %q: want iptables, nftables or ipvs", opts.Mode)
	}
	if opts.RunDir == "" || opts.Sluice == "" || opts.EchoServer == "" {
		return errors.New("the run directory and the sluice and echoserver binaries are required")
	}
	for _, p := range []*string{&opts.RunDir, &opts.Sluice, &opts.EchoServer} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	for _, bin := range []string{opts.Sluice, opts.EchoServer} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%w (make build builds it)", err)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("the sandbox needs root: it creates network namespaces and a bridge")
	}
	if opts.ConvergeTimeout == 0 {
		opts.ConvergeTimeout = 60 * time.Second
	}
	return nil
}

// checkIPVS fails unless the kernel has IPVS (loading the module if it can).
func checkIPVS() error {
	_ = exec.Command("modprobe", "-q", "ip_vs").Run()
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		return nil
	}
	return errors.New("mode ipvs needs a kernel with IPVS (the ip_vs module: modprobe ip_vs), and this one has none; " +
		"use MODE=nftables or MODE=iptables here, or run the IPVS tests in a VM with make test-ipvs (hack/ipvs-vm.sh)")
}

func logTo(w io.Writer, f string, a ...any) {
	if w != nil {
		fmt.Fprintf(w, strings.TrimSuffix(f, "\n")+"\n", a...)
	}
}

func (s *Sandbox) progress(f string, a ...any) {
	logTo(s.opts.Progress, fmt.Sprintf("[%5.1fs] ", time.Since(s.started).Seconds())+f, a...)
}

// build does the work of Up; errors unwind through s.tb.Fatal.
func (s *Sandbox) build(ctx context.Context) {
	t := s.tb
	logDir := filepath.Join(s.opts.RunDir, "logs")

	// Copies of the binaries in the run directory: every process the sandbox starts then
	// names the run directory on its command line, which is how Down finds stragglers.
	binDir := filepath.Join(s.opts.RunDir, "bin")
	sluiceBin, echoBin := filepath.Join(binDir, "sluice"), filepath.Join(binDir, "echoserver")
	for src, dst := range map[string]string{s.opts.Sluice: sluiceBin, s.opts.EchoServer: echoBin} {
		if err := copyFile(src, dst, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	s.progress("building two nodes of network namespaces, two pods each, and an external client")
	s.topo = topology.New(t, topology.Options{Nodes: 2, PodsPerNode: 2, ExternalAddresses: 1, LogDir: logDir})
	if err := checkUniqueAddress(s.topo.APIAddress()); err != nil {
		t.Fatal(err)
	}
	s.state.APIBridge, s.state.APIAddress = s.topo.APIBridge, s.topo.APIAddress().String()
	if err := s.state.write(); err != nil {
		t.Fatal(err)
	}

	s.progress("starting etcd and kube-apiserver on %s", s.topo.APIAddress())
	cp, err := controlplane.Start(ctx, controlplane.Options{
		BindAddress: s.topo.APIAddress().String(),
		LogDir:      filepath.Join(logDir, "controlplane"),
		Binaries:    s.opts.Binaries,
	})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	s.cp = cp
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	s.kube = cp.AdminClient()
	s.kubeconfig = filepath.Join(s.opts.RunDir, "kubeconfig")
	if err := copyFile(cp.AdminKubeconfig(), s.kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	s.state.Kubeconfig = s.kubeconfig

	s.progress("registering the nodes, starting the echo servers, creating the sample Services")
	for _, n := range s.topo.Nodes {
		if err := registerNode(ctx, s.kube, n); err != nil {
			t.Fatal(err)
		}
	}
	s.topo.StartEcho(t, topology.EchoOptions{Binary: echoBin, Ports: []uint16{EchoPort}, Protocols: []echo.Protocol{echo.TCP, echo.UDP}})
	if s.svcs, err = createObjects(ctx, s.kube, s.topo); err != nil {
		t.Fatal(err)
	}
	for _, p := range lbRoutes() {
		if err := s.topo.External.Route(p, s.topo.Node("node-a").IPv4); err != nil {
			t.Fatal(err)
		}
	}

	s.progress("starting sluice (%s mode) on node-a and node-b", s.opts.Mode)
	for _, n := range s.topo.Nodes {
		s.startSluice(sluiceBin, n)
	}
	// Registered last, so it runs first: sluice stops while its apiserver is still there.
	t.Cleanup(func() {
		for _, p := range s.sluice {
			p.Stop()
		}
	})
	for _, n := range s.topo.Nodes {
		s.waitHealthy(ctx, n)
	}

	s.progress("waiting until every client gets what it should")
	s.cases = trafficCases(s.topo)
	deadline := time.Now().Add(s.opts.ConvergeTimeout)
	for {
		s.requireRunning()
		ok, why := allOK(probeAll(s.cases))
		if ok {
			break
		}
		if time.Now().After(deadline) {
			s.progress("not every client got what it should after %s: %s", s.opts.ConvergeTimeout, why)
			break
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.state.Ready = true
	if err := s.state.write(); err != nil {
		t.Fatal(err)
	}
	s.progress("ready")
}

// sluiceConfig is the KubeProxyConfiguration of one node's sluice. The metrics server
// listens on every address of the node, so that the host reaches it over the API link;
// conntrack sizing is left alone because those sysctls are global to the machine.
func (s *Sandbox) sluiceConfig(n *topology.Node) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clusterCIDR: %s
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 0.0.0.0:%d
clientConnection:
  kubeconfig: %s
logging:
  verbosity: 2
iptables:
  minSyncPeriod: 250ms
nftables:
  minSyncPeriod: 250ms
ipvs:
  minSyncPeriod: 250ms
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, s.opts.Mode, n.Name, topology.ClusterCIDRv4, healthzPort, metricsPort, s.cp.ProxyKubeconfig())
}

func (s *Sandbox) startSluice(bin string, n *topology.Node) {
	path := filepath.Join(s.opts.RunDir, "sluice-"+n.Name+".yaml")
	if err := os.WriteFile(path, []byte(s.sluiceConfig(n)), 0o644); err != nil {
		s.tb.Fatal(err)
	}
	p, err := n.Start("sluice-"+n.Name, bin, "--config", path)
	if err != nil {
		s.tb.Fatal(err)
	}
	s.sluice[n.Name] = p
}

// waitHealthy waits for a node's sluice to answer /healthz with 200 (it has synced).
func (s *Sandbox) waitHealthy(ctx context.Context, n *topology.Node) {
	url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.APIAddress, healthzPort))
	client := &http.Client{Timeout: time.Second}
	last := ""
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		s.requireRunning()
		if ctx.Err() != nil {
			s.tb.Fatal(ctx.Err())
		}
		resp, err := client.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.tb.Fatalf("sluice on %s: %s never answered 200 (last: %s); its log ends:\n%s", n.Name, url, last, s.sluice[n.Name].Tail(30))
}

// requireRunning fails if a sluice has exited.
func (s *Sandbox) requireRunning() {
	for name, p := range s.sluice {
		if exited, err := p.Exited(); exited {
			s.tb.Fatalf("sluice on %s exited: %v; its log ends:\n%s", name, err, p.Tail(30))
		}
	}
}

// Failed returns an error when a sluice process has exited.
func (s *Sandbox) Failed() error {
	return catch(s.requireRunning)
}

// Probe runs every traffic case once more and prints the table to w. ok is false when a
// client did not get what it should.
func (s *Sandbox) Probe(w io.Writer) (ok bool, err error) {
	results := probeAll(s.cases)
	ok, _ = allOK(results)
	return ok, writeTraffic(w, results, addressNames(s.topo))
}

// Describe prints the topology, the Services, and where to look.
func (s *Sandbox) Describe(w io.Writer) error {
	var b strings.Builder
	nodeA, nodeB := s.topo.Node("node-a"), s.topo.Node("node-b")
	ext := s.topo.External
	fmt.Fprintf(&b, "sluice sandbox, %s mode (run directory %s)\n\n", s.opts.Mode, s.opts.RunDir)
	fmt.Fprintf(&b, "  kube-apiserver  %s (and etcd), in this machine's network namespace\n", s.cp.URL())
	for _, n := range s.topo.Nodes {
		fmt.Fprintf(&b, "  %-15s netns %s, node IP %s, %s; API link %s\n", n.Name, n.NetNS, n.IPv4, zoneOf[n.Name], n.APIAddress)
		for _, p := range n.Pods {
			fmt.Fprintf(&b, "    pod %-9s netns %s, IP %s, echo server on tcp and udp %d\n", p.Name, p.NetNS, p.IPv4, EchoPort)
		}
	}
	fmt.Fprintf(&b, "  %-15s netns %s, IP %s; routes %s to node-a\n", "external client", ext.NetNS, ext.IPv4, prefixes(lbRoutes()))

	b.WriteString("\nServices (namespace demo):\n")
	for _, ss := range sampleServices {
		svc := s.svcs[ss.name]
		addr := fmt.Sprintf("ClusterIP %s:80", svc.Spec.ClusterIP)
		if ss.nodePort != 0 {
			addr += fmt.Sprintf(", NodePort %d", ss.nodePort)
		}
		if ss.lbIP != "" {
			addr += ", LoadBalancer IP " + ss.lbIP
		}
		fmt.Fprintf(&b, "  %-13s endpoints %-12s %s\n", ss.name, joinPods(ss.pods), addr)
	}

	sluiceBin := filepath.Join(s.opts.RunDir, "bin", "sluice")
	server := func(n *topology.Node) string {
		return fmt.Sprintf("http://%s", netip.AddrPortFrom(n.APIAddress, metricsPort))
	}
	b.WriteString("\nWhere to look (paste into this machine's shell; each node's metrics and health answer on its API link,\n" +
		"its state page only over the node's loopback, so status and explain run inside the node):\n")
	for _, n := range s.topo.Nodes {
		fmt.Fprintf(&b, "  %-16s %s/metrics  http://%s/healthz\n", n.Name+":", server(n), netip.AddrPortFrom(n.APIAddress, healthzPort))
	}
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s status    # the default --server 127.0.0.1:%d\n", "sluice status:", nodeA.NetNS, sluiceBin, metricsPort)
	fmt.Fprintf(&b, "  %-16s ip netns exec %s curl -s 127.0.0.1:%d/debug/sluice/state\n", "the state page:", nodeB.NetNS, metricsPort)
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s explain %s 192.0.2.11:80\n", "sluice explain:", nodeA.NetNS, sluiceBin, ext.IPv4)
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s explain %s %s:30082\n", "", nodeB.NetNS, sluiceBin, ext.IPv4, nodeB.IPv4)
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s explain demo/web-local\n", "", nodeA.NetNS, sluiceBin)
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s\n", "the rules:", nodeA.NetNS, s.rulesCommand())
	if name, port := healthCheckNodePort(s.svcs); port != 0 {
		for i, n := range s.topo.Nodes {
			label := ""
			if i == 0 {
				label = "health checks:"
			}
			fmt.Fprintf(&b, "  %-16s ip netns exec %s curl -si http://%s:%d/    # %s/%s on %s\n", label, ext.NetNS, n.IPv4, port, Namespace, name, n.Name)
		}
	}
	fmt.Fprintf(&b, "  %-16s ip netns exec %s %s probe -proto tcp -target 192.0.2.10:80 -count 5\n", "your own client:", ext.NetNS, filepath.Join(s.opts.RunDir, "bin", "echoserver"))
	fmt.Fprintf(&b, "  %-16s ip netns exec %s bash    # a shell in pod a0\n", "", s.topo.Pod("a0").NetNS)
	fmt.Fprintf(&b, "  %-16s %s/    (sluice-node-a.log, sluice-node-b.log, echo-*.log, controlplane/)\n", "logs:", filepath.Join(s.opts.RunDir, "logs"))
	fmt.Fprintf(&b, "  %-16s export KUBECONFIG=%s; kubectl -n demo get services,endpointslices\n", "admin access:", s.kubeconfig)
	fmt.Fprintf(&b, "  %-16s (no kubelet or controllers run: change endpoints by editing the EndpointSlices)\n", "")
	_, err := io.WriteString(w, b.String())
	return err
}

// rulesCommand is the command that lists sluice's rules in the node, in its mode (and, in
// iptables mode, the flavour sluice chose, which its log names).
func (s *Sandbox) rulesCommand() string {
	switch s.opts.Mode {
	case "nftables":
		return "nft list table ip kube-proxy"
	case "ipvs":
		return "ipvsadm -Ln"
	}
	if p := s.sluice["node-a"]; p != nil {
		if log, err := os.ReadFile(p.LogPath); err == nil {
			for _, line := range strings.Split(string(log), "\n") {
				if strings.Contains(line, `"Using iptables"`) && strings.Contains(line, `flavour="legacy"`) {
					return "iptables-legacy-save -t nat"
				}
			}
		}
	}
	return "iptables-nft-save -t nat"
}

// Close tears everything down (processes, control plane, namespaces, links, the run
// directory) and checks that nothing is left. It is safe to call more than once.
func (s *Sandbox) Close() error {
	if s == nil || s.tb == nil {
		return nil
	}
	var errs []error
	if n := s.tb.runCleanups(); n > 0 {
		errs = append(errs, fmt.Errorf("%d error(s) while tearing down (printed above)", n))
	}
	if err := os.RemoveAll(s.opts.RunDir); err != nil {
		errs = append(errs, err)
	}
	if left := Leftovers(s.state); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still present after tear-down: %s", strings.Join(left, ", ")))
	}
	s.tb = nil
	return errors.Join(errs...)
}

// SluiceLogTails returns the last lines of each sluice log (for a failed run).
func (s *Sandbox) SluiceLogTails(n int) string {
	var b strings.Builder
	for name, p := range s.sluice {
		fmt.Fprintf(&b, "--- last lines of sluice on %s (%s):\n%s\n", name, p.LogPath, p.Tail(n))
	}
	return b.String()
}

// checkUniqueAddress fails when the API bridge's address is on another interface of this
// namespace too: test/topology picks a free 169.254.N.0/24 by looking, and a run started at
// the same moment (another sandbox, a conformance run in this namespace) may pick the same.
func checkUniqueAddress(a netip.Addr) error {
	out, err := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	if err != nil {
		return fmt.Errorf("ip addr show: %w", err)
	}
	n := strings.Count(string(out), " "+a.String()+"/")
	if n > 1 {
		return fmt.Errorf("%s is on %d interfaces: another run picked the same link-local subnet at the same moment; start again", a, n)
	}
	return nil
}

func prefixes(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Addr().String())
	}
	return strings.Join(out, " and ")
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}
