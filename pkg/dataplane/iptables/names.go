package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
)

// Table names, as iptables spells them.
const (
	tableFilter = "filter"
	tableNAT    = "nat"
	tableMangle = "mangle"
)

// Chains sluice owns. The names, and what jumps to them, are upstream kube-proxy's, so that
// a node can switch between upstream's iptables mode and sluice in either direction without
// leftovers: each side recognises, rewrites and deletes the other's chains.
const (
	// chainServices holds one rule per Service frontend: in nat it captures ClusterIPs,
	// externalIPs and LoadBalancer IPs and ends with the jump to KUBE-NODEPORTS; in filter it
	// rejects or drops traffic to ClusterIPs without usable endpoints.
	chainServices = "KUBE-SERVICES"
	// chainExternalServices (filter) rejects or drops external traffic to Services without
	// usable endpoints.
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	// chainNodePorts captures NodePorts (nat) and accepts healthCheckNodePorts (filter).
	chainNodePorts = "KUBE-NODEPORTS"
	// chainPostrouting (nat) masquerades packets carrying the masquerade mark.
	chainPostrouting = "KUBE-POSTROUTING"
	// chainMarkMasq (nat) sets the masquerade mark.
	chainMarkMasq = "KUBE-MARK-MASQ"
	// chainForward (filter) drops ctstate INVALID and accepts marked and established traffic.
	chainForward = "KUBE-FORWARD"
	// chainProxyFirewall (filter) drops LoadBalancer traffic that KUBE-FW-* did not DNAT.
	chainProxyFirewall = "KUBE-PROXY-FIREWALL"
	// chainCanary exists, empty, in mangle, nat and filter; when it disappears someone
	// flushed the tables and everything must be rewritten.
	chainCanary = "KUBE-PROXY-CANARY"
	// chainKubeletFirewall is kubelet's chain. Like upstream, sluice writes its one rule
	// (drop martian localnet traffic) when localhost NodePorts are on, and never deletes it.
	chainKubeletFirewall = "KUBE-FIREWALL"
)

// Prefixes of the per-Service-port chains (xtables.ServiceChainPrefixes). Every chain whose
// name starts with one of them belongs to sluice (or to upstream kube-proxy, which is the
// same thing here) and is deleted when no longer used.
const (
	prefixClusterPolicy = "KUBE-SVC-" // endpoints for Cluster traffic policy
	prefixLocalPolicy   = "KUBE-SVL-" // endpoints for Local traffic policy
	prefixExternal      = "KUBE-EXT-" // entry for external traffic: masquerade, short-circuit
	prefixFirewall      = "KUBE-FW-"  // loadBalancerSourceRanges
	prefixEndpoint      = "KUBE-SEP-" // one endpoint: hairpin masquerade, affinity, DNAT
)

// Prefixes of the new-connection counter chains (nat), one per counted port and path
// chain (render.go, counters): sluice's own, owned like the chains above
// (xtables.IPTablesModeChain), and kept intact by every sync while the port is counted.
const (
	prefixNewConnCluster  = xtables.NewConnCounterChainPrefix + "C-"
	prefixNewConnLocal    = xtables.NewConnCounterChainPrefix + "L-"
	prefixNewConnExternal = xtables.NewConnCounterChainPrefix + "E-"
)

// isNewConnChain reports whether chain is a new-connection counter chain.
func isNewConnChain(chain string) bool {
	return strings.HasPrefix(chain, xtables.NewConnCounterChainPrefix)
}

// portHash returns upstream's 16-character chain suffix for a Service port:
// base32(sha256(portName + protocol))[:16], where portName is "ns/name:port" ("ns/name" for
// an unnamed port) and protocol is lower case. Chain names are at most 28 characters, so
// "KUBE-SVC-" + 16 fits; the same hash in every chain type lets a reader match KUBE-SVC-X,
// KUBE-EXT-X and KUBE-FW-X of one port.
func portHash(portName, protocol string) string {
	sum := sha256.Sum256([]byte(portName + protocol))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// endpointChain returns the KUBE-SEP chain of one endpoint ("ip:port", "[ip6]:port") of a
// Service port: the hash also covers the endpoint, so a chain is never reused for another
// endpoint (and `-m recent` affinity lists, named after it, never leak between endpoints).
func endpointChain(portName, protocol, endpoint string) string {
	sum := sha256.Sum256([]byte(portName + protocol + endpoint))
	return prefixEndpoint + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// masqueradeMark formats the mark bit as upstream does, with "%#08x" ("0x00004000" for bit
// 14: Go does not count the 0x prefix in the width).
func masqueradeMark(bit int) string {
	return fmt.Sprintf("%#08x", uint32(1)<<uint(bit))
}

// jumpRule is one rule in a built-in chain that leads into a sluice chain. These are the
// only rules sluice writes outside its own chains; they are inserted at the top of the
// built-in chain when missing, never rewritten, and removed only by Cleanup.
type jumpRule struct {
	table, from, to string
	comment         string
	extra           []string
}

// spec returns the rule as iptables arguments (without table and chain).
func (j jumpRule) spec() []string {
	out := append([]string(nil), j.extra...)
	if j.comment != "" {
		out = append(out, "-m", "comment", "--comment", j.comment)
	}
	return append(out, "-j", j.to)
}

var ctNew = []string{"-m", "conntrack", "--ctstate", "NEW"}

// jumpRules are upstream's, with the same comments, in the same order: sluice finds
// upstream's rules in place and adds none, and upstream finds sluice's.
var jumpRules = []jumpRule{
	{tableFilter, "INPUT", chainExternalServices, "kubernetes externally-visible service portals", ctNew},
	{tableFilter, "FORWARD", chainExternalServices, "kubernetes externally-visible service portals", ctNew},
	{tableFilter, "INPUT", chainNodePorts, "kubernetes health check service ports", nil},
	{tableFilter, "FORWARD", chainServices, "kubernetes service portals", ctNew},
	{tableFilter, "OUTPUT", chainServices, "kubernetes service portals", ctNew},
	{tableFilter, "FORWARD", chainForward, "kubernetes forwarding rules", nil},
	{tableFilter, "INPUT", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
	{tableFilter, "OUTPUT", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
	{tableFilter, "FORWARD", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
	{tableNAT, "OUTPUT", chainServices, "kubernetes service portals", nil},
	{tableNAT, "PREROUTING", chainServices, "kubernetes service portals", nil},
	{tableNAT, "POSTROUTING", chainPostrouting, "kubernetes postrouting rules", nil},
}

// kubeletJumpRules duplicate kubelet's: ensured like jumpRules, never removed.
var kubeletJumpRules = []jumpRule{
	{tableFilter, "INPUT", chainKubeletFirewall, "", nil},
	{tableFilter, "OUTPUT", chainKubeletFirewall, "", nil},
}

// topChains are the chains every full sync flushes and rewrites, per table, in upstream's
// order.
var (
	filterTopChains = []string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall}
	natTopChains    = []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq}
)
