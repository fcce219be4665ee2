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
	SyncProxyRulesLatency = histogramVec("kubeproxy_sync_proxy_rules_duration_seconds",
		"SyncProxyRules latency in seconds", durationBuckets, LabelIPFamily)
	SyncFullProxyRulesLatency = histogramVec("kubeproxy_sync_full_proxy_rules_duration_seconds",
		"SyncProxyRules latency in seconds for full resyncs", durationBuckets, LabelIPFamily)
	SyncPartialProxyRulesLatency = histogramVec("kubeproxy_sync_partial_proxy_rules_duration_seconds",
		"SyncProxyRules latency in seconds for partial resyncs", durationBuckets, LabelIPFamily)
	SyncProxyRulesLastTimestamp = gaugeVec("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"The last time proxy rules were successfully synced", LabelIPFamily)
	SyncProxyRulesLastQueuedTimestamp = gaugeVec("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
		"The last time a sync of proxy rules was queued", LabelIPFamily)
	NetworkProgrammingLatency = histogramVec("kubeproxy_network_programming_duration_seconds",
		"In Cluster Network Programming Latency in seconds", programmingBuckets, LabelIPFamily)

	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
		Help: "Pending proxy rules Endpoint changes",
	})
	EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
		Help: "Cumulative proxy rules Endpoint changes",
	})
	ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kubeproxy_sync_proxy_rules_service_changes_pending",
		Help: "Pending proxy rules Service changes",
	})
	ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubeproxy_sync_proxy_rules_service_changes_total",
		Help: "Cumulative proxy rules Service changes",
	})

	ProxyHealthzTotal = counterVec("kubeproxy_proxy_healthz_total",
		"Cumulative proxy healthz HTTP status", LabelCode)
	ProxyLivezTotal = counterVec("kubeproxy_proxy_livez_total",
		"Cumulative proxy livez HTTP status", LabelCode)

	SyncProxyRulesNoLocalEndpointsTotal = gaugeVec("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"Number of services with a Local traffic policy and no endpoints", LabelTrafficPolicy, LabelIPFamily)

	IPTablesRestoreFailuresTotal = counterVec("kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
		"Cumulative proxy iptables restore failures", LabelIPFamily)
	IPTablesPartialRestoreFailuresTotal = counterVec("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
		"Cumulative proxy iptables partial restore failures", LabelIPFamily)
	IPTablesRulesTotal = gaugeVec("kubeproxy_sync_proxy_rules_iptables_total",
		"Total number of iptables rules owned by kube-proxy", LabelTable, LabelIPFamily)
	IPTablesRulesLastSync = gaugeVec("kubeproxy_sync_proxy_rules_iptables_last",
		"Number of iptables rules written by kube-proxy in last sync", LabelTable, LabelIPFamily)

	NFTablesSyncFailuresTotal = counterVec("kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
		"Cumulative proxy nftables sync failures", LabelIPFamily)
	NFTablesCleanupFailuresTotal = counterVec("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
		"Cumulative proxy nftables cleanup failures", LabelIPFamily)

	ReconcileConntrackFlowsLatency = histogramVec("kubeproxy_conntrack_reconciler_sync_duration_seconds",
		"ReconcileConntrackFlowsLatency latency in seconds", durationBuckets, LabelIPFamily)
	ReconcileConntrackFlowsDeletedEntriesTotal = counterVec("kubeproxy_conntrack_reconciler_deleted_entries_total",
		"Cumulative conntrack flows deleted by conntrack reconciler", LabelIPFamily)
)

// Descriptions of upstream's iptables nfacct counters. They are read from the kernel when
// scraped, by a collector the iptables backend registers with MustRegisterCollector only
// when the kernel has nfacct (CONFIG_NETFILTER_NETLINK_ACCT).
var (
	IPTablesCTStateInvalidDroppedPacketsDesc = prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		"packets dropped by iptables to work around conntrack problems", nil, nil)
	LocalhostNodePortAcceptedPacketsDesc = prometheus.NewDesc("kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		"Number of packets accepted on nodeports of loopback interface", nil, nil)
)

// sluice's own metrics: what operators asked for and upstream lacks
// (https://github.com/kubernetes/kubernetes/issues/80061).
var (
	// SyncFailuresTotal counts failed syncs by reason: "backend" (the whole apply failed),
	// "service" (some Services failed, the rest were programmed), "panic" (a sync panicked
	// and was recovered), "conntrack" (stale-entry cleanup failed).
	SyncFailuresTotal = counterVec("sluice_sync_failures_total",
		"Failed proxy rule syncs, by IP family, mode and reason", LabelIPFamily, LabelMode, LabelReason)

	// ServicesFailed is the number of Services the last sync could not program.
	ServicesFailed = gaugeVec("sluice_services_failed",
		"Services that the last sync could not program, by IP family", LabelIPFamily)

	// ServicesProgrammed is the number of Service ports in the desired state.
	ServicePortsDesired = gaugeVec("sluice_service_ports",
		"Service ports this node programs, by IP family", LabelIPFamily)

	// DriftRepairsTotal counts what full resyncs found changed behind sluice's back and
	// repaired, by kind of kernel object (DriftKinds).
	DriftRepairsTotal = counterVec("sluice_drift_repairs_total",
		"Kernel objects a full resync found different from what sluice last wrote, and repaired, by mode, IP family and kind",
		LabelMode, LabelIPFamily, LabelKind)

	// ConfigWarnings is the number of fields of the configuration file that only a lenient
	// decode accepted, by kind: "unknown_field" (ignored) or "duplicate_field" (the last
	// value used). sluice starts with them, as upstream does; `sluice config check` refuses
	// them.
	ConfigWarnings = gaugeVec("sluice_config_warnings",
		"Fields of the configuration file that strict decoding refuses and sluice ignored (unknown) or took the last value of (duplicate), by kind",
		"kind")

	// NodeSetupWarningsTotal counts kernel settings (sysctls, module parameters, the OOM
	// score) that sluice wanted to change at start and was not allowed to, by setting. It
	// runs with the current value instead of failing to start.
	NodeSetupWarningsTotal = counterVec("sluice_node_setup_warnings_total",
		"Kernel settings sluice could not write at start (read-only /proc/sys or /sys, missing privilege) and left as they were, by setting",
		"setting")

	// LocalTrafficDetectionMissing is 1 for a family whose detectLocalMode has nothing to
	// work with (NodeCIDR without a pod CIDR of the family on the Node, ClusterCIDR without
	// a clusterCIDR of the family): its Services are programmed without local-traffic
	// detection. 0 otherwise.
	LocalTrafficDetectionMissing = gaugeVec("sluice_local_traffic_detection_missing",
		"1 when the family is programmed without local-traffic detection because detectLocalMode has no CIDR for it",
		LabelIPFamily)

	// InputProblemsTotal counts malformed fields found in Services and EndpointSlices.
	InputProblemsTotal = counterVec("sluice_input_problems_total",
		"Malformed fields found in Services and EndpointSlices, by object kind", "kind")
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

// counterVec, gaugeVec and histogramVec declare a metric vector by its full name (upstream's
// are kubeproxy_*), help text and variable labels; none has constant labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
