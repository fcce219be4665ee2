package ipvs

import (
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Everything this backend creates in the kernel carries the name upstream kube-proxy's ipvs
// mode gives it, so that a node can move between upstream's ipvs mode and sluice in either
// direction: each side finds the other's virtual servers, device, ipsets and chains in place
// and converges them instead of adding a second copy.

// dummyDevice is the dummy link that holds ClusterIPs, externalIPs and LoadBalancer IPs as
// local addresses, so that packets to them reach LOCAL_IN, where IPVS takes them.
const dummyDevice = "kube-ipvs0"

// Chains of the small iptables ruleset around IPVS (upstream's names and tables).
const (
	// nat
	chainServices     = "KUBE-SERVICES"      // from PREROUTING and OUTPUT: masquerade decisions, NodePort dispatch
	chainPostrouting  = "KUBE-POSTROUTING"   // from POSTROUTING: masquerade marked packets, hairpin
	chainNodePort     = "KUBE-NODE-PORT"     // nat: NodePort masquerade; filter: healthCheckNodePort accept
	chainLoadBalancer = "KUBE-LOAD-BALANCER" // LoadBalancer IPs: masquerade unless externalTrafficPolicy Local
	chainMarkMasq     = "KUBE-MARK-MASQ"     // sets the masquerade mark
	// filter
	chainForward              = "KUBE-FORWARD"                // from FORWARD: accept marked and established traffic
	chainProxyFirewall        = "KUBE-PROXY-FIREWALL"         // from INPUT and FORWARD: loadBalancerSourceRanges
	chainSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL" // allowed sources RETURN, the rest DROP
	chainIPVSFilter           = "KUBE-IPVS-FILTER"            // from INPUT: reject other ports on Service IPs (k8s#72236)
	chainIPVSOutFilter        = "KUBE-IPVS-OUT-FILTER"        // from OUTPUT: node to LB IP when the node is not allowed (k8s#119656)
)

// Table names as iptables spells them.
const (
	tableNAT    = "nat"
	tableFilter = "filter"
	tableMangle = "mangle"
)

// ownChains are the chains this backend writes, per table, in the order they are declared
// (the ipvs mode's by xtables' ownership rule: a test checks it).
var ownChains = map[string][]string{
	tableNAT:    {chainServices, chainPostrouting, chainNodePort, chainLoadBalancer, chainMarkMasq},
	tableFilter: {chainForward, chainNodePort, chainProxyFirewall, chainSourceRangesFirewall, chainIPVSFilter, chainIPVSOutFilter},
}

// jumpRule is one rule in a built-in chain leading into one of ownChains.
type jumpRule struct {
	table, from, to, comment string
}

// args returns the rule as iptables arguments after the chain name.
func (j jumpRule) args() []string {
	return []string{"-m", "comment", "--comment", j.comment, "-j", j.to}
}

// jumpRules are upstream's ipvs-mode jumps, with its comments, so that upstream's rules are
// found in place (and upstream finds sluice's). Each is inserted at the top of its built-in
// chain when missing. Any other rule in a built-in chain that jumps to a kube-proxy chain is
// a leftover (of the iptables mode, usually) and is removed.
var jumpRules = []jumpRule{
	{tableNAT, "OUTPUT", chainServices, "kubernetes service portals"},
	{tableNAT, "PREROUTING", chainServices, "kubernetes service portals"},
	{tableNAT, "POSTROUTING", chainPostrouting, "kubernetes postrouting rules"},
	{tableFilter, "FORWARD", chainForward, "kubernetes forwarding rules"},
	{tableFilter, "INPUT", chainNodePort, "kubernetes health check rules"},
	{tableFilter, "INPUT", chainProxyFirewall, "kube-proxy firewall rules"},
	{tableFilter, "FORWARD", chainProxyFirewall, "kube-proxy firewall rules"},
	{tableFilter, "INPUT", chainIPVSFilter, "kubernetes ipvs access filter"},
	{tableFilter, "OUTPUT", chainIPVSOutFilter, "kubernetes ipvs access filter"},
}

// builtinChains are the chains of each table that exist without being declared.
var builtinChains = xtables.BuiltinChains

// ipsetType is an ipset type name as the kernel spells it.
type ipsetType string

const (
	typeHashIP         ipsetType = "hash:ip"
	typeHashIPPort     ipsetType = "hash:ip,port"
	typeHashIPPortIP   ipsetType = "hash:ip,port,ip"
	typeHashIPPortNet  ipsetType = "hash:ip,port,net"
	typeBitmapPort     ipsetType = "bitmap:port"
	maxIPSetNameLength           = 31
)

// ipsetID names one of the backend's ipsets independently of the family.
type ipsetID int

// The ipsets, upstream's (pkg/proxy/ipvs/ipset.go) plus two of sluice's own.
const (
	setLoopBack ipsetID = iota
	setClusterIP
	setExternalIP
	setExternalIPLocal
	setLoadBalancer
	setLoadBalancerLocal
	setLoadBalancerFW
	setLoadBalancerSourceIP
	setLoadBalancerSourceCIDR
	setNodePortTCP
	setNodePortLocalTCP
	setNodePortUDP
	setNodePortLocalUDP
	setNodePortSCTP
	setNodePortLocalSCTP
	setHealthCheckNodePort
	setIPVSIPs
	setNoLocalEndpoints
	setNoEndpointsTCP
	numIPSets
)

// ipsetInfo describes one ipset: its IPv4 name, type and the comment its iptables rules carry.
type ipsetInfo struct {
	name    string
	typ     ipsetType
	comment string
}

var ipsets = [numIPSets]ipsetInfo{
	setLoopBack:               {"KUBE-LOOP-BACK", typeHashIPPortIP, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	setClusterIP:              {"KUBE-CLUSTER-IP", typeHashIPPort, "Kubernetes service cluster ip + port for masquerade purpose"},
	setExternalIP:             {"KUBE-EXTERNAL-IP", typeHashIPPort, "Kubernetes service external ip + port for masquerade and filter purpose"},
	setExternalIPLocal:        {"KUBE-EXTERNAL-IP-LOCAL", typeHashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	setLoadBalancer:           {"KUBE-LOAD-BALANCER", typeHashIPPort, "Kubernetes service lb portal"},
	setLoadBalancerLocal:      {"KUBE-LOAD-BALANCER-LOCAL", typeHashIPPort, "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	setLoadBalancerFW:         {"KUBE-LOAD-BALANCER-FW", typeHashIPPort, "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	setLoadBalancerSourceIP:   {"KUBE-LOAD-BALANCER-SOURCE-IP", typeHashIPPortIP, "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	setLoadBalancerSourceCIDR: {"KUBE-LOAD-BALANCER-SOURCE-CIDR", typeHashIPPortNet, "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	setNodePortTCP:            {"KUBE-NODE-PORT-TCP", typeBitmapPort, "Kubernetes nodeport TCP port for masquerade purpose"},
	setNodePortLocalTCP:       {"KUBE-NODE-PORT-LOCAL-TCP", typeBitmapPort, "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	setNodePortUDP:            {"KUBE-NODE-PORT-UDP", typeBitmapPort, "Kubernetes nodeport UDP port for masquerade purpose"},
	setNodePortLocalUDP:       {"KUBE-NODE-PORT-LOCAL-UDP", typeBitmapPort, "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	setNodePortSCTP:           {"KUBE-NODE-PORT-SCTP-HASH", typeHashIPPort, "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	setNodePortLocalSCTP:      {"KUBE-NODE-PORT-LOCAL-SCTP-HASH", typeHashIPPort, "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	setHealthCheckNodePort:    {"KUBE-HEALTH-CHECK-NODE-PORT", typeBitmapPort, "Kubernetes health check node port"},
	setIPVSIPs:                {"KUBE-IPVS-IPS", typeHashIP, "IPVS service ip + port"},
	// sluice only: externalTrafficPolicy Local frontends that have no local endpoint on this
	// node. IPVS then falls back to the cluster's endpoints (as upstream does) so that pods
	// and the node itself still reach the Service, and the firewall drops what comes from
	// elsewhere, as the iptables and nftables modes do. See docs/ipvs.md.
	setNoLocalEndpoints: {"KUBE-SLUICE-NO-LOCAL-EPS", typeHashIPPort, "sluice: externalTrafficPolicy=Local frontends without local endpoints"},
	// sluice only: TCP virtual servers without a real server. IPVS would answer their clients
	// with ICMP port unreachable, which Linux TCP takes as a soft error during connect (an
	// IPv6 client is refused only after a SYN retransmit); KUBE-IPVS-FILTER refuses them
	// with a reset first, as the iptables and nftables modes do. See docs/ipvs.md.
	setNoEndpointsTCP: {"KUBE-SLUICE-NO-ENDPOINTS-TCP", typeHashIPPort, "sluice: TCP virtual servers without real servers"},
}

// ipsetName returns a set's name in a family. Upstream keeps the IPv4 names and turns
// "KUBE-" into "KUBE-6-" for IPv6 (truncated to ipset's 31 characters), so that both
// families' sets coexist.
func ipsetName(id ipsetID, family model.IPFamily) string {
	name := ipsets[id].name
	if family == model.IPv6 {
		name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
		if len(name) > maxIPSetNameLength {
			name = name[:maxIPSetNameLength]
		}
	}
	return name
}

// IPVS service flags (include/uapi/linux/ip_vs.h). moby/ipvs passes them through unnamed.
const (
	// flagPersistent makes a virtual server persistent: a client (by source address and
	// netmask) keeps its real server for the service's timeout. ClientIP session affinity.
	flagPersistent uint32 = 0x0001
	// flagHashed is set by the kernel on every service it holds; it is never ours to set or
	// compare.
	flagHashed uint32 = 0x0002
	// flagSched2 is IP_VS_SVC_F_SCHED2, which the sh and mh schedulers read as "hash the
	// source port too" (IP_VS_SVC_F_SCHED_SH_PORT, IP_VS_SVC_F_SCHED_MH_PORT). Upstream sets
	// it for mh (its FlagSourceHash); sluice does the same.
	flagSched2 uint32 = 0x0010
)

// Sysctls the backend reads or sets (paths under /proc/sys). All are per network namespace;
// the net/ipv4/vs ones apply to both families.
const (
	sysctlVSConnTrack             = "net/ipv4/vs/conntrack"
	sysctlConnReuseMode           = "net/ipv4/vs/conn_reuse_mode"
	sysctlExpireNoDestConn        = "net/ipv4/vs/expire_nodest_conn"
	sysctlExpireQuiescentTemplate = "net/ipv4/vs/expire_quiescent_template"
	sysctlIPForward               = "net/ipv4/ip_forward"
	sysctlARPIgnore               = "net/ipv4/conf/all/arp_ignore"
	sysctlARPAnnounce             = "net/ipv4/conf/all/arp_announce"
	sysctlBridgeNFCallIPTables    = "net/bridge/bridge-nf-call-iptables"
)
