package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/explain"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// explainFlags are `sluice explain`'s flags.
type explainFlags struct {
	server serverFlags
	output string

	// Offline: objects from files, this node's name, and the configuration.
	offlineFlags

	sourceKind     string
	localAddresses []string
}

func newExplainCommand(stdout io.Writer) *cobra.Command {
	var f explainFlags
	cmd := &cobra.Command{
		Use:   "explain SRC DST:PORT[/PROTO] | explain NAMESPACE/NAME",
		Short: "Say where a packet goes on this node and why, or how a Service's endpoints were chosen",
		Long: `explain answers "where does a packet from SRC to DST:PORT/PROTO go on this node?": the Service
port it matches (ClusterIP, NodePort on a node address, externalIP or LoadBalancer IP), how its
source counts (a pod, the node itself, or external), the traffic policy that applies to it, the
loadBalancerSourceRanges check, session affinity, every endpoint of the port with the reason it is
or is not a candidate, whether the source is masqueraded, and the verdict: DNAT to one of N
endpoints, reject (no endpoints), drop (Local policy without local endpoints, or source range),
or no Service matches. PROTO is tcp (default), udp or sctp; an IPv6 destination is [ADDR]:PORT.

With one argument, NAMESPACE/NAME, it explains every port of that Service instead: its Cluster
and Local endpoint lists with a reason for every endpoint, and what each kind of client gets.

By default it reads the live state from the sluice running on this node (--server: 127.0.0.1
at its metricsBindAddress port; the state answers loopback clients only),
with its configuration from /configz. Offline, -f reads Services, EndpointSlices, Nodes (and
ServiceCIDRs) as "kubectl get -o yaml" prints them (a List or several documents; "-" is stdin)
and computes the state the daemon would for --node, with the configuration from --config or
the flags below (default: iptables mode's defaults).

Exit status: 0 when explained, 1 on bad arguments or a Service that does not exist, 2 when the
daemon cannot be reached.`,
		Example: `  sluice explain 10.244.1.10 10.96.0.10:80                 # a pod to a ClusterIP, live
  sluice explain 203.0.113.7 192.0.2.11:443/tcp -o json
  sluice explain kube-system/kube-dns
  kubectl get svc,endpointslices,nodes -A -o yaml > objects.yaml
  sluice explain -f objects.yaml --node node-a --proxy-mode nftables --cluster-cidr 10.244.0.0/16 172.18.0.100 172.18.0.2:30080`,
		Args:          cobra.RangeArgs(1, 2),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExplain(cmd.Context(), stdout, &f, args)
		},
	}
	f.server.add(cmd)
	fs := cmd.Flags()
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	fs.StringArrayVarP(&f.files, "filename", "f", nil, "offline: read API objects from this file (YAML or JSON; repeatable; - for stdin) instead of a running sluice")
	fs.StringVar(&f.node, "node", "", "offline: the node to explain for (default: the only Node in the files)")
	fs.StringVar(&f.mode, "proxy-mode", "", "offline: the mode, iptables, nftables or ipvs (overrides --config)")
	f.addConfigFlags(fs, "offline: ")
	fs.StringVar(&f.sourceKind, "source-kind", "", "how SRC counts, when its address cannot tell (an interface-based detectLocalMode): pod, node or external")
	fs.StringSliceVar(&f.localAddresses, "local-address", nil, "further addresses of this node (NodePorts answer on them; traffic from them is the node's)")
	return cmd
}

// nodeSource is the state and configuration of the node being explained, live or offline.
type nodeSource struct {
	node   string
	states map[string]*model.StateView // by family name
	eff    *config.Effective
}

func runExplain(ctx context.Context, stdout io.Writer, f *explainFlags, args []string) error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("--output %q: want text or json", f.output)
	}
	switch explain.SourceKind(f.sourceKind) {
	case "", explain.SourcePod, explain.SourceNode, explain.SourceExternal:
	default:
		return fmt.Errorf("--source-kind %q: want pod, node or external", f.sourceKind)
	}
	var locals []netip.Addr
	for _, s := range f.localAddresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("--local-address %q: %w", s, err)
		}
		locals = append(locals, a.Unmap())
	}

	var pkt *explain.Packet
	var namespace, name string
	if len(args) == 2 {
		p, err := parsePacket(args[0], args[1])
		if err != nil {
			return err
		}
		p.SourceKind = explain.SourceKind(f.sourceKind)
		pkt = &p
	} else {
		var ok bool
		namespace, name, ok = strings.Cut(args[0], "/")
		if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
			return fmt.Errorf("%q: want NAMESPACE/NAME, or SRC DST:PORT[/PROTO]", args[0])
		}
	}

	var src *nodeSource
	var err error
	if len(f.files) > 0 {
		src, err = offlineSource(&f.offlineFlags, os.Stdin)
	} else {
		if f.configFlagsSet() {
			return fmt.Errorf("--node, --config, --proxy-mode, --cluster-cidr, --nodeport-addresses, --detect-local-mode and --masquerade-all need -f (offline); live, the daemon's own configuration is used")
		}
		src, err = liveSource(ctx, &f.server)
	}
	if err != nil {
		return err
	}

	if pkt != nil {
		family := model.FamilyOf(pkt.Destination.Addr()).String()
		if model.FamilyOf(pkt.Source) != model.FamilyOf(pkt.Destination.Addr()) {
			return fmt.Errorf("source %s and destination %s are of different IP families", pkt.Source, pkt.Destination.Addr())
		}
		state := src.states[family]
		if state == nil {
			return fmt.Errorf("sluice on %s handles no %s traffic", src.node, family)
		}
		e := explain.Explain(state, explainConfig(src, state, locals), *pkt)
		if f.output == "json" {
			return writeJSON(stdout, e)
		}
		return e.WriteText(stdout)
	}

	var found []explain.ServiceExplanation
	for _, family := range []model.IPFamily{model.IPv4, model.IPv6} {
		state := src.states[family.String()]
		if state == nil {
			continue
		}
		if se, ok := explain.ExplainService(state, explainConfig(src, state, locals), namespace, name); ok {
			found = append(found, se)
		}
	}
	if len(found) == 0 {
		//nolint:staticcheck // ST1005: "Service" is the Kubernetes kind, and the message is the command's output
		return fmt.Errorf("Service %s/%s has no port in sluice's state on %s (it does not exist, is headless or ExternalName, or is not for this proxy)", namespace, name, src.node)
	}
	if f.output == "json" {
		if len(f.files) > 0 {
			return writeJSON(stdout, found) // offline: no kernel to read counters from
		}
		tc := liveTrafficCounters(ctx, &f.server, src.states, namespace, name)
		out := make([]serviceWithCounters, len(found))
		for i := range found {
			out[i] = serviceWithCounters{ServiceExplanation: found[i], TrafficCounters: tc}
		}
		return writeJSON(stdout, out)
	}
	for i := range found {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := found[i].WriteText(stdout); err != nil {
			return err
		}
	}
	if len(f.files) > 0 {
		return nil // offline: no kernel to read counters from
	}
	// Live: the counters the daemon exports for this Service (issue 13).
	tc := liveTrafficCounters(ctx, &f.server, src.states, namespace, name)
	return writeTrafficCounters(stdout, tc)
}

