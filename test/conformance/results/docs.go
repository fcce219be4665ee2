package results

// Docs explain each capability of the table: the question, and why a backend answers as
// it does. The answers themselves come from the runs (capabilities.json); a capability the
// suite checks must have an entry here (TestEveryCapabilityIsDocumented).
var Docs = map[string]Doc{
	"UnusedClusterIPPort": {
		Question: "pod to a ClusterIP on a port no Service port uses",
		Why: map[string]string{
			"iptables": "iptables claims only Service ports; others leave the node by its default route, and the underlay drops them",
			"nftables": "`cluster-ips-check` refuses them: TCP with a reset (upstream: ICMP port unreachable, which an IPv6 TCP client hears of only at its SYN retransmission; differences.yaml), other protocols with ICMP port unreachable",
			"ipvs":     "the ClusterIP is local on `kube-ipvs0`, so the node's own stack or `KUBE-IPVS-FILTER` refuses them (TCP with a reset)",
		},
	},
	"NoEndpoints": {
		Question: "pod to a ClusterIP, or external client to a NodePort, of a Service with no serving endpoint",
		Why: map[string]string{
			"iptables": "TCP: a reset, so IPv6 clients are refused at once too (upstream's REJECT sends ICMP port unreachable, which an IPv6 TCP client hears of only at its SYN retransmission, a soft error on the first SYN; differences.yaml); UDP: ICMP port unreachable",
			"nftables": "`reject with tcp reset` for TCP, `reject` for UDP, as iptables",
			"ipvs":     "a virtual server without real servers: TCP gets a reset from `KUBE-IPVS-FILTER` (`KUBE-SLUICE-NO-ENDPOINTS-TCP`), UDP IPVS's own ICMP port unreachable (upstream: ICMP for both; [docs/ipvs.md](../../docs/ipvs.md#services-without-endpoints))",
		},
	},
	"InternalNoLocalEndpoints": {
		Question: "pod to a ClusterIP with `internalTrafficPolicy: Local`, endpoints exist but none on this node",
		Why: map[string]string{
			"iptables": "dropped",
			"nftables": "dropped",
			"ipvs":     "a virtual server without real servers: refused as in NoEndpoints (TCP with a reset, UDP with IPVS's ICMP port unreachable)",
		},
	},
	"ExternalNoLocalEndpoints": {
		Question: "external client to a NodePort or LoadBalancer IP with `externalTrafficPolicy: Local`, endpoints exist but none on this node",
		Why: map[string]string{
			"iptables": "dropped",
			"nftables": "dropped",
			"ipvs":     "dropped by sluice's `KUBE-SLUICE-NO-LOCAL-EPS` firewall rule (upstream's ipvs mode forwards it unmasqueraded into a black hole, by its source; its ipvs mode is not run in CI: README)",
		},
	},
	"NodePortOutsideNodePortAddresses": {
		Question: "external client to a NodePort on a node address outside `nodePortAddresses`",
		Why: map[string]string{
			"iptables": "no rule claims it; the node's own stack refuses",
			"nftables": "no rule claims it; the node's own stack refuses",
			"ipvs":     "no virtual server on that address; the node's own stack refuses",
		},
	},
	"LocalhostNodePorts": {
		Question: "NodePort on the node's loopback address, from the node",
		Why: map[string]string{
			"iptables": "IPv4 only, with `route_localnet`, as upstream's iptables mode",
			"nftables": "no localhost NodePorts (upstream's userspace proxy for them is alpha and off)",
			"ipvs":     "no localhost NodePorts",
		},
	},
	"AffinityHeldByClosedConnections": {
		Question: "a ClientIP-affine client idle past `timeoutSeconds` after closing its connections",
		Why: map[string]string{
			"iptables": "affinity counts from the last new connection",
			"nftables": "affinity counts from the last new connection",
			"ipvs":     "an IPVS persistence template lives until the connections it controls leave IPVS's table, where a closed TCP connection stays in TIME_WAIT for a fixed 2 minutes, as in upstream's ipvs mode ([docs/ipvs.md](../../docs/ipvs.md#session-affinity))",
		},
	},
}
