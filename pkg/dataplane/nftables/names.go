package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluiceproxy/sluice/pkg/model"
)

// Object names. They are upstream kube-proxy's (pkg/proxy/nftables/proxier.go, v1.37), so that
// a node running upstream in nftables mode can switch to sluice, and back, by converging one
// table instead of replacing it. Everything lives in the table kubeProxyTable, so no name
// needs a "kube-" prefix of its own.
const (
	kubeProxyTable = "kube-proxy"
	tableComment   = "rules for kube-proxy"

	// Base chains, named "<type>-<hook>" (plus "-pre-dnat" for the ones that must see the
	// destination before DNAT).
	filterPreroutingPreDNATChain = "filter-prerouting-pre-dnat"
	filterOutputPreDNATChain     = "filter-output-pre-dnat"
	filterInputChain             = "filter-input"
	filterForwardChain           = "filter-forward"
	filterOutputChain            = "filter-output"
	natPreroutingChain           = "nat-prerouting"
	natOutputChain               = "nat-output"
	natPostroutingChain          = "nat-postrouting"

	// Service dispatch: a verdict map keyed by address . protocol . port, and one keyed
	// by protocol . port for NodePorts.
	servicesChain       = "services"
	serviceIPsMap       = "service-ips"
	serviceNodePortsMap = "service-nodeports"

	// Local addresses that accept NodePorts, when nodePortAddresses is not match-all.
	nodePortIPsSet = "nodeport-ips"
	// Every ClusterIP in use, for rejecting unused ports and masquerading.
	clusterIPsSet = "cluster-ips"

	// Services without (usable) endpoints: reject or drop.
	serviceEndpointsCheckChain  = "service-endpoints-check"
	nodePortEndpointsCheckChain = "nodeport-endpoints-check"
	noEndpointServicesMap       = "no-endpoint-services"
	noEndpointNodePortsMap      = "no-endpoint-nodeports"
	rejectChain                 = "reject-chain"
	// Services and NodePorts without any endpoint, whose traffic is rejected (sluice's:
	// upstream has "goto reject-chain" elements in the no-endpoint maps; see
	// buildServicePort for why sets).
	rejectServicesSet  = "reject-services"
	rejectNodePortsSet = "reject-nodeports"

	// Unused ports of ClusterIPs are rejected, unallocated ServiceCIDR addresses dropped.
	clusterIPsCheckChain = "cluster-ips-check"

	// loadBalancerSourceRanges.
	firewallIPsMap     = "firewall-ips"
	firewallCheckChain = "firewall-check"

	// Masquerading.
	masqueradingChain     = "masquerading"
	hairpinConnectionsSet = "hairpin-connections"

	// Packet counters (sluice's, only while a Service is counted): verdict maps keyed
	// like service-ips and service-nodeports, whose elements go to a counted port's
	// packet counter chain (README, "Traffic counters").
	packetCountersMap         = "packet-counters"
	packetCountersNodePortMap = "packet-counters-nodeports"

	// endpointMapPrefix names the endpoint maps (sluice's, not upstream's): see
	// endpointRules.
	endpointMapPrefix = "endpoints-"
	// endpointMaps is their number.
	endpointMaps = 256
)

// endpointMapOf returns the endpoint map a chain's endpoints go in.
func endpointMapOf(chain string) string {
	h := fnv.New32a()
	h.Write([]byte(chain))
	return endpointMapName(int(h.Sum32() % endpointMaps))
}

func endpointMapName(i int) string { return fmt.Sprintf("%s%02x", endpointMapPrefix, i) }

// endpointMapIndex returns i for endpointMapName(i), -1 for other names.
func endpointMapIndex(set string) int {
	if !isEndpointMap(set) {
		return -1
	}
	i, err := strconv.ParseUint(strings.TrimPrefix(set, endpointMapPrefix), 16, 8)
	if err != nil {
		return -1
	}
	return int(i)
}

func isEndpointMap(set string) bool {
	return strings.HasPrefix(set, endpointMapPrefix) && !isServiceObjectName(set)
}

