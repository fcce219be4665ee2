// Package metrics declares every Prometheus metric sluice exports.
//
// Names, types, labels and buckets of the kubeproxy_* metrics follow upstream kube-proxy
// v1.37 exactly, so existing dashboards and alerts keep working. Metrics upstream lacks are
// named sluice_* so that they can never collide with a future upstream name.
//
// All metrics are package variables registered once, by Register, into Registry; callers
// never create metrics of their own.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const subsystem = "kubeproxy"

// Label names.
const (
	LabelIPFamily      = "ip_family"
	LabelCode          = "code"
	LabelTrafficPolicy = "traffic_policy"
	LabelTable         = "table"
	LabelProtocol      = "protocol"
	LabelReason        = "reason"
	LabelMode          = "mode"
	LabelKind          = "kind"
)

// DriftKinds are, per mode, the kind label values of sluice_drift_repairs_total: what each
// backend's full resync can tell apart from what it last wrote.
var DriftKinds = map[string][]string{
	"iptables": {"chain", "rule"},
	"nftables": {"chain", "rule", "set", "element"},
	"ipvs":     {"virtual_server", "real_server", "address", "interface", "set", "element", "rule"},
}

// durationBuckets is upstream's ExponentialBuckets(0.001, 2, 15): 1 ms to about 16 s.
var durationBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets span 0.25 s to 5 min like upstream's network-programming histogram:
// 0.25 and 0.5 s, every second up to 59 s, every 5 s up to 115 s, every 30 s up to 300 s.
var programmingBuckets = func() []float64 {
	b := prometheus.LinearBuckets(0.25, 0.25, 2)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}()

var (
	SyncProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds", Buckets: durationBuckets,
	}, []string{LabelIPFamily})

	SyncFullProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_full_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds for full resyncs", Buckets: durationBuckets,
	}, []string{LabelIPFamily})

	SyncPartialProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_partial_proxy_rules_duration_seconds",
		Help: "SyncProxyRules latency in seconds for partial resyncs", Buckets: durationBuckets,
	}, []string{LabelIPFamily})

	SyncProxyRulesLastTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_timestamp_seconds",
		Help: "The last time proxy rules were successfully synced",
	}, []string{LabelIPFamily})

	SyncProxyRulesLastQueuedTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
		Help: "The last time a sync of proxy rules was queued",
	}, []string{LabelIPFamily})

	NetworkProgrammingLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "network_programming_duration_seconds",
		Help:    "In Cluster Network Programming Latency in seconds",
		Buckets: programmingBuckets,
	}, []string{LabelIPFamily})

	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending",
		Help: "Pending proxy rules Endpoint changes",
	})
	EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
		Help: "Cumulative proxy rules Endpoint changes",
	})
	ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
		Help: "Pending proxy rules Service changes",
	})
	ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
		Help: "Cumulative proxy rules Service changes",
	})

	ProxyHealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "proxy_healthz_total",
		Help: "Cumulative proxy healthz HTTP status",
	}, []string{LabelCode})
	ProxyLivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "proxy_livez_total",
		Help: "Cumulative proxy livez HTTP status",
	}, []string{LabelCode})

	SyncProxyRulesNoLocalEndpointsTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
		Help: "Number of services with a Local traffic policy and no endpoints",
	}, []string{LabelTrafficPolicy, LabelIPFamily})

	IPTablesRestoreFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "Cumulative proxy iptables restore failures",
	}, []string{LabelIPFamily})
	IPTablesPartialRestoreFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help: "Cumulative proxy iptables partial restore failures",
	}, []string{LabelIPFamily})
	IPTablesRulesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_total",
		Help: "Total number of iptables rules owned by kube-proxy",
	}, []string{LabelTable, LabelIPFamily})
	IPTablesRulesLastSync = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_last",
		Help: "Number of iptables rules written by kube-proxy in last sync",
	}, []string{LabelTable, LabelIPFamily})

	NFTablesSyncFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_nftables_sync_failures_total",
		Help: "Cumulative proxy nftables sync failures",
	}, []string{LabelIPFamily})
	NFTablesCleanupFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_nftables_cleanup_failures_total",
		Help: "Cumulative proxy nftables cleanup failures",
	}, []string{LabelIPFamily})

	ReconcileConntrackFlowsLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "conntrack_reconciler_sync_duration_seconds",
		Help: "ReconcileConntrackFlowsLatency latency in seconds", Buckets: durationBuckets,
	}, []string{LabelIPFamily})
	ReconcileConntrackFlowsDeletedEntriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "conntrack_reconciler_deleted_entries_total",
		Help: "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{LabelIPFamily})
)

