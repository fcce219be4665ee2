package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/iptables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/ipvs"
	"github.com/sluiceproxy/sluice/pkg/dataplane/nftables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// renderFlags are `sluice render`'s flags.
type renderFlags struct {
	offlineFlags
	family         string
	output         string
	localAddresses []string
	nfacct         bool
}

func newRenderCommand(stdout io.Writer) *cobra.Command {
	var f renderFlags
	cmd := &cobra.Command{
		Use:   "render --from FILE --node NAME [--mode iptables|nftables|ipvs] [--family IPv4|IPv6|all]",
		Short: "Print the ruleset a mode would program on a node, computed from API objects, without touching the kernel",
		Long: `render prints the exact ruleset that sluice in the given mode would program on a node:
what its first full sync writes on a node that holds no rule of sluice's or kube-proxy's
yet. It needs no root and no cluster: it reads Services, EndpointSlices, Nodes (and
ServiceCIDRs) as "kubectl get -o yaml" or "-o json" prints them (a List or several
documents; "-" is stdin), computes the node's state as the daemon does, and runs the
mode's own rule generator on it, the code a sync runs, so what it prints cannot differ
from what is programmed.

For each IP family it prints a header comment, then:
  iptables  the iptables commands inserting the jumps from the built-in chains (as
            comments), then the iptables-restore input: mangle canary, nat, filter;
  nftables  the nft script of the kube-proxy table (nft -f loads it);
  ipvs      the dummy device, ipsets, virtual and real servers, addresses and set
            entries as ip, ipset and ipvsadm commands, then the iptables-restore input.
With -o json it prints {"IPv4": "<ruleset>", "IPv6": "<ruleset>"} without the headers.

The configuration comes from --config (the daemon's KubeProxyConfiguration) and the flags
below, as for "sluice explain -f"; the mode defaults to iptables, as the daemon's does.
What a node's kernel would tell the daemon is taken from the objects: the node's addresses
are its Node's InternalIP and ExternalIP (add others with --local-address); the kernel is
assumed to lack nfacct (--nfacct says it has it).`,
		Example: `  kubectl get svc,endpointslices,nodes -A -o yaml > objects.yaml
  sluice render --from objects.yaml --node node-a --mode nftables
  sluice render --from objects.yaml --node node-a --config /etc/kube-proxy/config.yaml --family IPv4
  kubectl get svc,endpointslices,nodes -A -o json | sluice render --from - --node node-a --mode ipvs -o json`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRender(stdout, &f)
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&f.files, "from", nil, "read API objects from this file (YAML or JSON; repeatable; - for stdin)")
	fs.StringVar(&f.node, "node", "", "the node to render for (default: the only Node in the files)")
	fs.StringVar(&f.mode, "mode", "", "the mode: iptables, nftables or ipvs (overrides --config; default iptables)")
	fs.StringVar(&f.mode, "proxy-mode", "", "the same as --mode")
	_ = fs.MarkHidden("proxy-mode")
	fs.StringVar(&f.family, "family", "all", "the IP family to render: IPv4, IPv6 or all")
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	f.addConfigFlags(fs, "")
	fs.StringSliceVar(&f.localAddresses, "local-address", nil, "further addresses of the node, besides its Node's (NodePorts answer on those inside nodePortAddresses)")
	fs.BoolVar(&f.nfacct, "nfacct", false, "the node's kernel has nfacct (iptables mode: the INVALID drop and localhost NodePort rules count packets)")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagFilename("from", "yaml", "yml", "json")
	_ = cmd.MarkFlagFilename("config", "yaml", "yml", "json")
	return cmd
}

