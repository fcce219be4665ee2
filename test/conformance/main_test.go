//go:build conformance

package conformance

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

var (
	backendFlag = flag.String("backend", "", "backend under test when -proxies is not given: iptables, nftables or ipvs (default $SLUICE_BACKEND, else iptables)")
	proxiesFlag = flag.String("proxies", os.Getenv("SLUICE_CONFORMANCE_PROXIES"),
		"proxies under test, each in a cluster of its own sharing one control plane: a comma-separated list of <proxy>/<mode>, "+
			"proxy sluice ($SLUICE_BIN) or kube-proxy ($KUBE_PROXY_BIN, upstream), e.g. sluice/iptables,kube-proxy/iptables (default sluice/<backend>)")
	resultsFlag = flag.String("results", os.Getenv("SLUICE_CONFORMANCE_RESULTS"),
		"directory to write each proxy's results to, as <proxy>-<mode>.json, for go run ./test/conformance/checkresults")
)

// The capability table (generated from the runs) and the declared differences from
// upstream, read by every check that depends on them.
var (
	//go:embed capabilities.json
	capabilitiesJSON []byte
	//go:embed differences.yaml
	differencesYAML []byte
)

// backend is the mode under test when -proxies is not given, from -backend or
// $SLUICE_BACKEND.
func backend() string {
	if *backendFlag != "" {
		return *backendFlag
	}
	if b := os.Getenv("SLUICE_BACKEND"); b != "" {
		return b
	}
	return "iptables"
}

// TestMain prepares the binaries outside any namespace (building needs the module cache and
// possibly the module proxy), then re-executes the tests in a private network namespace
// (netnstest.Main): that namespace plays the root namespace, holding the apiserver and the
// bridge the nodes reach it on, so nothing the suite does can touch the machine's own
// namespace.
func TestMain(m *testing.M) {
	flag.Parse()
	// The proxies under test inherit this. DeletesMissedInAWatchGap freezes proxies for as
	// long as an apiserver restart takes (over a minute on a busy machine); client-go's
	// HTTP/2 health check (a ping after 30 s without a frame, 15 s to answer) would then
	// declare the connection lost the moment the process thaws, and the informer would
	// relist without ever resuming its watch, so whether the case saw the 410 Gone path
	// it is about would depend on the restart's duration. The check still runs, later
	// than any freeze lasts.
	if os.Getenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS") == "" {
		if err := os.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "600"); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(1)
		}
	}
	if !netnstest.InNetns() {
		if err := prepareBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(1)
		}
	}
	netnstest.Main(m)
}

// prepareBinaries makes sure $SLUICE_BIN, $SLUICE_ECHOSERVER, $KUBE_APISERVER and $ETCD (and
// $KUBE_PROXY_BIN when -proxies names kube-proxy) name usable binaries, building what is
// missing, so the re-executed test process inherits them.
func prepareBinaries() error {
	dir := filepath.Join(os.TempDir(), "sluice-conformance-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, b := range []struct{ env, pkg, name string }{
		{"SLUICE_BIN", "github.com/sluiceproxy/sluice/cmd/sluice", "sluice"},
		{"SLUICE_ECHOSERVER", "github.com/sluiceproxy/sluice/test/echoserver", "echoserver"},
	} {
		if p := os.Getenv(b.env); p != "" {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("$%s: %w", b.env, err)
			}
			continue
		}
		// Built under a private name and renamed into place: a concurrent run keeps
		// executing the file it started with.
		out := filepath.Join(dir, b.name)
		tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp) // the build error is the one to report
			return fmt.Errorf("building %s (set $%s to use a prebuilt one): %w\n%s", b.pkg, b.env, err, msg)
		}
		if err := os.Rename(tmp, out); err != nil {
			return err
		}
		if err := os.Setenv(b.env, out); err != nil {
			return err
		}
	}
	if strings.Contains(*proxiesFlag, "kube-proxy/") {
		if p := os.Getenv("KUBE_PROXY_BIN"); p != "" {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("$KUBE_PROXY_BIN: %w", err)
			}
		} else {
			// Upstream kube-proxy, built once from the Go module proxy and cached.
			out, err := exec.Command("hack/kube-proxy-reference.sh").Output()
			if err != nil {
				// Tests run in the package directory; the script is at the module root.
				out, err = exec.Command("../../hack/kube-proxy-reference.sh").Output()
			}
			if err != nil {
				return fmt.Errorf("building upstream kube-proxy with hack/kube-proxy-reference.sh (or set $KUBE_PROXY_BIN): %w", err)
			}
			if err := os.Setenv("KUBE_PROXY_BIN", strings.TrimSpace(string(out))); err != nil {
				return fmt.Errorf("setting KUBE_PROXY_BIN: %w", err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bins, err := controlplane.FindBinaries(ctx)
	if err != nil {
		return err
	}
	if err := os.Setenv("KUBE_APISERVER", bins.KubeAPIServer); err != nil {
		return err
	}
	return os.Setenv("ETCD", bins.Etcd)
}