// Descriptions of upstream's iptables nfacct counters. They are read from the kernel when
// scraped, by a collector the iptables backend registers with MustRegisterCollector only
// when the kernel has nfacct (CONFIG_NETFILTER_NETLINK_ACCT).
var (
	IPTablesCTStateInvalidDroppedPacketsDesc = prometheus.NewDesc(
		prometheus.BuildFQName(subsystem, "", "iptables_ct_state_invalid_dropped_packets_total"),
		"packets dropped by iptables to work around conntrack problems", nil, nil)
	LocalhostNodePortAcceptedPacketsDesc = prometheus.NewDesc(
		prometheus.BuildFQName(subsystem, "", "iptables_localhost_nodeports_accepted_packets_total"),
		"Number of packets accepted on nodeports of loopback interface", nil, nil)
)

// sluice's own metrics: what operators asked for and upstream lacks
// (https://github.com/kubernetes/kubernetes/issues/80061).
var (
	// SyncFailuresTotal counts failed syncs by reason: "backend" (the whole apply failed),
	// "service" (some Services failed, the rest were programmed), "panic" (a sync panicked
	// and was recovered), "conntrack" (stale-entry cleanup failed).
	SyncFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_sync_failures_total",
		Help: "Failed proxy rule syncs, by IP family, mode and reason",
	}, []string{LabelIPFamily, LabelMode, LabelReason})

	// ServicesFailed is the number of Services the last sync could not program.
	ServicesFailed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_services_failed",
		Help: "Services that the last sync could not program, by IP family",
	}, []string{LabelIPFamily})

	// ServicesProgrammed is the number of Service ports in the desired state.
	ServicePortsDesired = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_service_ports",
		Help: "Service ports this node programs, by IP family",
	}, []string{LabelIPFamily})

	// DriftRepairsTotal counts what full resyncs found changed behind sluice's back and
	// repaired, by kind of kernel object (DriftKinds).
	DriftRepairsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_drift_repairs_total",
		Help: "Kernel objects a full resync found different from what sluice last wrote, and repaired, by mode, IP family and kind",
	}, []string{LabelMode, LabelIPFamily, LabelKind})

	// ConfigWarnings is the number of fields of the configuration file that only a lenient
	// decode accepted, by kind: "unknown_field" (ignored) or "duplicate_field" (the last
	// value used). sluice starts with them, as upstream does; `sluice config check` refuses
	// them.
	ConfigWarnings = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_config_warnings",
		Help: "Fields of the configuration file that strict decoding refuses and sluice ignored (unknown) or took the last value of (duplicate), by kind",
	}, []string{"kind"})

	// NodeSetupWarningsTotal counts kernel settings (sysctls, module parameters, the OOM
	// score) that sluice wanted to change at start and was not allowed to, by setting. It
	// runs with the current value instead of failing to start.
	NodeSetupWarningsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_node_setup_warnings_total",
		Help: "Kernel settings sluice could not write at start (read-only /proc/sys or /sys, missing privilege) and left as they were, by setting",
	}, []string{"setting"})

	// LocalTrafficDetectionMissing is 1 for a family whose detectLocalMode has nothing to
	// work with (NodeCIDR without a pod CIDR of the family on the Node, ClusterCIDR without
	// a clusterCIDR of the family): its Services are programmed without local-traffic
	// detection. 0 otherwise.
	LocalTrafficDetectionMissing = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_local_traffic_detection_missing",
		Help: "1 when the family is programmed without local-traffic detection because detectLocalMode has no CIDR for it",
	}, []string{LabelIPFamily})

	// InputProblemsTotal counts malformed fields found in Services and EndpointSlices.
	InputProblemsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_input_problems_total",
		Help: "Malformed fields found in Services and EndpointSlices, by object kind",
	}, []string{"kind"})
)

