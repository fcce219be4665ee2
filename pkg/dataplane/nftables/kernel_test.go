//go:build kernel

package nftables

// Kernel tests run as root, each package run in a private network namespace
// (netnstest.Main). Tests that need a clean table delete it first (resetTable); tests
// that send packets build "pod" and "client" namespaces joined to the test's namespace
// (the node) by veth pairs (see topology in traffic_test.go).

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/netnstest"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

// resetTable removes both families' tables so that a test starts from nothing.
func resetTable(t testing.TB) {
	t.Helper()
	for _, f := range model.Families {
		if err := Cleanup(context.Background(), f); err != nil {
			t.Fatalf("cleanup: %v", err)
		}
	}
}

func newTestBackend(t testing.TB, cfg dataplane.Config, opts ...Option) *Backend {
	t.Helper()
	opts = append([]Option{WithoutLeftoverCleanup(), withPlanRecording()}, opts...)
	b, err := New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func mustApply(t testing.TB, b *Backend, ns *model.NodeState, ch model.Changes) dataplane.Result {
	t.Helper()
	return fixture.MustApply(t, b, ns, ch)
}

// nftList returns `nft list table` output (nft is only for inspection in tests).
func nftList(t testing.TB, f model.IPFamily) string {
	t.Helper()
	fam := "ip"
	if f == model.IPv6 {
		fam = "ip6"
	}
	out, err := exec.Command("nft", "list", "table", fam, kubeProxyTable).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return string(out)
}

func nft(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestKernelSmoke(t *testing.T) {
	resetTable(t)
	for _, f := range model.Families {
		t.Run(f.String(), func(t *testing.T) {
			cfg := testConfig(f)
			b := newTestBackend(t, cfg)
			ns := examples(f)
			mustApply(t, b, ns, model.Changes{Full: true})
			t.Logf("first apply: %+v", b.LastStats())
			t.Log("\n" + nftList(t, f))

			// A second backend reading the same table must find nothing to do.
			b2 := newTestBackend(t, cfg)
			mustApply(t, b2, ns, model.Changes{Full: true})
			if st := b2.LastStats(); st.Operations != 0 {
				t.Errorf("converging an up-to-date table planned %d operations:\n%s", st.Operations, b2.lastPlan)
			}
		})
	}
}
