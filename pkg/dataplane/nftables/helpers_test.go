package nftables

// Test conventions (as in upstream's nftables tests, so that golden output reads the
// same):
//
//	Cluster (pod) CIDR:  10.0.0.0/8          Pod IPs:           10.180.0.0/16
//	ServiceCIDR:         172.30.0.0/16       Node IP:           192.168.0.2
//	External IPs:        192.168.99.0/24     LoadBalancer IPs:  1.2.3.4, 5.6.7.8
//	IPv6: cluster fd00:10::/64, pods fd00:10:180::/64, services fd00:172:30::/112,
//	node 2001:db8::1
//
// Kernel tests build the same addresses in network namespaces (see kernel_test.go).

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

const testNodeName = "node-a"

var (
	testNodeIP      = netip.MustParseAddr("192.168.0.2")
	testNodeIPv6    = netip.MustParseAddr("2001:db8::1")
	testClusterCIDR = netip.MustParsePrefix("10.0.0.0/8")
	testServiceCIDR = netip.MustParsePrefix("172.30.0.0/16")
)

// testConfig is the dataplane.Config the tests use: ClusterCIDR detection and
// nodePortAddresses "primary" (the node IP), nftables' defaults.
func testConfig(f model.IPFamily) dataplane.Config {
	cfg := dataplane.Config{
		Family: f, NodeName: testNodeName, MasqueradeBit: 14, SyncPeriod: time.Hour,
		LocalDetector:     dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR, CIDRs: []netip.Prefix{testClusterCIDR}},
		NodePortAddresses: dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.PrefixFrom(testNodeIP, 32)}},
	}
	if f == model.IPv6 {
		cfg.LocalDetector.CIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}
		cfg.NodePortAddresses.CIDRs = []netip.Prefix{netip.PrefixFrom(testNodeIPv6, 128)}
	}
	return cfg
}

func testLayout(cfg dataplane.Config, serviceCIDRs ...netip.Prefix) *layoutConfig {
	return &layoutConfig{
		f: familyOf(cfg.Family), mark: 1 << uint(cfg.MasqueradeBit), masqueradeAll: cfg.MasqueradeAll,
		localDetector: cfg.LocalDetector, nodePortMatchAll: cfg.NodePortAddresses.MatchAll,
		nodePortCIDRs: cfg.NodePortAddresses.CIDRs, serviceCIDRs: serviceCIDRs,
	}
}

// svcBuilder builds one ServicePort.
type svcBuilder struct{ sp *model.ServicePort }

func svc(ns, name, port string, proto model.Protocol, clusterIP string, portNum int32) *svcBuilder {
	return &svcBuilder{sp: &model.ServicePort{
		Name:      model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto},
		Type:      model.TypeClusterIP,
		ClusterIP: netip.MustParseAddr(clusterIP),
		Port:      portNum,
	}}
}

func (b *svcBuilder) nodePort(p int32) *svcBuilder {
	b.sp.NodePort = p
	b.sp.Type = model.TypeNodePort
	return b
}

func (b *svcBuilder) externalIPs(ips ...string) *svcBuilder {
	for _, ip := range ips {
		b.sp.ExternalIPs = append(b.sp.ExternalIPs, netip.MustParseAddr(ip))
	}
	return b
}

func (b *svcBuilder) lb(ips ...string) *svcBuilder {
	b.sp.Type = model.TypeLoadBalancer
	for _, ip := range ips {
		b.sp.LoadBalancerVIPs = append(b.sp.LoadBalancerVIPs, netip.MustParseAddr(ip))
	}
	return b
}

func (b *svcBuilder) sourceRanges(ps ...string) *svcBuilder {
	for _, p := range ps {
		b.sp.LoadBalancerSourceRanges = append(b.sp.LoadBalancerSourceRanges, netip.MustParsePrefix(p))
	}
	return b
}

func (b *svcBuilder) affinity(seconds int32) *svcBuilder {
	b.sp.AffinityTimeoutSeconds = seconds
	return b
}

func (b *svcBuilder) etpLocal() *svcBuilder {
	b.sp.ExternalPolicyLocal = true
	return b
}

func (b *svcBuilder) itpLocal() *svcBuilder {
	b.sp.InternalPolicyLocal = true
	return b
}

// endpoints sets the endpoints ("ip:port", a trailing "@local" marks this node's) and
// derives the cluster and local lists as the model does for ready endpoints.
func (b *svcBuilder) endpoints(eps ...string) *svcBuilder {
	b.sp.AllEndpoints = nil
	for _, e := range eps {
		local := false
		if s, ok := cutSuffix(e, "@local"); ok {
			e, local = s, true
		}
		ap := netip.MustParseAddrPort(e)
		node := "node-b"
		if local {
			node = testNodeName
		}
		b.sp.AllEndpoints = append(b.sp.AllEndpoints, model.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()),
			Ready: true, Serving: true, NodeName: node, IsLocal: local})
	}
	return b
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return s, false
}

