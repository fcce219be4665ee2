package config

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Options is everything the sluice command line decides. Register the flags with AddFlags,
// parse, then call Complete: afterwards Config, Effective and FeatureGates are set and
// valid, and the Options are what app.Run receives.
type Options struct {
	// ConfigFile is --config: a KubeProxyConfiguration file that replaces every
	// configuration flag (logging flags, --hostname-override and --master still apply).
	ConfigFile string
	// WriteConfigTo is --write-config-to: write the effective configuration there as
	// v1alpha1 YAML and exit.
	WriteConfigTo string
	// Cleanup is --cleanup: remove what any mode may have left in the kernel, then exit.
	Cleanup bool
	// InitOnly is --init-only: do the setup that needs full root (sysctls, kernel
	// checks), then exit.
	InitOnly bool
	// Master is --master: the API server URL, overriding the kubeconfig's server.
	Master string
	// Backend is the hidden --backend flag: when set to "recording", sluice programs
	// nothing and only records (and serves on /debug/sluice/state) the desired state of the
	// configured mode. For tests and dry runs; it applies with --config too.
	Backend string
	// TrafficCounters is --traffic-counters: which Services' traffic the dataplane
	// counts (sluice_service_*_total). Outside KubeProxyConfiguration, so it applies
	// with --config too. Set by Complete from the flag's text.
	TrafficCounters model.TrafficCounters
	trafficCounters string

	// Config is the KubeProxyConfiguration in effect, set by Complete: the file or the
	// flags, with every default applied and hostnameOverride resolved from the flag. It is
	// what --write-config-to writes and what /configz should serve.
	Config *v1alpha1.KubeProxyConfiguration
	// Effective is the typed view of Config, set by Complete.
	Effective *Effective
	// FeatureGates holds Config.FeatureGates applied over the defaults of the gates sluice
	// knows (see NewFeatureGate), set by Complete.
	FeatureGates featuregate.FeatureGate
	// IgnoredFeatureGates are the gates of Config.FeatureGates that sluice does not know
	// and ignored (sorted; see IgnoredFeatureGatesWarning), set by Complete.
	IgnoredFeatureGates []string
	// ConfigWarnings are the fields of the --config file that only a lenient decode
	// accepted (unknown or duplicated; see DecodeLenient), set by Complete. sluice starts
	// with them, as upstream does, and reports each one (log, Event, metric).
	ConfigWarnings []FieldWarning
	// IgnoredFlags names the flags given on the command line that had no effect because
	// --config replaced them, so that the caller can warn about them (upstream ignores
	// them silently).
	IgnoredFlags []string

	// flagConfig receives the configuration flags; it starts out defaulted, so a flag's
	// default is the value an empty configuration file gets.
	flagConfig *v1alpha1.KubeProxyConfiguration

	// Flags that do not map one-to-one onto a v1alpha1 field; Complete applies them.
	hostnameOverride      string
	masqueradeAll         bool
	iptablesSyncPeriod    time.Duration
	iptablesMinSyncPeriod time.Duration
	ipvsSyncPeriod        time.Duration
	ipvsMinSyncPeriod     time.Duration
	clusterCIDR           string
	healthzPort           int32
	metricsPort           int32

	// osHostname returns the machine's hostname (os.Hostname, replaced in tests).
	osHostname func() (string, error)
}

// NewOptions returns Options whose flags carry upstream's defaults.
func NewOptions() *Options {
	cfg := &v1alpha1.KubeProxyConfiguration{}
	SetDefaults(cfg)
	return &Options{
		flagConfig: cfg,
		// The flag path's sync periods start from the iptables section's defaults in
		// every mode, ipvs included (so --proxy-mode=ipvs alone gives minSyncPeriod 1s,
		// where a file with mode: ipvs gives 0).
		iptablesSyncPeriod:    cfg.IPTables.SyncPeriod.Duration,
		iptablesMinSyncPeriod: cfg.IPTables.MinSyncPeriod.Duration,
		ipvsSyncPeriod:        cfg.IPTables.SyncPeriod.Duration,
		ipvsMinSyncPeriod:     cfg.IPTables.MinSyncPeriod.Duration,
		healthzPort:           DefaultHealthzPort,
		metricsPort:           DefaultMetricsPort,
		osHostname:            os.Hostname,
	}
}

