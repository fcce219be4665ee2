//go:build kernel

package nftables

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/require"
)

// TestKernelRenderIsWhatTheBackendSends: on a node without the table, the first full
// sync of a real backend sends exactly the plan Render prints, and nft(8) accepts that
// text (`nft -c -f`, check mode: parsed and validated by the kernel, nothing committed).
func TestKernelRenderIsWhatTheBackendSends(t *testing.T) {
	_, err := exec.LookPath("nft")
	require.Feature(t, require.NFT, err == nil, "nft is not installed")
	for _, v := range planVariants {
		t.Run(v.name, func(t *testing.T) {
			resetTable(t)
			state := v.state()
			text, err := Render(state, v.config(), RenderOptions{LocalAddresses: testLocalAddrs})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			path := filepath.Join(t.TempDir(), "render.nft")
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			nft(t, "-c", "-f", path)

			b := newTestBackend(t, v.config(), fixedAddrs(testLocalAddrs...))
			mustApply(t, b, state, model.Changes{Full: true})
			if diff := cmp.Diff(b.lastPlan.String(), text); diff != "" {
				t.Errorf("Render differs from what the backend sent (-sent +render):\n%s", diff)
			}
		})
	}
}