// Descriptions of the node's conntrack table and of the kernel's conntrack statistics. A
// collector in pkg/conntrack reads them over netlink when /metrics is scraped, in every
// mode (registered with MustRegisterCollector). They describe the network namespace sluice
// runs in (the host's, for a DaemonSet with hostNetwork).
//
// The kernel keeps each statistic per CPU as a 32-bit number; sluice adds the CPUs up and
// carries the wrap-arounds it sees between two reads, so each is a true counter.
var (
	ConntrackEntriesDesc = prometheus.NewDesc("sluice_conntrack_entries",
		"Entries in the conntrack table of sluice's network namespace", nil, nil)
	ConntrackLimitDesc = prometheus.NewDesc("sluice_conntrack_limit",
		"Entries the conntrack table may hold (nf_conntrack_max, host-wide; 0 means no limit)", nil, nil)
	ConntrackFoundDesc = prometheus.NewDesc("sluice_conntrack_found_total",
		"Conntrack lookups that found an existing entry (kernel statistic found)", nil, nil)
	ConntrackInvalidDesc = prometheus.NewDesc("sluice_conntrack_invalid_total",
		"Packets conntrack could not track and marked invalid (kernel statistic invalid)", nil, nil)
	ConntrackInsertDesc = prometheus.NewDesc("sluice_conntrack_insert_total",
		"Conntrack entries inserted into the table (kernel statistic insert)", nil, nil)
	ConntrackInsertFailedDesc = prometheus.NewDesc("sluice_conntrack_insert_failed_total",
		"New conntrack entries that could not be inserted, their packet dropped (kernel statistic insert_failed)", nil, nil)
	ConntrackDropDesc = prometheus.NewDesc("sluice_conntrack_drop_total",
		"Packets dropped because no conntrack entry could be created for them, mostly a full table (kernel statistic drop)", nil, nil)
	ConntrackEarlyDropDesc = prometheus.NewDesc("sluice_conntrack_early_drop_total",
		"Conntrack entries evicted to make room in a full table (kernel statistic early_drop)", nil, nil)
	ConntrackErrorDesc = prometheus.NewDesc("sluice_conntrack_error_total",
		"Packets conntrack's protocol trackers rejected as erroneous, such as bad ICMP errors (kernel statistic error)", nil, nil)
	ConntrackSearchRestartDesc = prometheus.NewDesc("sluice_conntrack_search_restart_total",
		"Conntrack table lookups restarted because the table changed under them (kernel statistic search_restart)", nil, nil)
	ConntrackClashResolveDesc = prometheus.NewDesc("sluice_conntrack_clash_resolve_total",
		"Clashes between concurrent new entries for one flow that the kernel resolved without a drop (kernel statistic clash_resolve)", nil, nil)
	ConntrackChainTooLongDesc = prometheus.NewDesc("sluice_conntrack_chain_toolong_total",
		"New conntrack entries refused, their packet dropped, because their hash chain was too long (kernel statistic chain_toolong)", nil, nil)
	ConntrackReadFailuresDesc = prometheus.NewDesc("sluice_conntrack_read_failures_total",
		"Failed reads of the conntrack table's size and statistics", nil, nil)
)

// Registry holds every metric sluice serves on /metrics.
var Registry = prometheus.NewRegistry()

var registerOnce sync.Once

// Register registers the metrics that apply to mode ("iptables", "nftables", "ipvs" or
// "recording") into Registry, plus the Go and process collectors. Only the first call has
// an effect.
func Register(mode string) {
	registerOnce.Do(func() {
		Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		Registry.MustRegister(
			SyncProxyRulesLatency, SyncProxyRulesLastTimestamp, SyncProxyRulesLastQueuedTimestamp,
			NetworkProgrammingLatency,
			EndpointChangesPending, EndpointChangesTotal, ServiceChangesPending, ServiceChangesTotal,
			ProxyHealthzTotal, ProxyLivezTotal, SyncProxyRulesNoLocalEndpointsTotal,
			ReconcileConntrackFlowsLatency, ReconcileConntrackFlowsDeletedEntriesTotal,
			SyncFailuresTotal, ServicesFailed, ServicePortsDesired, InputProblemsTotal,
			ConfigWarnings, NodeSetupWarningsTotal, LocalTrafficDetectionMissing,
		)
		if _, ok := DriftKinds[mode]; ok {
			Registry.MustRegister(DriftRepairsTotal)
		}
		switch mode {
		case "iptables":
			Registry.MustRegister(SyncFullProxyRulesLatency, SyncPartialProxyRulesLatency,
				IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal,
				IPTablesRulesTotal, IPTablesRulesLastSync)
		case "nftables":
			Registry.MustRegister(SyncFullProxyRulesLatency, SyncPartialProxyRulesLatency,
				NFTablesSyncFailuresTotal, NFTablesCleanupFailuresTotal)
		case "ipvs":
			Registry.MustRegister(IPTablesRestoreFailuresTotal)
		}
	})
}

// MustRegisterCollector adds a mode-specific collector (for example the iptables nfacct
// counters) to Registry.
func MustRegisterCollector(c prometheus.Collector) { Registry.MustRegister(c) }
