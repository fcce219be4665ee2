package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// Options configure a control plane. The zero value is a single-stack IPv4 control plane
// on 127.0.0.1.
type Options struct {
	// BindAddress is the address kube-apiserver listens on, advertises, and is reached at
	// (URL). Default 127.0.0.1. It must be assigned to an interface of the network
	// namespace the test runs in: the conformance suite passes a link-local address on a
	// bridge it creates, so node network namespaces can reach the apiserver.
	BindAddress string
	// ServiceCIDRs are kube-apiserver's --service-cluster-ip-range: one range, or an
	// IPv4/IPv6 pair for dual-stack (DualStackServiceCIDRs). Default [DefaultServiceCIDR].
	ServiceCIDRs []string
	// ExtraAPIServerFlags are added to kube-apiserver's command line, each "--name=value"
	// or "--name". A flag the framework sets itself is replaced, not repeated.
	ExtraAPIServerFlags []string
	// LogDir receives etcd.log and kube-apiserver.log (stdout and stderr of each, a
	// restarted apiserver appending to its file) and keeps them after Stop; give each
	// control plane its own. Default: a directory inside the control plane's temporary
	// directory, removed by Stop.
	LogDir string
	// ReadyTimeout bounds each wait for a process to become ready (etcd, then
	// kube-apiserver, at Start and at StartAPIServer). Default 90s, which leaves room for a
	// busy 2-core CI machine; a start usually takes a few seconds.
	ReadyTimeout time.Duration
	// Binaries overrides the kube-apiserver and etcd to run; empty fields are found by
	// FindBinaries.
	Binaries Binaries
}

// Timings are how long the control plane took to come up.
type Timings struct {
	// Etcd is from starting etcd to its /health answering true.
	Etcd time.Duration
	// APIServer is from starting kube-apiserver to it being ready (/readyz ok and the
	// bootstrap objects in place), for the latest start (Start, StartAPIServer or
	// RestartAPIServer).
	APIServer time.Duration
	// Start is the whole of Start: certificates, both processes, and the wait for the
	// bootstrap objects.
	Start time.Duration
}

// ControlPlane is a running etcd and kube-apiserver. Its methods are safe for concurrent
// use.
type ControlPlane struct {
	cfg      config
	binaries Binaries
	timeout  time.Duration

	dir    string // temporary directory with certificates, kubeconfigs, etcd data
	logDir string

	ca       *certAuthority
	files    apiServerFiles
	port     int
	url      string
	etcdURL  string
	adminCfg *rest.Config
	admin    kubernetes.Interface
	proxyCfg *rest.Config

	adminKubeconfig string
	proxyKubeconfig string

	// opMu serialises the operations that start and stop processes, so that accessors,
	// which take only mu, do not wait for a start-up.
	opMu sync.Mutex

	mu            sync.Mutex // guards the fields below
	etcd          *process
	apiserver     *process // nil while stopped
	timings       Timings
	kubeconfigSeq int
	stopped       bool
}

// Start runs etcd and kube-apiserver and returns once the apiserver is ready: /readyz
// answers ok, the "default" and "kube-system" Namespaces and the "kubernetes" Service
// exist, and the "kubernetes" ServiceCIDR is ready, so Services can be created at once. ctx bounds the start only; the processes run until
// Stop. On error nothing is left running.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	started := time.Now()
	cfg, err := newConfig(o)
	if err != nil {
		return nil, fmt.Errorf("control plane options: %w", err)
	}
	binaries := o.Binaries
	if binaries.KubeAPIServer == "" || binaries.Etcd == "" {
		found, err := FindBinaries(ctx)
		if err != nil {
			return nil, fmt.Errorf("finding control plane binaries: %w", err)
		}
		if binaries.KubeAPIServer == "" {
			binaries.KubeAPIServer = found.KubeAPIServer
		}
		if binaries.Etcd == "" {
			binaries.Etcd = found.Etcd
		}
	}
	if err := binaries.check(); err != nil {
		return nil, err
	}
	cp := &ControlPlane{cfg: cfg, binaries: binaries, timeout: o.ReadyTimeout}
	if cp.timeout <= 0 {
		cp.timeout = 90 * time.Second
	}
	if err := cp.start(ctx, o.LogDir); err != nil {
		if stopErr := cp.Stop(); stopErr != nil {
			err = fmt.Errorf("%w (and cleaning up: %w)", err, stopErr)
		}
		return nil, err
	}
	cp.mu.Lock()
	cp.timings.Start = time.Since(started)
	cp.mu.Unlock()
	klog.FromContext(ctx).V(1).Info("Control plane ready", "url", cp.url, "dir", cp.dir, "elapsed", cp.Timings().Start.Seconds())
	return cp, nil
}

