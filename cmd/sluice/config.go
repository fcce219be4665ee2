package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
)

// kubeProxyConfigKey is the ConfigMap key holding the configuration, in kubeadm's
// kube-proxy ConfigMap and in sluice's own.
const kubeProxyConfigKey = "config.conf"

func newConfigCommand(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with KubeProxyConfiguration files",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newConfigCheckCommand(stdout, stderr))
	return cmd
}

func newConfigCheckCommand(stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE|-",
		Short: "Check a configuration strictly, before a rollout or in CI",
		Long: `check is the strict gate for a KubeProxyConfiguration file. The daemon starts where upstream
kube-proxy starts: a file with an unknown or misspelt field, or a key given twice, makes it log
a warning and go on (the field is ignored, the last of the duplicates wins). check refuses such
a file, naming every unknown and duplicated field by its path, together with every value of the
wrong type and every value validation refuses; the exit status is then 1.

When the file is clean it prints the settings in effect, defaults included: mode, sync periods,
local-traffic detection, NodePort addresses, bind addresses, conntrack, and the rest that
matters on a node.

FILE may be "-" for stdin. It may also be a ConfigMap (as "kubectl get configmap -o yaml"
prints it) whose config.conf key holds the configuration, as kubeadm's kube-proxy ConfigMap
and sluice's own do.`,
		Example: `  sluice config check /var/lib/kube-proxy/config.conf
  kubectl -n kube-system get configmap kube-proxy -o yaml | sluice config check -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, data, err := readConfigInput(args[0], cmd.InOrStdin())
			if err != nil {
				return err
			}
			data, name, err = unwrapConfigMap(data, name)
			if err != nil {
				return err
			}
			result := config.Check(data)
			if !result.OK() {
				fmt.Fprintf(stderr, "%s: %d problem(s); the daemon refuses invalid values and ignores unknown fields, with a warning:\n", name, len(result.Problems))
				for _, p := range result.Problems {
					fmt.Fprintf(stderr, "  - %s\n", p)
				}
				return &exitCodeError{code: exitFailure}
			}
			fmt.Fprintf(stdout, "%s: OK (strict decoding and validation pass)\n", name)
			return printSettings(stdout, result)
		},
	}
}

// readConfigInput reads FILE, or stdin for "-", and names it for messages.
func readConfigInput(arg string, stdin io.Reader) (name string, data []byte, err error) {
	if arg == "-" {
		data, err = io.ReadAll(stdin)
		if err != nil {
			return "", nil, fmt.Errorf("reading stdin: %w", err)
		}
		return "<stdin>", data, nil
	}
	data, err = os.ReadFile(arg)
	if err != nil {
		return "", nil, err
	}
	return arg, data, nil
}

// unwrapConfigMap returns the config.conf key of a ConfigMap, and any other document
// unchanged.
func unwrapConfigMap(data []byte, name string) ([]byte, string, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &meta); err != nil || meta.APIVersion != "v1" || meta.Kind != "ConfigMap" {
		return data, name, nil // not a ConfigMap: the check says what is wrong with it
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return nil, "", fmt.Errorf("%s: decoding the ConfigMap: %w", name, err)
	}
	conf, ok := cm.Data[kubeProxyConfigKey]
	if !ok {
		keys := make([]string, 0, len(cm.Data))
		for k := range cm.Data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return nil, "", fmt.Errorf("%s: ConfigMap %s/%s has no %s key (keys: %s)", name, cm.Namespace, cm.Name, kubeProxyConfigKey, strings.Join(keys, ", "))
	}
	return []byte(conf), fmt.Sprintf("%s (%s of ConfigMap %s/%s)", name, kubeProxyConfigKey, cm.Namespace, cm.Name), nil
}

// printSettings prints the settings of a clean configuration that matter on a node, one per
// line, with defaults applied.
func printSettings(w io.Writer, r config.CheckResult) error {
	e, cfg := r.Effective, r.Config
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(key, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t%s\n", key, fmt.Sprintf(format, args...))
	}

	row("mode", "%s%s", e.Mode, map[bool]string{true: " (not set: iptables, upstream's default; sluice warns at start)"}[e.ModeDefaulted])
	row("syncPeriod", "%s (retry after a failure; /livez fails after 2 x syncPeriod without progress)", e.SyncPeriod)
	row("minSyncPeriod", "%s", e.MinSyncPeriod)
	row("sync without changes", "every %s", e.MaxSyncInterval)
	row("detectLocalMode", "%s", describeLocalDetection(e))
	nodePorts := "unset: " + map[bool]string{true: "primary (the Node's IPs)", false: "all node addresses"}[e.Mode == dataplane.ModeNFTables]
	if len(cfg.NodePortAddresses) > 0 {
		nodePorts = strings.Join(e.NodePortAddresses, ", ")
	}
	row("nodePortAddresses", "%s", nodePorts)
	if e.Mode == dataplane.ModeIPTables {
		row("localhostNodePorts", "%t (IPv4; needs route_localnet=1)", e.LocalhostNodePorts)
	}
	row("masquerade", "bit %d, masqueradeAll %t", e.MasqueradeBit, e.MasqueradeAll)
	row("bindAddress", "%s", e.BindAddress)
	row("healthzBindAddress", "%s", orNone(e.HealthzBindAddress, "(none: no /healthz, /livez)"))
	row("metricsBindAddress", "%s", e.MetricsBindAddress)
	row("bindAddressHardFail", "%t", e.BindAddressHardFail)
	row("conntrack", "%s", describeConntrack(e.Conntrack))
	if e.Mode == dataplane.ModeIPVS {
		row("ipvs", "scheduler %s, strictARP %t, excludeCIDRs %v", e.IPVS.Scheduler, e.IPVS.StrictARP, e.IPVS.ExcludeCIDRs)
	}
	row("oomScoreAdj", "%d", e.OOMScoreAdj)
	row("hostnameOverride", "%s", orNone(cfg.HostnameOverride, "(none: the machine's hostname, or --hostname-override)"))
	row("clientConnection", "kubeconfig %s, qps %g, burst %d, contentType %s",
		orNone(e.ClientConnection.Kubeconfig, "(in-cluster service account)"), e.ClientConnection.QPS, e.ClientConnection.Burst, e.ClientConnection.ContentType)
	row("configSyncPeriod", "%s", e.ConfigSyncPeriod)
	if len(cfg.FeatureGates) > 0 {
		var gates []string
		for name, on := range cfg.FeatureGates {
			gates = append(gates, fmt.Sprintf("%s=%t", name, on))
		}
		slices.Sort(gates)
		row("featureGates", "%s", strings.Join(gates, ", "))
	}
	if len(r.IgnoredFeatureGates) > 0 {
		row("ignored gates", "%s (%s)", strings.Join(r.IgnoredFeatureGates, ", "),
			"not kube-proxy gates: sluice ignores them with a warning; check the spelling")
	}
	return tw.Flush()
}

func describeLocalDetection(e *config.Effective) string {
	switch e.DetectLocalMode {
	case dataplane.DetectLocalClusterCIDR:
		if len(e.ClusterCIDRs) == 0 {
			return "ClusterCIDR, but clusterCIDR is empty: no local-traffic detection (sluice warns at start)"
		}
		cidrs := make([]string, len(e.ClusterCIDRs))
		for i, c := range e.ClusterCIDRs {
			cidrs[i] = c.String()
		}
		return "ClusterCIDR (" + strings.Join(cidrs, ", ") + ")"
	case dataplane.DetectLocalNodeCIDR:
		return "NodeCIDR (the Node's spec.podCIDRs; without them no local-traffic detection until they appear)"
	case dataplane.DetectLocalBridgeInterface:
		return "BridgeInterface (" + e.BridgeInterface + ")"
	case dataplane.DetectLocalInterfaceNamePrefix:
		return "InterfaceNamePrefix (" + e.InterfaceNamePrefix + ")"
	}
	return string(e.DetectLocalMode)
}

func describeConntrack(c config.ConntrackSettings) string {
	var b bytes.Buffer
	if c.MaxPerCore > 0 {
		fmt.Fprintf(&b, "maxPerCore %d, min %d", c.MaxPerCore, c.Min)
	} else {
		b.WriteString("nf_conntrack_max left alone")
	}
	for _, t := range []struct {
		name  string
		value time.Duration
	}{
		{"tcpEstablishedTimeout", c.TCPEstablishedTimeout}, {"tcpCloseWaitTimeout", c.TCPCloseWaitTimeout},
		{"udpTimeout", c.UDPTimeout}, {"udpStreamTimeout", c.UDPStreamTimeout},
	} {
		if t.value > 0 {
			fmt.Fprintf(&b, ", %s %s", t.name, t.value)
		}
	}
	if c.TCPBeLiberal {
		b.WriteString(", tcpBeLiberal")
	}
	return b.String()
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}
