//go:build conformance

package conformance

import "github.com/sluiceproxy/sluice/test/echoserver/echo"

// capabilities are the places where backends legitimately differ, as what a client
// receives. Every case asserts the same thing for every backend unless it reads this table;
// a difference that is not written here is a bug. README.md renders this table.
type capabilities struct {
	// UnusedClusterIPPort is what a pod gets from a ClusterIP on a port that no Service
	// port uses.
	UnusedClusterIPPort []echo.Result
	// NoLocalEndpoints is what traffic gets when the policy that applies to it is Local
	// (externalTrafficPolicy for NodePort/LB/external IPs, internalTrafficPolicy for
	// ClusterIP) and the Service has endpoints, but none on the receiving node.
	NoLocalEndpoints []echo.Result
	// LocalhostNodePorts: a NodePort answers on 127.0.0.1 from the node itself.
	LocalhostNodePorts bool
}

var (
	notAnswered = []echo.Result{echo.Timeout, echo.Unreachable}
	refused     = []echo.Result{echo.Refused}
	dropped     = []echo.Result{echo.Timeout}
)

var capabilityTable = map[string]capabilities{
	// iptables never claims a ClusterIP as a whole, only its Service ports: other ports
	// leave the node by its default route (here the underlay, which answers "host
	// unreachable", or says nothing when rate-limited). Localhost NodePorts work (IPv4,
	// route_localnet), as upstream's iptables mode.
	"iptables": {UnusedClusterIPPort: notAnswered, NoLocalEndpoints: dropped, LocalhostNodePorts: true},
	// nftables rejects traffic to unused ports of a ClusterIP (upstream's cluster-ips-check)
	// and never serves NodePorts on loopback.
	"nftables": {UnusedClusterIPPort: refused, NoLocalEndpoints: dropped, LocalhostNodePorts: false},
	// IPVS binds every ClusterIP to a local dummy interface, so a port without a virtual
	// server is answered by the node's own stack (RST) or the IPVS filter's reject. A
	// Local-policy Service without local endpoints is a virtual server without real
	// servers, which IPVS answers with ICMP port unreachable: refused, not dropped. No
	// localhost NodePorts. (Expectations from upstream's IPVS mode; they are confirmed by
	// the run in the IPVS VM, hack/ipvs-vm.sh.)
	"ipvs": {UnusedClusterIPPort: refused, NoLocalEndpoints: refused, LocalhostNodePorts: false},
}
