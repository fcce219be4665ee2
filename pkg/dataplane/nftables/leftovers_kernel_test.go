//go:build kernel

package nftables

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/test/require"
)

// TestStartRemovesIPTablesLeftovers: kube-proxy's iptables chains (both iptables
// flavours) go when the nftables backend starts; kubelet's stay.
func TestStartRemovesIPTablesLeftovers(t *testing.T) {
	for _, flavour := range []string{"legacy", "nft"} {
		t.Run(flavour, func(t *testing.T) {
			restore := "iptables-" + flavour + "-restore"
			save := "iptables-" + flavour + "-save"
			_, err := exec.LookPath(restore)
			require.Feature(t, "iptables-"+flavour, err == nil, restore+" not installed")
			in := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEF - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 172.30.0.1/32 -j KUBE-SVC-ABCDEF
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m conntrack --ctstate NEW -j KUBE-PROXY-FIREWALL
COMMIT
`
			cmd := exec.Command(restore, "--noflush")
			cmd.Stdin = strings.NewReader(in)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", restore, err, out)
			}
			b, err := New(t.Context(), testConfig(model.IPv4))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// Until this table carries the Services, the old rules keep forwarding.
			if out, err := exec.Command(save).CombinedOutput(); err != nil || !strings.Contains(string(out), "KUBE-SVC-ABCDEF") {
				t.Fatalf("leftovers removed before the first sync (err %v):\n%s", err, out)
			}
			if res := b.Apply(t.Context(), model.NewNodeState(model.IPv4, model.NodeInfo{Name: "node-a"}), model.Changes{Full: true}); res.Err != nil {
				t.Fatal(res.Err)
			}
			out, err := exec.Command(save).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v: %s", save, err, out)
			}
			for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-ABCDEF", "KUBE-PROXY-FIREWALL"} {
				if strings.Contains(string(out), gone) {
					t.Errorf("%s left:\n%s", gone, out)
				}
			}
			if !strings.Contains(string(out), "-A INPUT -j KUBE-FIREWALL") {
				t.Errorf("kubelet's KUBE-FIREWALL removed:\n%s", out)
			}
			// Leave nothing behind for the other tests of this namespace.
			ipt := strings.TrimSuffix(restore, "-restore")
			for _, table := range []string{"filter", "nat"} {
				_ = exec.Command(ipt, "-t", table, "-F").Run()
				_ = exec.Command(ipt, "-t", table, "-X").Run()
			}
			if flavour == "nft" {
				for _, table := range []string{"filter", "nat", "mangle"} {
					_ = exec.Command("nft", "delete", "table", "ip", table).Run()
				}
			}
		})
	}
}