// build finishes the port: endpoint lists per policy, as pkg/model computes them for
// ready endpoints.
func (b *svcBuilder) build() *model.ServicePort {
	sp := b.sp
	if sp.ExternallyAccessible() == false {
		sp.ExternalPolicyLocal = false
	}
	sp.ClusterEndpoints, sp.LocalEndpoints = nil, nil
	if sp.UsesClusterEndpoints() {
		sp.ClusterEndpoints = slices.Clone(sp.AllEndpoints)
	}
	if sp.UsesLocalEndpoints() {
		for _, ep := range sp.AllEndpoints {
			if ep.IsLocal {
				sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
			}
		}
	}
	sp.HasAnyEndpoints = len(sp.AllEndpoints) > 0
	return sp
}

// nodeState builds a NodeState from ports (grouped into Services by name).
func nodeState(f model.IPFamily, ports ...*model.ServicePort) *model.NodeState {
	node := model.NodeInfo{Name: testNodeName, IPs: []netip.Addr{testNodeIP, testNodeIPv6}}
	ns := model.NewNodeState(f, node)
	ns.ServiceCIDRs = []netip.Prefix{testServiceCIDR}
	if f == model.IPv6 {
		ns.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:172:30::/112")}
	}
	byName := map[types.NamespacedName][]*model.ServicePort{}
	var order []types.NamespacedName
	for _, sp := range ports {
		n := sp.Name.NamespacedName
		if _, ok := byName[n]; !ok {
			order = append(order, n)
		}
		byName[n] = append(byName[n], sp)
	}
	for _, n := range order {
		ns.SetService(n, byName[n], nil)
	}
	return ns
}

// scaleState builds n ClusterIP Services with eps endpoints each (for scale tests).
func scaleState(f model.IPFamily, n, eps int) *model.NodeState {
	var ports []*model.ServicePort
	for i := 0; i < n; i++ {
		cip := fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
		b := svc(fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc%d", i), "http", model.TCP, cip, 80)
		var list []string
		for j := 0; j < eps; j++ {
			k := i*eps + j
			list = append(list, fmt.Sprintf("10.%d.%d.%d:8080", 100+k/65536, (k/256)%256, k%256))
		}
		ports = append(ports, b.endpoints(list...).build())
	}
	return nodeState(f, ports...)
}

func changed(names ...string) model.Changes {
	s := sets.New[types.NamespacedName]()
	for _, n := range names {
		ns, name, _ := cutSlash(n)
		s.Insert(types.NamespacedName{Namespace: ns, Name: name})
	}
	return model.Changes{Services: s}
}

func cutSlash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}

// examples are upstream's TestOverallNFTablesRules Services (and their IPv6 twins).
func examples(f model.IPFamily) *model.NodeState {
	if f == model.IPv6 {
		return nodeState(model.IPv6,
			svc("ns1", "svc1", "p80", model.TCP, "fd00:172:30::41", 80).endpoints("[fd00:10:180::1]:80@local").build(),
			svc("ns2", "svc2", "p80", model.TCP, "fd00:172:30::42", 80).nodePort(3001).externalIPs("2001:db8:99::22").lb("2001:db8:1::4").etpLocal().endpoints("[fd00:10:180::2]:80").build(),
			svc("ns4", "svc4", "p80", model.UDP, "fd00:172:30::44", 80).externalIPs("2001:db8:99::33").endpoints("[fd00:10:180::4]:80", "[fd00:10:180::5]:80@local").build(),
			svc("ns5", "svc5", "p80", model.TCP, "fd00:172:30::45", 80).nodePort(3002).lb("2001:db8:1::8").sourceRanges("2001:db8:203::/64", "2001:db8:1::/48").affinity(10800).endpoints("[fd00:10:180::3]:80", "[fd00:10:180::6]:8080").build(),
			svc("ns6", "svc6", "p80", model.SCTP, "fd00:172:30::46", 80).build(),
		)
	}
	return nodeState(model.IPv4,
		svc("ns1", "svc1", "p80", model.TCP, "172.30.0.41", 80).endpoints("10.180.0.1:80@local").build(),
		svc("ns2", "svc2", "p80", model.TCP, "172.30.0.42", 80).nodePort(3001).externalIPs("192.168.99.22").lb("1.2.3.4").etpLocal().endpoints("10.180.0.2:80").build(),
		svc("ns4", "svc4", "p80", model.TCP, "172.30.0.44", 80).externalIPs("192.168.99.33").endpoints("10.180.0.4:80", "10.180.0.5:80@local").build(),
		svc("ns5", "svc5", "p80", model.TCP, "172.30.0.45", 80).nodePort(3002).lb("5.6.7.8").sourceRanges("203.0.113.0/25").affinity(10800).endpoints("10.180.0.3:80").build(),
		svc("ns6", "svc6", "p80", model.TCP, "172.30.0.46", 80).build(),
	)
}