// flagsHonouredWithConfig are the flags that still apply when --config is given, besides
// the logging flags.
var flagsHonouredWithConfig = []string{
	"config", "write-config-to", "cleanup", "init-only", "master", "hostname-override", "backend",
	"traffic-counters",
}

// AddFlags registers every flag upstream kube-proxy has on Linux, with upstream's names and
// defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	addFlags(fs, o.flagDefs())
	// The two flags whose default is not the current value of what they set.
	fs.StringVar(&o.trafficCounters, "traffic-counters", string(model.TrafficCountersAnnotated),
		"Which Services' new connections, packets and bytes the dataplane counts (sluice_service_*_total): 'annotated' (those annotated "+model.AnnotationTrafficCounters+": \"true\"), 'all' (all but those annotated \"false\") or 'off'. Applies with --config too.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", o.flagConfig.ClusterCIDR,
		"The pods' CIDR, or an IPv4,IPv6 pair on dual-stack clusters. With --detect-local-mode=ClusterCIDR, traffic from it counts as local pod traffic. Ignored when --config is given.")
	_ = fs.MarkHidden("backend")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead; this flag will be removed.")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead; this flag will be removed.")
	logsapi.AddFlags(&o.flagConfig.Logging, fs)
}

// flagDef is a flag whose default is the current value of its target: the configuration
// flags write into flagConfig, which starts out defaulted, and the others into Options
// fields that NewOptions sets to upstream's defaults.
type flagDef struct {
	// target is a *string, *bool, *int32, *float32, *time.Duration, *[]string or a
	// pflag.Value.
	target      any
	name, usage string
}

// addFlags registers flags in fs.
func addFlags(fs *pflag.FlagSet, flags []flagDef) {
	for _, f := range flags {
		switch t := f.target.(type) {
		case *string:
			fs.StringVar(t, f.name, *t, f.usage)
		case *bool:
			fs.BoolVar(t, f.name, *t, f.usage)
		case *int32:
			fs.Int32Var(t, f.name, *t, f.usage)
		case *float32:
			fs.Float32Var(t, f.name, *t, f.usage)
		case *time.Duration:
			fs.DurationVar(t, f.name, *t, f.usage)
		case *[]string:
			fs.StringSliceVar(t, f.name, *t, f.usage)
		case pflag.Value:
			fs.Var(t, f.name, f.usage)
		default:
			panic(fmt.Sprintf("flag --%s: no flag type for a %T", f.name, f.target))
		}
	}
}