func (cp *ControlPlane) start(ctx context.Context, logDir string) error {
	dir, err := os.MkdirTemp("", "sluice-controlplane-")
	if err != nil {
		return fmt.Errorf("creating control plane directory: %w", err)
	}
	cp.dir = dir
	cp.logDir = logDir
	if cp.logDir == "" {
		cp.logDir = filepath.Join(dir, "logs")
	}
	if err := os.MkdirAll(cp.logDir, 0o755); err != nil {
		return fmt.Errorf("creating log directory: %w", err)
	}
	if err := cp.writePKI(); err != nil {
		return err
	}
	if err := cp.startEtcd(ctx); err != nil {
		return err
	}

	// A port picked as free can be taken before kube-apiserver binds it (by a parallel
	// test doing the same); try another.
	for attempt := 1; ; attempt++ {
		cp.port, err = freePort(cp.cfg.bindAddress.String())
		if err != nil {
			return err
		}
		cp.url = "https://" + net.JoinHostPort(cp.cfg.bindAddress.String(), strconv.Itoa(cp.port))
		if err := cp.makeClients(); err != nil {
			return err
		}
		err = cp.StartAPIServer(ctx)
		if !errors.Is(err, errAddressInUse) || attempt == 3 {
			break
		}
	}
	if err != nil {
		return err
	}

	cp.adminKubeconfig = filepath.Join(cp.dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.adminKubeconfig, AdminUser, cp.adminCfg); err != nil {
		return err
	}
	cp.proxyKubeconfig = filepath.Join(cp.dir, "kube-proxy.kubeconfig")
	if err := writeKubeconfig(cp.proxyKubeconfig, ProxyUser, cp.proxyCfg); err != nil {
		return err
	}
	return cp.ensureProxierBinding(ctx)
}

