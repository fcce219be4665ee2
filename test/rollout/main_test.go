//go:build e2e

package rollout

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

// TestMain checks the binaries outside any namespace (finding the control plane's may need
// to build it, which needs the module proxy), exports them for the re-executed process
// ($KUBE_APISERVER, $ETCD), then re-executes the tests in a private network namespace that
// plays the machine's: the apiserver and the bridge the node reaches it on live there.
//
// $SLUICE_BIN is the sluice under test: make test-e2e (hack/test-e2e.sh) builds
// bin/sluice and sets it. The echo server is $SLUICE_ECHOSERVER, or built by
// topology.EchoServerBinary.
func TestMain(m *testing.M) {
	if !netnstest.InNetns() {
		if err := checkBinaries(); err != nil {
			fmt.Fprintln(os.Stderr, "rollout:", err)
			os.Exit(1)
		}
	}
	netnstest.Main(m)
}

func checkBinaries() error {
	bin := os.Getenv("SLUICE_BIN")
	if bin == "" {
		return fmt.Errorf("$SLUICE_BIN is not set: run make test-e2e (or hack/test-e2e.sh), or set it to a sluice binary (make build: bin/sluice)")
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("$SLUICE_BIN: %w", err)
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