// parsePacket reads "SRC" and "DST:PORT[/PROTO]".
func parsePacket(srcArg, dstArg string) (explain.Packet, error) {
	src, err := netip.ParseAddr(srcArg)
	if err != nil {
		return explain.Packet{}, fmt.Errorf("source %q is not an IP address", srcArg)
	}
	proto := model.TCP
	if i := strings.LastIndex(dstArg, "/"); i >= 0 {
		switch strings.ToUpper(dstArg[i+1:]) {
		case "TCP":
		case "UDP":
			proto = model.UDP
		case "SCTP":
			proto = model.SCTP
		default:
			return explain.Packet{}, fmt.Errorf("protocol %q: want tcp, udp or sctp", dstArg[i+1:])
		}
		dstArg = dstArg[:i]
	}
	dst, err := netip.ParseAddrPort(dstArg)
	if err != nil || dst.Port() == 0 {
		return explain.Packet{}, fmt.Errorf("destination %q: want IP:PORT ([IPv6]:PORT), optionally followed by /tcp, /udp or /sctp", dstArg)
	}
	return explain.Packet{Source: src.Unmap(), Destination: netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), Protocol: proto}, nil
}

// liveSource reads the state and the configuration of a running sluice.
func liveSource(ctx context.Context, sf *serverFlags) (*nodeSource, error) {
	report, _, err := sf.fetchReport(ctx)
	if err != nil {
		return nil, err
	}
	src := &nodeSource{node: report.Node, states: map[string]*model.StateView{}}
	for i := range report.Families {
		st := &report.Families[i].State
		if st.Family != "" {
			src.states[st.Family] = st
		}
	}
	// The configuration decides NodePort addresses, pod detection and masquerading.
	cfg := &v1alpha1.KubeProxyConfiguration{}
	if body, err := sf.fetch(ctx, "/configz"); err == nil {
		var configz map[string]json.RawMessage
		if err := json.Unmarshal(body, &configz); err == nil && configz["kubeproxy.config.k8s.io"] != nil {
			if err := json.Unmarshal(configz["kubeproxy.config.k8s.io"], cfg); err != nil {
				return nil, fmt.Errorf("decoding %s: %w", sf.url("/configz"), err)
			}
		}
	}
	if cfg.Mode == "" {
		cfg.Mode = v1alpha1.ProxyMode(report.Mode)
	}
	config.SetDefaults(cfg)
	config.ApplyPlatformDefaults(cfg)
	src.eff, err = config.NewEffective(cfg, report.Node)
	if err != nil {
		return nil, fmt.Errorf("the daemon's configuration: %w", err)
	}
	return src, nil
}

// offlineSource computes the state from API objects in files, as the daemon would.
func offlineSource(f *offlineFlags, stdin io.Reader) (*nodeSource, error) {
	n, err := loadOffline(f, stdin)
	if err != nil {
		return nil, err
	}
	src := &nodeSource{node: n.name, states: map[string]*model.StateView{}, eff: n.eff}
	for family, st := range n.states {
		v := st.View()
		src.states[family.String()] = &v
	}
	return src, nil
}

// explainConfig resolves the configuration for one family of the node.
func explainConfig(src *nodeSource, state *model.StateView, locals []netip.Addr) explain.Config {
	family := model.IPv4
	if state.Family == model.IPv6.String() {
		family = model.IPv6
	}
	node := model.NodeInfo{Name: state.Node.Name, Zone: state.Node.Zone}
	for _, s := range state.Node.IPs {
		if a, err := netip.ParseAddr(s); err == nil {
			node.IPs = append(node.IPs, a)
		}
	}
	for _, s := range state.Node.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			node.PodCIDRs = append(node.PodCIDRs, p)
		}
	}
	dc := src.eff.DataplaneConfig(family, node)
	return explain.Config{
		Mode:               src.eff.Mode,
		MasqueradeAll:      dc.MasqueradeAll,
		LocalhostNodePorts: dc.LocalhostNodePorts,
		NodePortAddresses:  dc.NodePortAddresses,
		LocalDetector:      dc.LocalDetector,
		LocalAddresses:     locals,
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
