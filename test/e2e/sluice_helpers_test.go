//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

// sluiceProcess is sluice running as a separate process against a control plane, with the
// recording backend: it programs nothing and serves the desired state on app.StatePath.
type sluiceProcess struct {
	cmd         *exec.Cmd
	metricsAddr string
	healthzAddr string
	logPath     string
	exited      chan error
}

func sluiceBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_BIN"); p != "" {
		return p
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

// startSluice runs sluice in recording mode for node, with a config file holding extra
// (a YAML fragment of KubeProxyConfiguration fields, may be empty), and stops it at the
// end of the test. Its log is printed when the test fails.
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
iptables:
  minSyncPeriod: 100ms
%s`, cp.ProxyKubeconfig(), node, p.metricsAddr, p.healthzAddr, extra)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{"--config", cfgPath, "--backend", "recording", "-v", "2"}, args...)
	p.cmd = exec.Command(sluiceBinary(t), all...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting sluice: %v", err)
	}
	go func() { p.exited <- p.cmd.Wait(); logFile.Close() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(p.logPath); err == nil {
				t.Logf("sluice log:\n%s", b)
			}
		}
	})
	return p
}

// state fetches the daemon's current status report.
func (p *sluiceProcess) state(ctx context.Context) (*app.StatusReport, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+app.StatePath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	var r app.StatusReport
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", body, err)
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
	for time.Now().Before(deadline) {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("sluice exited while waiting for %s: %v", what, err)
		default:
		}
		r, err := p.state(t.Context())
		if err == nil {
			last = r
			if cond(r) {
				return r
			}
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	t.Fatalf("timed out after %v waiting for %s; last error %v; last state:\n%s", timeout, what, lastErr, b)
	return nil
}