// Per-service chain and set name prefixes (upstream's, each at most
// chainNamePrefixLengthMax long including the hyphen).
const (
	clusterPolicyChainPrefix = "service-"
	localPolicyChainPrefix   = "local-"
	externalChainPrefix      = "external-"
	firewallChainPrefix      = "firewall-"
	endpointChainPrefix      = "endpoint-"
	affinitySetPrefix        = "affinity-"
	// The packet counter chains of a counted port (sluice's), one per path.
	countClusterChainPrefix  = "count-cluster-"
	countLocalChainPrefix    = "count-local-"
	countExternalChainPrefix = "count-external-"
)

const (
	// nameLengthMax is the longest chain or set name the kernel accepts: NFT_NAME_MAXLEN
	// (256) includes the terminating NUL.
	nameLengthMax = 255
	// chainNamePrefixLengthMax bounds our prefixes ("endpoint-" is the longest), so that a
	// truncated base always fits.
	chainNamePrefixLengthMax = 16
	// nameBaseLengthMax is upstream's truncation point for the "HASH-ns/svc/..." part:
	// knftables.NameLengthMax (256) minus the prefix allowance. Using the same figure keeps
	// our names identical to upstream's even for absurdly long ones.
	nameBaseLengthMax = 256 - chainNamePrefixLengthMax
	// commentLengthMax is the longest comment nft(8) accepts (NFTNL_UDATA_COMMENT_MAXLEN).
	// The kernel would take more, but a longer comment makes `nft` refuse to load a dump
	// of the table (https://github.com/kubernetes/kubernetes/issues/139515).
	commentLengthMax = 128
)

// hashAndTruncate returns "HASH-name", HASH being the first 8 characters of the base32
// SHA-256 of name, cut to nameBaseLengthMax with a trailing "..." when too long. The hash
// keeps truncated names unique and makes similar names (endpoints differing in one
// digit) easy to tell apart.
func hashAndTruncate(name string) string {
	sum := sha256.Sum256([]byte(name))
	encoded := base32.StdEncoding.EncodeToString(sum[:])
	out := encoded[:8] + "-" + name
	if len(out) > nameBaseLengthMax {
		out = out[:nameBaseLengthMax-3] + "..."
	}
	return out
}

// servicePortNameBase returns "HASH-ns/svc/proto/port", e.g. "ULMVA6XW-ns1/svc1/tcp/p80".
// Namespace, Service and port names are DNS labels ([a-z0-9-]), all legal in chain names;
// "/" separates them because it can appear in none of them.
func servicePortNameBase(n model.ServicePortName) string {
	return hashAndTruncate(n.Namespace + "/" + n.Name + "/" + n.Protocol.Lower() + "/" + n.Port)
}

// endpointNameBase returns "HASH-ns/svc/proto/port__ip/port", e.g.
// "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80". An IPv6 address has its colons replaced by
// dots, colons being illegal in names.
func endpointNameBase(n model.ServicePortName, ep netip.AddrPort) string {
	ip := strings.ReplaceAll(ep.Addr().String(), ":", ".")
	return hashAndTruncate(n.Namespace + "/" + n.Name + "/" + n.Protocol.Lower() + "/" + n.Port +
		"__" + ip + "/" + strconv.Itoa(int(ep.Port())))
}

// serviceChainNames are the names of the chains one Service port may use.
type serviceChainNames struct {
	cluster, local, external, firewall string
}

func chainNamesFor(n model.ServicePortName) serviceChainNames {
	base := servicePortNameBase(n)
	return serviceChainNames{
		cluster:  clusterPolicyChainPrefix + base,
		local:    localPolicyChainPrefix + base,
		external: externalChainPrefix + base,
		firewall: firewallChainPrefix + base,
	}
}

// isServiceObjectName reports whether a chain or set name belongs to a Service: every
// per-service name contains a "/", and none of the fixed ones does.
func isServiceObjectName(name string) bool { return strings.Contains(name, "/") }

// truncateComment cuts s to at most commentLengthMax bytes without splitting a UTF-8
// sequence. Comments are cosmetic; an over-long one must never fail a transaction.
func truncateComment(s string) string {
	if len(s) <= commentLengthMax {
		return s
	}
	cut := commentLengthMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// markString formats a masquerade mark as upstream does ("0x4000" in rules).
func markString(mark uint32) string { return "0x" + strconv.FormatUint(uint64(mark), 16) }
