//go:build rollout

package rollout

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// TestMain finds or builds the binaries outside any namespace (building may need the
// module proxy), exports them for the re-executed process ($SLUICE_BIN,
// $SLUICE_ECHOSERVER, $KUBE_APISERVER, $ETCD), then re-executes the tests in a private
// network namespace that plays the machine's: the apiserver and the bridge the node
// reaches it on live there.
func TestMain(m *testing.M) {
	if !netnstest.InNetns() {
		if err := prepareBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, "rollout:", err)
			os.Exit(1)
		}
	}
	netnstest.Main(m)
}

func prepareBinaries() error {
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
		path, err := goBuild(b.pkg, b.name)
		if err != nil {
			return fmt.Errorf("%w (or set $%s to a prebuilt one)", err, b.env)
		}
		os.Setenv(b.env, path)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bins, err := controlplane.FindBinaries(ctx)
	if err != nil {
		return err
	}
	os.Setenv("KUBE_APISERVER", bins.KubeAPIServer)
	os.Setenv("ETCD", bins.Etcd)
	return nil
}

// goBuild builds pkg (static) into a shared directory, under a name private to this process
// first and renamed into place, so that a concurrent run keeps executing the file it
// started with.
func goBuild(pkg, name string) (string, error) {
	dir := filepath.Join(os.TempDir(), "sluice-rollout-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, msg)
	}
	return out, os.Rename(tmp, out)
}