func runRender(stdout io.Writer, f *renderFlags) error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("--output %q: want text or json", f.output)
	}
	var families []model.IPFamily
	switch strings.ToLower(f.family) {
	case "all":
		families = model.Families
	case "ipv4":
		families = []model.IPFamily{model.IPv4}
	case "ipv6":
		families = []model.IPFamily{model.IPv6}
	default:
		return fmt.Errorf("--family %q: want IPv4, IPv6 or all", f.family)
	}
	if f.mode != "" && !renderable(dataplane.Mode(f.mode)) {
		return fmt.Errorf("--mode %q: want iptables, nftables or ipvs", f.mode)
	}
	var extra []netip.Addr
	for _, s := range f.localAddresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("--local-address %q: %w", s, err)
		}
		extra = append(extra, a.Unmap())
	}

	n, err := loadOffline(&f.offlineFlags, os.Stdin)
	if err != nil {
		return err
	}
	if !renderable(n.eff.Mode) {
		return fmt.Errorf("mode %q (from %s): render knows iptables, nftables and ipvs", n.eff.Mode, f.configFile)
	}
	var locals []netip.Addr // nil: the backends' default, the node's IPs and loopback
	if len(extra) > 0 {
		locals = append(slices.Clone(n.node.IPs), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
		locals = append(locals, extra...)
	}

	texts := map[string]string{}
	for _, family := range families {
		text, err := renderFamily(n, family, locals, f.nfacct)
		if err != nil {
			return err
		}
		texts[family.String()] = text
	}
	if f.output == "json" {
		return writeJSON(stdout, texts)
	}
	for i, family := range families {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if _, err := io.WriteString(stdout, renderHeader(n, family)+texts[family.String()]); err != nil {
			return err
		}
	}
	return nil
}

func renderable(m dataplane.Mode) bool {
	return m == dataplane.ModeIPTables || m == dataplane.ModeNFTables || m == dataplane.ModeIPVS
}

// renderFamily runs the mode's Render for one family, with the configuration the daemon
// would give the backend.
func renderFamily(n *offlineNode, family model.IPFamily, locals []netip.Addr, nfacct bool) (string, error) {
	state := n.states[family]
	cfg := n.eff.DataplaneConfig(family, n.node)
	switch n.eff.Mode {
	case dataplane.ModeIPTables:
		// The daemon sets nf_conntrack_tcp_be_liberal before the backend reads it.
		return iptables.Render(state, cfg, iptables.RenderOptions{LocalAddresses: locals, TCPBeLiberal: n.eff.Conntrack.TCPBeLiberal, NFAcct: nfacct})
	case dataplane.ModeNFTables:
		return nftables.Render(state, cfg, nftables.RenderOptions{LocalAddresses: locals})
	case dataplane.ModeIPVS:
		return ipvs.Render(state, cfg, ipvsSettingsOf(n.eff, family), ipvs.RenderOptions{LocalAddresses: locals})
	}
	return "", fmt.Errorf("mode %q cannot be rendered", n.eff.Mode)
}

// ipvsSettingsOf is the ipvs section of the configuration for one family, as the daemon
// passes it to the ipvs backend.
func ipvsSettingsOf(e *config.Effective, family model.IPFamily) ipvs.Settings {
	return ipvs.Settings{
		Scheduler:     e.IPVS.Scheduler,
		ExcludeCIDRs:  e.IPVS.ExcludeCIDRsOf(family),
		StrictARP:     e.IPVS.StrictARP,
		TCPTimeout:    e.IPVS.TCPTimeout,
		TCPFinTimeout: e.IPVS.TCPFinTimeout,
		UDPTimeout:    e.IPVS.UDPTimeout,
	}
}

// renderHeader says what follows: mode, family, node, what the state holds, and the
// problems found in the input (those objects' other parts are still programmed).
func renderHeader(n *offlineNode, family model.IPFamily) string {
	state := n.states[family]
	var b strings.Builder
	mode := string(n.eff.Mode) + " mode"
	if n.eff.ModeDefaulted {
		mode += " (no mode configured: the default)"
	}
	ips := n.node.IPsOf(family)
	addrs := "no " + family.String() + " address"
	if len(ips) > 0 {
		parts := make([]string, len(ips))
		for i, ip := range ips {
			parts[i] = ip.String()
		}
		addrs = strings.Join(parts, ", ")
	}
	fmt.Fprintf(&b, "# sluice render: %s, %s, node %s (%s): %s, %s\n",
		mode, family, n.name, addrs, countOf(state.ServiceNames().Len(), "Service"), countOf(len(state.Services), "Service port"))
	b.WriteString("# What a full sync programs on a node without sluice's or kube-proxy's rules; no kernel was read or changed.\n")
	names := make([]types.NamespacedName, 0, len(state.Problems))
	for name := range state.Problems {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	for _, name := range names {
		for _, p := range state.Problems[name] {
			b.WriteString("# Problem, left out: " + p.String() + "\n")
		}
	}
	return b.String()
}

// countOf spells "1 Service", "2 Services".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
