package nftables

// Test conventions: the shared fixture's address plan and builders
// (pkg/dataplane/internal/fixture; upstream's nftables tests use the same addresses, so
// that golden output reads the same).
//
// Kernel tests build the same addresses in network namespaces (see kernel_test.go).

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fixture"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// The address plan is the shared fixture's (pkg/dataplane/internal/fixture).
const testNodeName = fixture.NodeName

var (
	testNodeIP      = fixture.NodeIPv4
	testNodeIPv6    = fixture.NodeIPv6
	testClusterCIDR = fixture.ClusterCIDRv4
	testServiceCIDR = fixture.ServiceCIDRv4
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
		cfg.LocalDetector.CIDRs = []netip.Prefix{fixture.ClusterCIDRv6}
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

// svc starts a Service port with the shared fixture's builder.
func svc(ns, name, port string, proto model.Protocol, clusterIP string, portNum int32) *fixture.Port {
	return fixture.ServicePort(ns+"/"+name, port, proto, clusterIP, portNum)
}

// nodeState builds a NodeState of the fixture's node from ports (grouped into Services by
// name).
func nodeState(f model.IPFamily, ports ...*model.ServicePort) *model.NodeState {
	return fixture.NodeState(f, fixture.Node(), ports...)
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
		ports = append(ports, b.Endpoints(list...).Build())
	}
	return nodeState(f, ports...)
}

func changed(names ...string) model.Changes { return fixture.Changed(names...) }

// examples are upstream's TestOverallNFTablesRules Services (and their IPv6 twins).
func examples(f model.IPFamily) *model.NodeState {
	if f == model.IPv6 {
		return nodeState(model.IPv6,
			svc("ns1", "svc1", "p80", model.TCP, "fd00:172:30::41", 80).Endpoints("[fd00:10:180::1]:80@local").Build(),
			svc("ns2", "svc2", "p80", model.TCP, "fd00:172:30::42", 80).NodePort(3001).ExternalIPs("2001:db8:99::22").LoadBalancer("2001:db8:1::4").ExternalLocal().Endpoints("[fd00:10:180::2]:80").Build(),
			svc("ns4", "svc4", "p80", model.UDP, "fd00:172:30::44", 80).ExternalIPs("2001:db8:99::33").Endpoints("[fd00:10:180::4]:80", "[fd00:10:180::5]:80@local").Build(),
			svc("ns5", "svc5", "p80", model.TCP, "fd00:172:30::45", 80).NodePort(3002).LoadBalancer("2001:db8:1::8").SourceRanges("2001:db8:203::/64", "2001:db8:1::/48").Affinity(10800).Endpoints("[fd00:10:180::3]:80", "[fd00:10:180::6]:8080").Build(),
			svc("ns6", "svc6", "p80", model.SCTP, "fd00:172:30::46", 80).Build(),
		)
	}
	return nodeState(model.IPv4,
		svc("ns1", "svc1", "p80", model.TCP, "172.30.0.41", 80).Endpoints("10.180.0.1:80@local").Build(),
		svc("ns2", "svc2", "p80", model.TCP, "172.30.0.42", 80).NodePort(3001).ExternalIPs("192.168.99.22").LoadBalancer("1.2.3.4").ExternalLocal().Endpoints("10.180.0.2:80").Build(),
		svc("ns4", "svc4", "p80", model.TCP, "172.30.0.44", 80).ExternalIPs("192.168.99.33").Endpoints("10.180.0.4:80", "10.180.0.5:80@local").Build(),
		svc("ns5", "svc5", "p80", model.TCP, "172.30.0.45", 80).NodePort(3002).LoadBalancer("5.6.7.8").SourceRanges("203.0.113.0/25").Affinity(10800).Endpoints("10.180.0.3:80").Build(),
		svc("ns6", "svc6", "p80", model.TCP, "172.30.0.46", 80).Build(),
	)
}