// writePKI creates the CA, kube-apiserver's serving certificate and the service-account
// key pair, as files kube-apiserver reads.
func (cp *ControlPlane) writePKI() error {
	now := time.Now()
	ca, err := newCertAuthority("sluice-e2e-ca", now)
	if err != nil {
		return err
	}
	cp.ca = ca
	ips, dnsNames := servingCertSANs(cp.cfg)
	serving, err := ca.issue(certRequest{commonName: "kube-apiserver", ips: ips, dnsNames: dnsNames, server: true}, now)
	if err != nil {
		return err
	}
	saKey, saPub, err := serviceAccountKeys()
	if err != nil {
		return err
	}
	pki := filepath.Join(cp.dir, "pki")
	cp.files = apiServerFiles{
		caCert:            filepath.Join(pki, "ca.crt"),
		servingCert:       filepath.Join(pki, "apiserver.crt"),
		servingKey:        filepath.Join(pki, "apiserver.key"),
		serviceAccountKey: filepath.Join(pki, "sa.key"),
		serviceAccountPub: filepath.Join(pki, "sa.pub"),
		certDir:           filepath.Join(cp.dir, "apiserver-cert-dir"),
	}
	for _, d := range []string{pki, cp.files.certDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	for path, data := range map[string][]byte{
		cp.files.caCert:            ca.certPEM,
		cp.files.servingCert:       serving.certPEM,
		cp.files.servingKey:        serving.keyPEM,
		cp.files.serviceAccountKey: saKey,
		cp.files.serviceAccountPub: saPub,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}

// makeClients issues the admin and proxy client certificates for the current URL.
func (cp *ControlPlane) makeClients() error {
	adminCfg, err := cp.RESTConfigFor(AdminUser, groupMasters)
	if err != nil {
		return err
	}
	adminCfg.QPS, adminCfg.Burst = clientQPS, clientBurst
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	proxyCfg, err := cp.RESTConfigFor(ProxyUser)
	if err != nil {
		return err
	}
	cp.adminCfg, cp.admin, cp.proxyCfg = adminCfg, admin, proxyCfg
	return nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	logPath := filepath.Join(cp.logDir, "etcd.log")
	dataDir := filepath.Join(cp.dir, "etcd-data")
	for attempt := 1; ; attempt++ {
		clientPort, err := freePort("127.0.0.1")
		if err != nil {
			return err
		}
		peerPort, err := freePort("127.0.0.1")
		if err != nil {
			return err
		}
		if err := os.RemoveAll(dataDir); err != nil { // a failed attempt's leftovers
			return fmt.Errorf("clearing etcd data directory: %w", err)
		}
		started := time.Now()
		p, err := startProcess("etcd", cp.binaries.Etcd, etcdArgs(dataDir, clientPort, peerPort), logPath)
		if err != nil {
			return err
		}
		etcdURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))
		err = waitReady(ctx, p, cp.timeout, etcdURL+"/health", http.DefaultClient, func(code int, body string) bool {
			return code == http.StatusOK && strings.Contains(body, `"health":"true"`)
		})
		if err == nil {
			cp.mu.Lock()
			cp.etcd, cp.etcdURL, cp.timings.Etcd = p, etcdURL, time.Since(started)
			cp.mu.Unlock()
			klog.FromContext(ctx).V(2).Info("Started etcd", "url", etcdURL, "elapsed", time.Since(started).Seconds())
			return nil
		}
		_ = p.stop(time.Second)
		if !errors.Is(err, errAddressInUse) || attempt == 3 {
			return err
		}
	}
}

// StartAPIServer starts kube-apiserver after StopAPIServer, on the same address and port
// with the same certificates, and waits until it is ready. Clients and kubeconfigs made
// before keep working.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.opMu.Lock()
	defer cp.opMu.Unlock()
	cp.mu.Lock()
	stopped, running := cp.stopped, cp.apiserver != nil
	cp.mu.Unlock()
	if stopped {
		return errors.New("control plane is stopped")
	}
	if running {
		return errors.New("kube-apiserver is already running")
	}
	args := apiServerArgs(cp.cfg, cp.port, cp.etcdURL, cp.files)
	logPath := filepath.Join(cp.logDir, "kube-apiserver.log")
	started := time.Now()
	p, err := startProcess("kube-apiserver", cp.binaries.KubeAPIServer, args, logPath)
	if err != nil {
		return err
	}
	httpClient, err := rest.HTTPClientFor(cp.adminCfg)
	if err != nil {
		_ = p.stop(time.Second)
		return fmt.Errorf("admin HTTP client: %w", err)
	}
	defer httpClient.CloseIdleConnections()
	err = waitReady(ctx, p, cp.timeout, cp.url+"/readyz", httpClient, func(code int, _ string) bool {
		return code == http.StatusOK
	})
	if err == nil {
		err = cp.waitBootstrapObjects(ctx, p)
	}
	if err != nil {
		_ = p.stop(5 * time.Second)
		return err
	}
	elapsed := time.Since(started)
	cp.mu.Lock()
	cp.apiserver = p
	cp.timings.APIServer = elapsed
	cp.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Started kube-apiserver", "url", cp.url, "elapsed", elapsed.Seconds())
	return nil
}

// apiServerStopGrace is how long kube-apiserver gets to shut down gracefully (closing
// watches, as in a real restart) before it is killed.
const apiServerStopGrace = 20 * time.Second

