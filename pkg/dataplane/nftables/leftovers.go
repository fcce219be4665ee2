package nftables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Leftovers of the other modes. Upstream's nftables mode removes the iptables and IPVS
// rules of the iptables and ipvs modes when it starts, so that a node switched to
// nftables does not keep serving stale Services through the old rules. These are small
// private versions: the iptables backend package does not export a cleanup yet (when it
// does, this file should call it instead).

// kubeProxyIPTablesChains are the chains the iptables and ipvs modes of kube-proxy own.
// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-MARK-DROP are kubelet's and stay.
var kubeProxyIPTablesChains = map[string]bool{
	"KUBE-SERVICES": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-NODE-PORT": true,
	"KUBE-POSTROUTING": true, "KUBE-MARK-MASQ": true, "KUBE-FORWARD": true, "KUBE-PROXY-FIREWALL": true,
	"KUBE-PROXY-CANARY": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

var kubeProxyIPTablesChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-"}

func isKubeProxyIPTablesChain(name string) bool {
	if kubeProxyIPTablesChains[name] {
		return true
	}
	for _, p := range kubeProxyIPTablesChainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// iptablesVariant is one iptables flavour of one family.
type iptablesVariant struct {
	save, restore string
	// present reports whether any table of this flavour exists, without creating one.
	present func() bool
}

// cleanupIPTablesLeftovers removes kube-proxy's iptables chains and the rules jumping to
// them, in both the legacy and the nf_tables flavour of iptables. A flavour whose tools
// are not installed, or whose tables do not exist, is skipped.
func cleanupIPTablesLeftovers(ctx context.Context, f *family, c *conn) error {
	logger := klog.FromContext(ctx)
	prefix, procNames := "iptables", "/proc/net/ip_tables_names"
	if f.model == model.IPv6 {
		prefix, procNames = "ip6tables", "/proc/net/ip6_tables_names"
	}
	variants := []iptablesVariant{
		{save: prefix + "-legacy-save", restore: prefix + "-legacy-restore", present: func() bool {
			b, err := os.ReadFile(procNames)
			return err == nil && len(bytes.TrimSpace(b)) > 0
		}},
		{save: prefix + "-nft-save", restore: prefix + "-nft-restore", present: func() bool {
			for _, t := range []string{"filter", "nat", "mangle"} {
				if m, err := c.request(unix.NFT_MSG_GETTABLE, byte(f.nf), func(b *msgBuilder) { b.str(unix.NFTA_TABLE_NAME, t) }); err == nil && m != nil {
					return true
				}
			}
			return false
		}},
	}
	var errs []error
	for _, v := range variants {
		if _, err := exec.LookPath(v.save); err != nil {
			logger.V(4).Info("No iptables tools for leftover cleanup", "tool", v.save)
			continue
		}
		if !v.present() {
			continue
		}
		for _, table := range []string{"nat", "filter", "mangle"} {
			if err := cleanupIPTablesTable(ctx, v, table); err != nil {
				errs = append(errs, fmt.Errorf("%s table %s: %w", v.save, table, err))
			}
		}
	}
	return errors.Join(errs...)
}

func cleanupIPTablesTable(ctx context.Context, v iptablesVariant, table string) error {
	out, err := exec.CommandContext(ctx, v.save, "-t", table).Output()
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	input := iptablesCleanupInput(table, out)
	if input == nil {
		return nil
	}
	cmd := exec.CommandContext(ctx, v.restore, "--noflush")
	cmd.Stdin = bytes.NewReader(input)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restore: %w: %s", err, bytes.TrimSpace(msg))
	}
	klog.FromContext(ctx).Info("Removed kube-proxy iptables leftovers", "tool", v.restore, "table", table)
	return nil
}

// iptablesCleanupInput turns iptables-save output of one table into iptables-restore
// --noflush input that removes kube-proxy's chains and every rule jumping to them, or
// nil when there is nothing to remove.
func iptablesCleanupInput(table string, save []byte) []byte {
	var owned []string
	var unlink []string
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if isKubeProxyIPTablesChain(name) {
				owned = append(owned, name)
			}
		case strings.HasPrefix(line, "-A "):
			fields := strings.Fields(line)
			if len(fields) < 2 || isKubeProxyIPTablesChain(fields[1]) {
				continue
			}
			for i := 2; i+1 < len(fields); i++ {
				if (fields[i] == "-j" || fields[i] == "-g") && isKubeProxyIPTablesChain(fields[i+1]) {
					unlink = append(unlink, "-D "+line[3:])
					break
				}
			}
		}
	}
	if len(owned) == 0 && len(unlink) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("*" + table + "\n")
	for _, name := range owned {
		b.WriteString(":" + name + " - [0:0]\n") // flushes it
	}
	for _, l := range unlink {
		b.WriteString(l + "\n")
	}
	for _, name := range owned {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// cleanupIPVSLeftovers removes what kube-proxy's ipvs mode leaves: its virtual servers
// and the kube-ipvs0 dummy interface, on a node where kube-ipvs0 exists (so that IPVS used
// by something else is left alone). On a kernel without IPVS the nftables mode leaves
// everything alone, kube-ipvs0 included.
func cleanupIPVSLeftovers(ctx context.Context) error {
	if !leftovers.KernelHasIPVS() {
		return nil
	}
	found, err := leftovers.RemoveIPVSServersAndDevice()
	if found && err == nil {
		klog.FromContext(ctx).Info("Removed kube-proxy ipvs leftovers")
	}
	return err
}