// flagDefs are the flags registered from a table, grouped by what they configure.
func (o *Options) flagDefs() []flagDef {
	c := o.flagConfig
	return []flagDef{
		// What sluice does (configuration file, cleanup, init only) and the feature gates.
		{&o.ConfigFile, "config", "Read the configuration from this KubeProxyConfiguration file (YAML or JSON). The file replaces every configuration flag; only the logging flags, --hostname-override and --master still apply."},
		{&o.WriteConfigTo, "write-config-to", "Write the effective configuration (defaults included) to this file as KubeProxyConfiguration YAML, then exit."},
		{&o.Backend, "backend", "Replace the mode's backend: \"recording\" programs nothing and serves the desired state on /debug/sluice/state (tests, dry runs)."},
		{&o.Cleanup, "cleanup", "Remove the rules every proxy mode may have installed (iptables, ipvs, nftables), then exit."},
		{&o.InitOnly, "init-only", "Do only the setup that needs full root privileges (sysctls, kernel checks), then exit; sluice can then run with just CAP_NET_ADMIN."},
		{cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "Comma-separated Gate=true|false pairs that turn features on or off. Ignored when --config is given. Known gates:\n" +
			featureGatesHelp()},
		// The API server connection.
		{&c.ClientConnection.Kubeconfig, "kubeconfig", "Path to a kubeconfig file with the API server's address and credentials. Without it (and without --master) the in-cluster service account is used."},
		{&o.Master, "master", "URL of the Kubernetes API server; takes precedence over the server in the kubeconfig."},
		{&c.ClientConnection.ContentType, "kube-api-content-type", "Content type sluice asks the API server to use for its requests."},
		{&c.ClientConnection.Burst, "kube-api-burst", "Number of API requests allowed in a burst above --kube-api-qps."},
		{&c.ClientConnection.QPS, "kube-api-qps", "Sustained number of API requests per second."},
		// The node, the health and metrics servers, the mode and the caches' resync.
		{&o.hostnameOverride, "hostname-override", "Name of the Node object sluice runs for. Empty means the machine's hostname. Takes precedence over hostnameOverride in --config."},
		{ipValue(&c.BindAddress), "bind-address", "Overrides which IP sluice treats as this node's primary IP (no socket is bound to it; the name is historical). 0.0.0.0 or :: means: take the Node object's IPs. Ignored when --config is given."},
		{ipPortValue(&c.HealthzBindAddress), "healthz-bind-address", "IP and port (IP alone takes port 10256) of the health check server. Only --healthz-port=0 turns the server off (an empty address means the default). Ignored when --config is given."},
		{ipPortValue(&c.MetricsBindAddress), "metrics-bind-address", "IP and port (IP alone takes port 10249) of the metrics server. Use 0.0.0.0:10249 or [::]:10249 to serve on every interface. Ignored when --config is given."},
		{&c.BindAddressHardFail, "bind-address-hard-fail", "Exit when the health check or metrics server cannot bind its port, instead of retrying."},
		{&c.EnableProfiling, "profiling", "Serve Go profiles under /debug/pprof on the metrics server. Ignored when --config is given."},
		{&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "Expose again the metrics hidden in the previous minor release (the only accepted value, as <major>.<minor>), to give time to migrate before they are removed. Ignored when --config is given."},
		{(*string)(&c.Mode), "proxy-mode", "Backend that programs the kernel: 'iptables' (the default when unset), 'nftables' or 'ipvs' (deprecated). Ignored when --config is given."},
		{&c.ConfigSyncPeriod.Duration, "config-sync-period", "How often the Service, EndpointSlice and Node caches are refreshed from the API server; must be above 0."},
		// iptables mode (and the sync periods of every mode but ipvs).
		{c.IPTables.MasqueradeBit, "iptables-masquerade-bit", "Bit of the packet mark (0-31) that asks for SNAT in iptables and ipvs modes. nftables mode uses nftables.masqueradeBit from --config."},
		{&o.masqueradeAll, "masquerade-all", "SNAT every packet sent to a Service cluster IP. Some CNI plugins need this."},
		{c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", "Answer NodePorts on 127.0.0.1 (iptables mode, IPv4 only). Set to false to turn this legacy behaviour off."},
		{&o.iptablesSyncPeriod, "iptables-sync-period", "Interval (e.g. '5s', '1m') of the periodic resync and of retries after a failed sync; must be above 0. Applies to every mode except ipvs, nftables included."},
		{&o.iptablesMinSyncPeriod, "iptables-min-sync-period", "Least time between two rule syncs (e.g. '5s', '1m'); 0 syncs on every Service or EndpointSlice change. Applies to every mode except ipvs, nftables included."},
		// ipvs mode.
		{&o.ipvsSyncPeriod, "ipvs-sync-period", "Interval (e.g. '5s', '1m') of the periodic resync in ipvs mode; must be above 0. Used only with --proxy-mode=ipvs."},
		{&o.ipvsMinSyncPeriod, "ipvs-min-sync-period", "Least time between two syncs in ipvs mode (e.g. '5s', '1m'); 0 syncs on every change. Used only with --proxy-mode=ipvs."},
		{&c.IPVS.Scheduler, "ipvs-scheduler", "IPVS scheduler in ipvs mode (empty means 'rr')."},
		{&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", "Comma-separated CIDRs whose IPVS virtual servers sluice must never delete when cleaning up."},
		{&c.IPVS.StrictARP, "ipvs-strict-arp", "Set arp_ignore=1 and arp_announce=2 so the node does not answer ARP for addresses on kube-ipvs0."},
		{&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", "Idle timeout of IPVS TCP connections (e.g. '5s', '1m'); 0 keeps the kernel's value."},
		{&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", "Timeout of IPVS TCP connections after a FIN (e.g. '5s', '1m'); 0 keeps the kernel's value."},
		{&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", "Timeout of IPVS UDP flows (e.g. '5s', '1m'); 0 keeps the kernel's value."},
		// Local traffic detection, NodePort addresses and the OOM score.
		{(*string)(&c.DetectLocalMode), "detect-local-mode", "How to tell traffic from local pods: ClusterCIDR (default), NodeCIDR, BridgeInterface or InterfaceNamePrefix. Ignored when --config is given."},
		{&c.DetectLocal.BridgeInterface, "pod-bridge-interface", "With --detect-local-mode=BridgeInterface: traffic arriving from this bridge is local pod traffic."},
		{&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "With --detect-local-mode=InterfaceNamePrefix: traffic arriving from an interface whose name starts with this prefix is local pod traffic."},
		{&c.NodePortAddresses, "nodeport-addresses", "Comma-separated CIDRs and keywords selecting the node addresses NodePorts answer on: 'primary' (the Node's primary IPv4 and/or IPv6), 'localhost' (127.0.0.0/8, ::1/128), 'all'. " +
			"Unset means 'all' in iptables and ipvs modes and 'primary' in nftables mode. Loopback NodePorts work only in iptables mode (IPv4, see --iptables-localhost-nodeports) " +
			"and, for TCP, in nftables mode with the KubeProxyNFTablesLocalhostNodePorts gate and an explicit loopback entry. Ignored when --config is given."},
		{c.OOMScoreAdj, "oom-score-adj", "oom_score_adj of the sluice process, in [-1000, 1000]. Ignored when --config is given."},
		// The conntrack sysctls.
		{c.Conntrack.MaxPerCore, "conntrack-max-per-core", "Conntrack entries to allow per CPU core (nf_conntrack_max = this times the CPUs, at least --conntrack-min); 0 leaves nf_conntrack_max alone and ignores --conntrack-min."},
		{c.Conntrack.Min, "conntrack-min", "Lower bound of nf_conntrack_max, whatever --conntrack-max-per-core gives."},
		{&c.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", "Conntrack idle timeout of established TCP connections; 0 keeps the kernel's value."},
		{&c.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", "Conntrack timeout of TCP connections in CLOSE_WAIT."},
		{&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", "Set nf_conntrack_tcp_be_liberal=1, so out-of-window TCP packets are not marked INVALID."},
		{&c.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", "Conntrack idle timeout of UDP flows that have seen no reply; 0 keeps the kernel's value."},
		{&c.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", "Conntrack idle timeout of UDP flows that have seen replies (ASSURED); 0 keeps the kernel's value."},
		// The deprecated port flags.
		{&o.healthzPort, "healthz-port", "Port of the health check server; 0 disables it."},
		{&o.metricsPort, "metrics-port", "Port of the metrics server; 0 disables it."},
	}
}

// ValidationError is a configuration that failed validation. Errors names every invalid
// field with its v1alpha1 path and the reason.
type ValidationError struct {
	// Source is the configuration file, or "" when the configuration came from flags.
	Source string
	Errors field.ErrorList
}

// Error lists every invalid field.
func (e *ValidationError) Error() string {
	source := "from the command line"
	if e.Source != "" {
		source = "in " + e.Source
	}
	msgs := make([]string, len(e.Errors))
	for i, err := range e.Errors {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("invalid configuration %s: %s", source, strings.Join(msgs, "; "))
}

// Complete builds the configuration in effect after the flags in fs have been parsed,
// following upstream's precedence:
//
//   - With --config, the file (decoded as upstream does, strictly with a lenient
//     fallback that records ConfigWarnings, then defaulted) replaces every
//     configuration flag. Logging flags that were set are copied over it (their vmodule
//     entries come before the file's), and --hostname-override and --master still apply.
//   - Without it, the flags are the configuration. --iptables-sync-period and
//     --iptables-min-sync-period set the active section's periods in every mode except
//     ipvs (so they set nftables.*); --ipvs-sync-period and --ipvs-min-sync-period apply
//     only in ipvs mode and only when given. --masquerade-all sets nftables.masqueradeAll
//     in nftables mode and iptables.masqueradeAll otherwise. The deprecated
//     --healthz-port/--metrics-port apply unless --write-config-to is given.
//
// Then the platform defaults (mode, nodePortAddresses, detectLocalMode) are applied, the
// feature gates set, the whole configuration validated (a *ValidationError names every
// invalid field) and the node name and Effective view derived.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	var cfg *v1alpha1.KubeProxyConfiguration
	if o.ConfigFile != "" {
		loaded, warnings, err := LoadFileLenient(o.ConfigFile)
		if err != nil {
			return err
		}
		o.ConfigWarnings = warnings
		SetDefaults(loaded)
		if err := copyChangedLoggingFlags(fs, &loaded.Logging); err != nil {
			return err
		}
		o.IgnoredFlags = ignoredFlags(fs)
		cfg = loaded
	} else {
		cfg = o.flagConfig.DeepCopy()
		o.applyFlagsWithoutField(fs, cfg)
	}

	modeDefaulted := ApplyPlatformDefaults(cfg)

	if o.hostnameOverride != "" {
		name := strings.TrimSpace(o.hostnameOverride)
		if name == "" {
			return fmt.Errorf("--hostname-override: an empty (all blanks) name is invalid")
		}
		cfg.HostnameOverride = strings.ToLower(name)
	}

	if o.Backend != "" && o.Backend != "recording" {
		return fmt.Errorf("--backend: %q is not a backend override; the only one is \"recording\"", o.Backend)
	}
	tc, err := model.ParseTrafficCounters(o.trafficCounters)
	if err != nil {
		return fmt.Errorf("--traffic-counters: %w", err)
	}
	o.TrafficCounters = tc

	errs, gate, ignoredGates := validate(cfg)
	if len(errs) > 0 {
		return &ValidationError{Source: o.ConfigFile, Errors: errs}
	}

	nodeName, err := resolveNodeName(cfg.HostnameOverride, o.osHostname)
	if err != nil {
		return err
	}
	effective, err := NewEffective(cfg, nodeName)
	if err != nil {
		return err
	}
	effective.ModeDefaulted = modeDefaulted

	o.Config = cfg
	o.Effective = effective
	o.FeatureGates = gate
	o.IgnoredFeatureGates = ignoredGates
	return nil
}

// applyFlagsWithoutField applies the flags that have no v1alpha1 field of their own.
func (o *Options) applyFlagsWithoutField(fs *pflag.FlagSet, cfg *v1alpha1.KubeProxyConfiguration) {
	if o.ConfigFile == "" && o.WriteConfigTo == "" {
		cfg.HealthzBindAddress = addressFromDeprecatedPortFlag(cfg.HealthzBindAddress, o.healthzPort)
		cfg.MetricsBindAddress = addressFromDeprecatedPortFlag(cfg.MetricsBindAddress, o.metricsPort)
	}

	// Upstream's flag path keeps a single pair of sync periods, starting from 30s/1s, and
	// converts it into the active mode's section.
	syncPeriod, minSyncPeriod := DefaultSyncPeriod, DefaultMinSyncPeriod
	if dataplane.Mode(cfg.Mode) == dataplane.ModeIPVS {
		if fs.Changed("ipvs-sync-period") {
			syncPeriod = o.ipvsSyncPeriod
		}
		if fs.Changed("ipvs-min-sync-period") {
			minSyncPeriod = o.ipvsMinSyncPeriod
		}
	} else {
		if fs.Changed("iptables-sync-period") {
			syncPeriod = o.iptablesSyncPeriod
		}
		if fs.Changed("iptables-min-sync-period") {
			minSyncPeriod = o.iptablesMinSyncPeriod
		}
	}
	switch dataplane.Mode(cfg.Mode) {
	case dataplane.ModeIPVS:
		cfg.IPVS.SyncPeriod.Duration, cfg.IPVS.MinSyncPeriod.Duration = syncPeriod, minSyncPeriod
	case dataplane.ModeNFTables:
		cfg.NFTables.SyncPeriod.Duration, cfg.NFTables.MinSyncPeriod.Duration = syncPeriod, minSyncPeriod
		cfg.NFTables.MasqueradeAll = o.masqueradeAll
	default:
		cfg.IPTables.SyncPeriod.Duration, cfg.IPTables.MinSyncPeriod.Duration = syncPeriod, minSyncPeriod
	}
	if dataplane.Mode(cfg.Mode) != dataplane.ModeNFTables {
		cfg.IPTables.MasqueradeAll = o.masqueradeAll
	}

	if fs.Changed("cluster-cidr") {
		cfg.ClusterCIDR = o.clusterCIDR
	}
}

// addressFromDeprecatedPortFlag: port 0 disables the server; otherwise the port is added
// to an address given without one (an address with a port keeps it).
func addressFromDeprecatedPortFlag(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, int(port))
}

// loggingFlagNames are the flags logsapi registers.
func loggingFlagNames() []string {
	var fs pflag.FlagSet
	logsapi.AddFlags(logsapi.NewLoggingConfiguration(), &fs)
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	return names
}

// copyChangedLoggingFlags sets, in a logging configuration loaded from a file, the
// logging flags given on the command line. vmodule entries from the flags come first,
// then the file's.
func copyChangedLoggingFlags(from *pflag.FlagSet, to *logsapi.LoggingConfiguration) error {
	fileVModule := to.VModule
	// Registering flags writes their defaults into the target (pflag's BoolVar does), so
	// register on a copy's addresses and restore the file's values before setting any.
	saved := to.DeepCopy()
	var targets pflag.FlagSet
	logsapi.AddFlags(to, &targets)
	*to = *saved
	to.VModule = nil

	var err error
	targets.VisitAll(func(target *pflag.Flag) {
		given := from.Lookup(target.Name)
		if err != nil || given == nil || !given.Changed {
			return
		}
		if setErr := target.Value.Set(given.Value.String()); setErr != nil {
			err = fmt.Errorf("applying --%s over the configuration file: %w", target.Name, setErr)
		}
	})
	to.VModule = append(to.VModule, fileVModule...)
	return err
}

// ignoredFlags lists the flags set on the command line that --config overrides.
func ignoredFlags(fs *pflag.FlagSet) []string {
	honoured := append(loggingFlagNames(), flagsHonouredWithConfig...)
	honoured = append(honoured, "help", "version")
	var ignored []string
	fs.Visit(func(f *pflag.Flag) {
		if !slices.Contains(honoured, f.Name) {
			ignored = append(ignored, "--"+f.Name)
		}
	})
	return ignored
}

// resolveNodeName returns hostnameOverride, or else the OS hostname, trimmed and lowercased.
func resolveNodeName(hostnameOverride string, osHostname func() (string, error)) (string, error) {
	name := hostnameOverride
	if name == "" {
		h, err := osHostname()
		if err != nil {
			return "", fmt.Errorf("reading the hostname for the node name (set --hostname-override): %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", fmt.Errorf("the node name is empty (set --hostname-override)")
	}
	return name, nil
}

// addressValue is a flag holding an address as text; check rejects what is not one.
type addressValue struct {
	target *string
	typ    string
	check  func(string) error
}

func (v *addressValue) String() string {
	if v.target == nil {
		return ""
	}
	return *v.target
}

// Set keeps the current value for "" (as upstream, which cannot clear these flags:
// --healthz-bind-address="" does not disable the health server, --healthz-port=0 does).
func (v *addressValue) Set(s string) error {
	if s == "" {
		return nil
	}
	if err := v.check(s); err != nil {
		return err
	}
	*v.target = s
	return nil
}

func (v *addressValue) Type() string { return v.typ }

// ipValue is a flag holding an IP address as text.
func ipValue(target *string) *addressValue {
	return &addressValue{target: target, typ: "ip", check: checkIP}
}

// ipPortValue is a flag holding "IP" or "IP:port" as text.
func ipPortValue(target *string) *addressValue {
	return &addressValue{target: target, typ: "ipport", check: checkIPPort}
}

func checkIP(s string) error {
	if netutils.ParseIPSloppy(s) == nil {
		return fmt.Errorf("%q is not an IP address", s)
	}
	return nil
}

func checkIPPort(s string) error {
	if netutils.ParseIPSloppy(s) != nil {
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is neither IP nor IP:port: %w", s, err)
	}
	if err := checkIP(host); err != nil {
		return err
	}
	if _, err := netutils.ParsePort(port, true); err != nil {
		return fmt.Errorf("%q is not a port number", port)
	}
	return nil
}