// StopAPIServer stops kube-apiserver gracefully (SIGTERM), leaving etcd running. It
// returns an error if the apiserver had died on its own. Stopping a stopped apiserver
// does nothing.
func (cp *ControlPlane) StopAPIServer() error {
	cp.opMu.Lock()
	defer cp.opMu.Unlock()
	cp.mu.Lock()
	p := cp.apiserver
	cp.apiserver = nil
	cp.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.stop(apiServerStopGrace); err != nil {
		return fmt.Errorf("%w; last lines of %s:\n%s", err, p.logPath, p.logTail(20))
	}
	return nil
}

// RestartAPIServer stops kube-apiserver and starts it again on the same port with the
// same certificates; etcd and its data stay. Use it to test that sluice reconnects.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	if err := cp.StopAPIServer(); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	return nil
}

// Stop kills kube-apiserver and etcd (with their process groups) and removes the
// temporary directory; logs survive only in an Options.LogDir. It reports a process that
// had died on its own. Calling it again does nothing.
func (cp *ControlPlane) Stop() error {
	cp.opMu.Lock()
	defer cp.opMu.Unlock()
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	apiserver, etcd := cp.apiserver, cp.etcd
	cp.apiserver, cp.etcd = nil, nil
	cp.mu.Unlock()

	var errs []error
	// The apiserver first: with etcd gone it would spend its grace period retrying.
	if apiserver != nil {
		if err := apiserver.stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%w; last lines of %s:\n%s", err, apiserver.logPath, apiserver.logTail(20)))
		}
	}
	if etcd != nil {
		if err := etcd.stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%w; last lines of %s:\n%s", err, etcd.logPath, etcd.logTail(20)))
		}
	}
	if cp.dir != "" {
		if err := os.RemoveAll(cp.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", cp.dir, err))
		}
	}
	return errors.Join(errs...)
}

// waitReady polls url until ready accepts the answer, the process exits, or timeout.
// Errors carry the last answer and the tail of the process's log.
func waitReady(ctx context.Context, p *process, timeout time.Duration, url string, client *http.Client, ready func(code int, body string) bool) error {
	started := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string // the last answer (each round sets it before it is read)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if code, body, err := get(ctx, client, url); err != nil {
			last = err.Error()
		} else if ready(code, body) {
			return nil
		} else {
			last = fmt.Sprintf("HTTP %d: %s", code, strings.TrimSpace(body))
		}
		select {
		case <-p.exited:
			if p.logContains("address already in use") {
				return fmt.Errorf("%s: %w", p.name, errAddressInUse)
			}
			return fmt.Errorf("%w during start-up; last lines of %s:\n%s", p.exitError(), p.logPath, p.logTail(30))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s (%w); last answer from %s: %s\nlast lines of %s:\n%s",
				p.name, time.Since(started).Round(time.Millisecond), context.Cause(ctx), url, truncate(last, 2000), p.logPath, p.logTail(30))
		case <-tick.C:
		}
	}
}

