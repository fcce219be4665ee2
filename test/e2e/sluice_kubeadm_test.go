//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/framework/reexec"
	"github.com/sluiceproxy/sluice/test/require"
)

const (
	envInKubeadmNamespaces = "SLUICE_E2E_KUBEADM_NAMESPACES"
	// kubeadmNodeName is the hostname of the private UTS namespace: the fixture has no
	// hostnameOverride, so sluice takes the node's name from the hostname.
	kubeadmNodeName = "kubeadm-e2e-node"
	// kubeadmKubeconfig is where the fixture (as kubeadm's kube-proxy ConfigMap) expects
	// the kubeconfig.
	kubeadmKubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
)

// TestSluiceStartsWithKubeadmConfig runs sluice with the KubeProxyConfiguration kubeadm
// writes (pkg/config/testdata/kubeadm-kube-proxy.yaml), unchanged and with no other flag:
// its kubeconfig path under /var/lib/kube-proxy, its default ports (healthz 0.0.0.0:10256,
// metrics 127.0.0.1:10249), its node name from the hostname, and mode iptables with the
// real iptables backend.
//
// None of that may touch the machine: the test re-runs itself in private network, mount
// and UTS namespaces (unshare), where the control plane listens on the namespace's own
// loopback, a tmpfs provides /var/lib/kube-proxy, the hostname is the node's, and the
// iptables rules sluice writes live and die with the namespace.
func TestSluiceStartsWithKubeadmConfig(t *testing.T) {
	fixture, err := filepath.Abs("../../pkg/config/testdata/kubeadm-kube-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(envInKubeadmNamespaces) == "" {
		require.Feature(t, require.Root, os.Geteuid() == 0, "needs root to create network and mount namespaces")
		// Resolved here, so that the child builds nothing inside its namespaces.
		bins, err := controlplane.FindBinaries(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		reexec.Run(t, []string{"unshare", "--net", "--mount", "--uts", "--propagation", "private", "--"},
			[]string{envInKubeadmNamespaces + "=1", "KUBE_APISERVER=" + bins.KubeAPIServer, "ETCD=" + bins.Etcd, "SLUICE_BIN=" + sluiceBinary(t)},
			"-test.timeout=3m")
		return
	}

	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	if err := syscall.Sethostname([]byte(kubeadmNodeName)); err != nil {
		t.Fatalf("setting the hostname: %v", err)
	}
	provideKubeconfigDir(t)

	cp := controlplane.StartForTest(t, controlplane.Options{})
	c := cp.AdminClient()
	createNode(t, c, kubeadmNodeName, "192.0.2.10")
	kubeconfig, err := os.ReadFile(cp.ProxyKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubeadmKubeconfig, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	p := &sluiceProcess{
		metricsAddr: "127.0.0.1:10249",
		healthzAddr: "127.0.0.1:10256",
		logPath:     filepath.Join(t.TempDir(), "sluice.log"),
		exited:      make(chan error, 1),
	}
	p.start(t, exec.Command(sluiceBinary(t), "--config", fixture))

	waitForHTTP(t, "healthy", "http://"+p.healthzAddr+"/healthz", 60*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
	a := waitForHTTP(t, "the mode", "http://"+p.metricsAddr+"/proxyMode", 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
	if string(a.body) != "iptables" {
		t.Errorf("/proxyMode: %q, want iptables", a.body)
	}
	a = waitForHTTP(t, "the configuration", "http://"+p.metricsAddr+"/configz", 10*time.Second, func(a *httpAnswer) bool { return a.code == http.StatusOK })
	if !strings.Contains(string(a.body), kubeadmKubeconfig) {
		t.Errorf("/configz does not name %s:\n%s", kubeadmKubeconfig, a.body)
	}

	ns := newNamespace(t, c, "kubeadm")
	svc := createService(t, c, clusterIPService(ns, "web"))
	createSlice(t, c, endpointSlice(ns, "web", "web-1", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{tcpPort("http", 8080)}, readyEndpoint("10.244.0.5", kubeadmNodeName)))
	r := p.waitFor(t, "the Service to be programmed", 60*time.Second, func(r *app.StatusReport) bool {
		v := v4(ns, "web", "http").find(r)
		f := familyReport(r, model.IPv4)
		return v != nil && len(v.ClusterEndpoints) == 1 && f.Status.LastError == "" && len(f.Status.Failed) == 0 &&
			f.Status.LastSuccess.After(time.Now().Add(-time.Minute))
	})
	if r.Node != kubeadmNodeName || r.Backend != "iptables" {
		t.Errorf("node %q, backend %q; want %q and the real iptables backend", r.Node, r.Backend, kubeadmNodeName)
	}
	if v := v4(ns, "web", "http").find(r); !v.ClusterEndpoints[0].Local {
		t.Errorf("the endpoint on %s is not local: %+v", kubeadmNodeName, v.ClusterEndpoints[0])
	}

	// The rules are in this namespace's kernel, whichever iptables flavour sluice chose.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dumps []string
		for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
			out, err := exec.Command(save, "-t", "nat").CombinedOutput()
			if err == nil && strings.Contains(string(out), svc.Spec.ClusterIP) && strings.Contains(string(out), "10.244.0.5:8080") {
				return
			}
			dumps = append(dumps, fmt.Sprintf("%s (err %v):\n%s", save, err, out))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no nat rule for %s → 10.244.0.5:8080 after 30s:\n%s", svc.Spec.ClusterIP, strings.Join(dumps, "\n"))
		}
		time.Sleep(pollInterval)
	}
}

// provideKubeconfigDir mounts a tmpfs where the fixture's kubeconfig lives. The test runs
// in a private mount namespace, so the host never sees it. When /var/lib/kube-proxy does
// not exist, the tmpfs goes on /var/lib instead (sluice reads nothing else there).
func provideKubeconfigDir(t *testing.T) {
	t.Helper()
	dir := filepath.Dir(kubeadmKubeconfig)
	target := dir
	if _, err := os.Stat(dir); err != nil {
		target = filepath.Dir(dir)
	}
	if err := syscall.Mount("tmpfs", target, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", target, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
