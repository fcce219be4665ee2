package iptables

// Sysctls the iptables mode reads or sets (through hostnet.Sysctls). Both are per network
// namespace.
const (
	// sysctlRouteLocalnet lets packets to 127.0.0.0/8 be routed, which localhost NodePorts
	// need (and which https://issues.k8s.io/90259 is about: KUBE-FIREWALL mitigates it).
	sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"
	// sysctlTCPBeLiberal, when set, makes conntrack mark only out-of-window RSTs INVALID, so
	// the INVALID drop rule is not needed.
	sysctlTCPBeLiberal = "net/netfilter/nf_conntrack_tcp_be_liberal"
)