func get(ctx context.Context, client *http.Client, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// waitBootstrapObjects waits for what kube-apiserver's controllers create only after
// /readyz passes: the "default" and "kube-system" Namespaces, the "kubernetes" Service
// (which every proxy sees), and the "kubernetes" ServiceCIDR being ready (until then,
// creating a Service fails to allocate a ClusterIP).
func (cp *ControlPlane) waitBootstrapObjects(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, cp.timeout)
	defer cancel()
	missing := func() string {
		for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespaceSystem} {
			if _, err := cp.admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
				return fmt.Sprintf("namespace %s: %v", ns, err)
			}
		}
		if _, err := cp.admin.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			return fmt.Sprintf("service default/kubernetes: %v", err)
		}
		cidr, err := cp.admin.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return fmt.Sprintf("servicecidr kubernetes: %v", err)
		}
		if !conditionTrue(cidr.Status.Conditions, "Ready") {
			return fmt.Sprintf("servicecidr kubernetes not ready: %v", cidr.Status.Conditions)
		}
		return ""
	}
	for {
		last := missing()
		if last == "" {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w after /readyz passed; last lines of %s:\n%s", p.exitError(), p.logPath, p.logTail(30))
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver bootstrap objects missing (%w): %s", context.Cause(ctx), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func conditionTrue(conds []metav1.Condition, typ string) bool {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// ensureProxierBinding makes sure ProxyUser is bound to ProxierClusterRole. Upstream's
// bootstrap policy has carried this binding since RBAC was introduced, and 1.37 still
// does; creating it is a fallback for a kube-apiserver that does not. Nothing else is
// granted.
func (cp *ControlPlane) ensureProxierBinding(ctx context.Context) error {
	crbs := cp.admin.RbacV1().ClusterRoleBindings()
	_, err := crbs.Get(ctx, ProxierClusterRole, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading ClusterRoleBinding %s: %w", ProxierClusterRole, err)
	}
	_, err = crbs.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ProxierClusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ProxierClusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ProxyUser}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", ProxierClusterRole, err)
	}
	return nil
}

// freePort returns a TCP port nobody listens on at host right now.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL is kube-apiserver's address, https://BindAddress:port.
func (cp *ControlPlane) URL() string { return cp.url }

// EtcdURL is etcd's client address, on loopback.
func (cp *ControlPlane) EtcdURL() string { return cp.etcdURL }

// Dir is the temporary directory with certificates, kubeconfigs and etcd's data; Stop
// removes it.
func (cp *ControlPlane) Dir() string { return cp.dir }

// LogDir holds etcd.log and kube-apiserver.log.
func (cp *ControlPlane) LogDir() string { return cp.logDir }

// APIServerLog is the path of kube-apiserver's log (stdout and stderr, every start).
func (cp *ControlPlane) APIServerLog() string { return filepath.Join(cp.logDir, "kube-apiserver.log") }

// EtcdLog is the path of etcd's log.
func (cp *ControlPlane) EtcdLog() string { return filepath.Join(cp.logDir, "etcd.log") }

// CAFile is the PEM file of the CA that signed every certificate of this control plane.
func (cp *ControlPlane) CAFile() string { return cp.files.caCert }

// ServiceCIDRs are the Service ranges kube-apiserver allocates ClusterIPs from.
func (cp *ControlPlane) ServiceCIDRs() []string {
	out := make([]string, len(cp.cfg.serviceCIDRs))
	for i, p := range cp.cfg.serviceCIDRs {
		out[i] = p.String()
	}
	return out
}

// AdminKubeconfig is the path of a kubeconfig for AdminUser (group system:masters).
func (cp *ControlPlane) AdminKubeconfig() string { return cp.adminKubeconfig }

// ProxyKubeconfig is the path of a kubeconfig for ProxyUser, the identity sluice runs as.
func (cp *ControlPlane) ProxyKubeconfig() string { return cp.proxyKubeconfig }

// AdminRESTConfig returns a copy of the admin client configuration.
func (cp *ControlPlane) AdminRESTConfig() *rest.Config { return rest.CopyConfig(cp.adminCfg) }

// ProxyRESTConfig returns a copy of ProxyUser's client configuration.
func (cp *ControlPlane) ProxyRESTConfig() *rest.Config { return rest.CopyConfig(cp.proxyCfg) }

// AdminClient is a clientset for AdminUser, without client-side rate limiting to speak of.
func (cp *ControlPlane) AdminClient() kubernetes.Interface { return cp.admin }

// Timings reports how long the start-up took.
func (cp *ControlPlane) Timings() Timings {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.timings
}

// APIServerRunning reports whether kube-apiserver is running (it is not between
// StopAPIServer and StartAPIServer, or after it died).
func (cp *ControlPlane) APIServerRunning() bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.apiserver != nil && !cp.apiserver.hasExited()
}
