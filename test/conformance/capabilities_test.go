//go:build conformance

package conformance

import (
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

// capabilities are the places where backends legitimately differ, as what a client
// receives. Every case asserts the same thing for every backend unless it reads this table;
// a difference that is not written here is a bug. README.md renders this table.
type capabilities struct {
	// UnusedClusterIPPort is what a pod gets from a ClusterIP on a port that no Service
	// port uses.
	UnusedClusterIPPort []echo.Result
	// InternalNoLocalEndpoints is what a pod gets from a ClusterIP whose Service has
	// internalTrafficPolicy Local and endpoints, but none on the pod's node.
	InternalNoLocalEndpoints []echo.Result
	// ExternalNoLocalEndpoints is what an external client gets from a NodePort, LoadBalancer
	// IP or external IP whose Service has externalTrafficPolicy Local and endpoints, but
	// none on the receiving node.
	ExternalNoLocalEndpoints []echo.Result
	// LocalhostNodePorts: a NodePort answers on 127.0.0.1 from the node itself.
	LocalhostNodePorts bool
	// AffinityHeldByClosedConnections is how long a closed TCP connection keeps its
	// client's ClientIP affinity alive, on top of timeoutSeconds of idleness.
	AffinityHeldByClosedConnections time.Duration
}

var (
	notAnswered = []echo.Result{echo.Timeout, echo.Unreachable}
	refused     = []echo.Result{echo.Refused}
	dropped     = []echo.Result{echo.Timeout}
)

// ipvsTCPTimeWait is IPVS's fixed TIME_WAIT timeout for TCP connections (2 minutes,
// net/netfilter/ipvs/ip_vs_proto_tcp.c); ipvsadm --set changes only established, FIN_WAIT
// and UDP.
const ipvsTCPTimeWait = 2 * time.Minute

var capabilityTable = map[string]capabilities{
	// iptables never claims a ClusterIP as a whole, only its Service ports: other ports
	// leave the node by its default route (here the underlay, which answers "host
	// unreachable", or says nothing when rate-limited). Local policy without local
	// endpoints drops. Localhost NodePorts work (IPv4, route_localnet), as upstream's
	// iptables mode. Affinity (xt_recent) counts from the client's last new connection.
	"iptables": {
		UnusedClusterIPPort:      notAnswered,
		InternalNoLocalEndpoints: dropped, ExternalNoLocalEndpoints: dropped,
		LocalhostNodePorts: true,
	},
	// nftables rejects traffic to unused ports of a ClusterIP (upstream's cluster-ips-check),
	// drops Local-policy traffic without local endpoints, and never serves NodePorts on
	// loopback. Affinity (a timeout set) counts from the last new connection.
	"nftables": {
		UnusedClusterIPPort:      refused,
		InternalNoLocalEndpoints: dropped, ExternalNoLocalEndpoints: dropped,
	},
	// IPVS binds every ClusterIP to a local dummy interface, so a port without a virtual
	// server is answered by the node's own stack (RST) or the IPVS filter's reject.
	// internalTrafficPolicy Local without local endpoints is a ClusterIP virtual server
	// without real servers, which IPVS answers with ICMP port unreachable: refused.
	// externalTrafficPolicy Local without local endpoints: sluice drops outside traffic
	// (KUBE-SLUICE-NO-LOCAL-EPS) like the other modes, where upstream's ipvs mode forwards
	// it unmasqueraded into a black hole (docs/ipvs.md). No localhost NodePorts. A
	// persistence template lives until the connections it controls are gone from IPVS's
	// table, where a closed TCP connection stays in TIME_WAIT, and timeoutSeconds after
	// that (upstream's ipvs mode alike). Confirmed by the run in the IPVS VM
	// (hack/ipvs-vm.sh).
	"ipvs": {
		UnusedClusterIPPort:      refused,
		InternalNoLocalEndpoints: refused, ExternalNoLocalEndpoints: dropped,
		AffinityHeldByClosedConnections: ipvsTCPTimeWait,
	},
}
