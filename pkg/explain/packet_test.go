package explain

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Services the packet tests share; see helpers_test.go for the addressing.
var (
	web = svc{name: "web", clusterIP: "10.96.0.10",
		eps: []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b"), notReady("10.244.2.11", "node-b")}}
	empty = svc{name: "empty", clusterIP: "10.96.0.11", eps: []ep{notReady("10.244.2.10", "node-b")}}
	// internalLocal has endpoints on node-b only.
	internalLocal = svc{name: "internal-local", clusterIP: "10.96.0.12", itpLocal: true,
		eps: []ep{ready("10.244.2.10", "node-b")}}
	internalLocalHere = svc{name: "internal-local-here", clusterIP: "10.96.0.13", itpLocal: true,
		eps: []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b")}}
	nodePort = svc{name: "np", typ: v1.ServiceTypeNodePort, clusterIP: "10.96.0.20", nodePort: 30080,
		eps: []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b")}}
	// lbLocal is eTP Local with one endpoint here and one on node-b.
	lbLocal = svc{name: "lb-local", typ: v1.ServiceTypeLoadBalancer, clusterIP: "10.96.0.30", nodePort: 30081,
		lbIPs: []string{"192.0.2.11"}, etpLocal: true,
		eps: []ep{ready("10.244.1.11", "node-a"), ready("10.244.2.10", "node-b")}}
	// lbLocalElsewhere is eTP Local with its only endpoint on node-b.
	lbLocalElsewhere = svc{name: "lb-elsewhere", typ: v1.ServiceTypeLoadBalancer, clusterIP: "10.96.0.31", nodePort: 30082,
		lbIPs: []string{"192.0.2.12"}, etpLocal: true, eps: []ep{ready("10.244.2.10", "node-b")}}
	lbRanges = svc{name: "lb-ranges", typ: v1.ServiceTypeLoadBalancer, clusterIP: "10.96.0.32", nodePort: 30083,
		lbIPs: []string{"192.0.2.13"}, ranges: []string{"203.0.113.0/28", "172.18.0.0/24"},
		eps: []ep{ready("10.244.2.10", "node-b")}}
	lbRangesNoEndpoints = svc{name: "lb-ranges-empty", typ: v1.ServiceTypeLoadBalancer, clusterIP: "10.96.0.33", nodePort: 30084,
		lbIPs: []string{"192.0.2.14"}, ranges: []string{"198.51.100.0/24"}}
	externalIP = svc{name: "eip", clusterIP: "10.96.0.40", externalIPs: []string{"198.51.100.5"},
		eps: []ep{ready("10.244.2.10", "node-b")}}
	externalIPTwin = svc{name: "eip-twin", clusterIP: "10.96.0.41", externalIPs: []string{"198.51.100.5"},
		eps: []ep{ready("10.244.1.10", "node-a")}}
	sticky = svc{name: "sticky", clusterIP: "10.96.0.50", affinity: true,
		eps: []ep{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b")}}
)

func TestExplainPacket(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name   string
		svcs   []svc
		config func(*Config)
		packet Packet

		wantAction     Action
		wantCause      Cause
		wantSource     SourceKind
		wantVia        Via
		wantPolicy     Policy
		wantCandidates []string
		wantMasq       *bool
		// wantText are substrings of the verdict summary, the masquerade reason, the
		// source reason and the notes, all joined.
		wantText []string
	}{
		{
			name: "a pod reaches a ClusterIP: ready endpoints anywhere, source kept",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.0.10:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no,
			wantText: []string{"one of 2 endpoints", "in the cluster CIDR 10.244.0.0/16"},
		},
		{
			name: "a pod of another node is pod traffic too under ClusterCIDR detection",
			svcs: []svc{web}, packet: pkt(podB0, "10.96.0.10:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no,
		},
		{
			name: "the node reaches a ClusterIP: masqueraded",
			svcs: []svc{web}, packet: pkt(nodeAIP, "10.96.0.10:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceNode, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes,
			wantText: []string{"from outside the pod network is masqueraded"},
		},
		{
			name: "masqueradeAll masquerades pods too",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.0.10:80"), config: func(c *Config) { c.MasqueradeAll = true },
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes, wantText: []string{"masqueradeAll"},
		},
		{
			name: "a pod that may reach itself is masqueraded on the way back (hairpin)",
			svcs: []svc{web}, packet: pkt(netip.MustParseAddr("10.244.1.10"), "10.96.0.10:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no, wantText: []string{"hairpin"},
		},
		{
			name: "no usable endpoint anywhere: reject",
			svcs: []svc{empty}, packet: pkt(podA0, "10.96.0.11:80"),
			wantAction: ActionReject, wantCause: CauseNoEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{}, wantText: []string{"no usable endpoint anywhere"},
		},
		{
			name: "internalTrafficPolicy Local without a local endpoint: drop",
			svcs: []svc{internalLocal}, packet: pkt(podA0, "10.96.0.12:80"),
			wantAction: ActionDrop, wantCause: CauseNoLocalEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{}, wantText: []string{"internalTrafficPolicy Local and no usable endpoint on this node"},
		},
		{
			name: "internalTrafficPolicy Local without a local endpoint in ipvs mode: refused",
			svcs: []svc{internalLocal}, packet: pkt(podA0, "10.96.0.12:80"), config: func(c *Config) { c.Mode = dataplane.ModeIPVS },
			wantAction: ActionReject, wantCause: CauseNoLocalEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{}, wantText: []string{"port unreachable"},
		},
		{
			name: "internalTrafficPolicy Local: this node's endpoints only",
			svcs: []svc{internalLocalHere}, packet: pkt(podA0, "10.96.0.13:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{"10.244.1.10:8080"}, wantMasq: &no, wantText: []string{"the only candidate"},
		},
		{
			name: "a NodePort on the node IP from outside: Cluster endpoints, masqueraded",
			svcs: []svc{nodePort}, packet: pkt(externalClient, "172.18.0.2:30080"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes,
			wantText: []string{"externalTrafficPolicy Cluster: the endpoint sees the node's address"},
		},
		{
			name: "a NodePort on another local address when NodePorts answer on every local address",
			svcs: []svc{nodePort}, packet: pkt(externalClient, "10.244.1.1:30080"),
			config:     func(c *Config) { c.LocalAddresses = []netip.Addr{netip.MustParseAddr("10.244.1.1")} },
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "a NodePort on an address that is not this node's",
			svcs: []svc{nodePort}, packet: pkt(externalClient, "172.18.0.3:30080"),
			wantAction: ActionNone, wantCause: CauseNoService, wantSource: SourceExternal, wantCandidates: []string{},
			wantText: []string{"30080 is the NodePort of demo/np:http/TCP, but not on 172.18.0.3", "not a known address of this node"},
		},
		{
			name: "a NodePort outside nodePortAddresses",
			svcs: []svc{nodePort}, packet: pkt(externalClient, "172.18.0.2:30080"),
			config: func(c *Config) {
				c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}
			},
			wantAction: ActionNone, wantCause: CauseNoService, wantSource: SourceExternal, wantCandidates: []string{},
			wantText: []string{"nodePortAddresses (192.168.0.0/16) does not include it"},
		},
		{
			name: "a NodePort inside nodePortAddresses",
			svcs: []svc{nodePort}, packet: pkt(externalClient, "172.18.0.2:30080"),
			config: func(c *Config) {
				c.NodePortAddresses = dataplane.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("172.18.0.2/32")}}
			},
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "a localhost NodePort in iptables mode",
			svcs: []svc{nodePort}, packet: pkt(netip.MustParseAddr("127.0.0.1"), "127.0.0.1:30080"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceNode, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "no localhost NodePorts in nftables mode",
			svcs: []svc{nodePort}, packet: pkt(netip.MustParseAddr("127.0.0.1"), "127.0.0.1:30080"),
			config:     func(c *Config) { c.Mode = dataplane.ModeNFTables },
			wantAction: ActionNone, wantCause: CauseNoService, wantSource: SourceNode, wantCandidates: []string{},
			wantText: []string{"never answer on loopback addresses in nftables mode"},
		},
		{
			name: "externalTrafficPolicy Local from outside: this node's endpoints, client address kept",
			svcs: []svc{lbLocal}, packet: pkt(externalClient, "192.0.2.11:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{"10.244.1.11:8080"}, wantMasq: &no, wantText: []string{"sees the client's address"},
		},
		{
			name: "externalTrafficPolicy Local from a pod: short-circuited to the Cluster endpoints",
			svcs: []svc{lbLocal}, packet: pkt(podA0, "192.0.2.11:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.11:8080", "10.244.2.10:8080"}, wantMasq: &no,
		},
		{
			name: "externalTrafficPolicy Local from the node: short-circuited and masqueraded",
			svcs: []svc{lbLocal}, packet: pkt(nodeAIP, "172.18.0.2:30081"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceNode, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.11:8080", "10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "externalTrafficPolicy Local from outside with no local endpoint: drop",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(externalClient, "192.0.2.12:80"),
			wantAction: ActionDrop, wantCause: CauseNoLocalEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{}, wantText: []string{"externalTrafficPolicy Local and no usable endpoint on this node"},
		},
		{
			name: "externalTrafficPolicy Local from another node's host: external, so dropped",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(nodeBIP, "172.18.0.2:30082"),
			wantAction: ActionDrop, wantCause: CauseNoLocalEndpoints, wantSource: SourceExternal, wantVia: ViaNodePort, wantPolicy: PolicyLocal,
			wantCandidates: []string{},
		},
		{
			name: "externalTrafficPolicy Local with no local endpoint still serves pods",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(podA0, "192.0.2.12:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &no,
		},
		{
			name: "ipvs sends pods to the local endpoints under externalTrafficPolicy Local",
			svcs: []svc{lbLocal}, packet: pkt(podA0, "192.0.2.11:80"), config: func(c *Config) { c.Mode = dataplane.ModeIPVS },
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{"10.244.1.11:8080"}, wantMasq: &no, wantText: []string{"ipvs sends every source to this node's endpoints"},
		},
		{
			name: "ipvs without local endpoints: pods get the cluster's",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(podA0, "192.0.2.12:80"), config: func(c *Config) { c.Mode = dataplane.ModeIPVS },
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &no,
		},
		{
			name: "ipvs without local endpoints: outside clients are dropped",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(externalClient, "192.0.2.12:80"), config: func(c *Config) { c.Mode = dataplane.ModeIPVS },
			wantAction: ActionDrop, wantCause: CauseNoLocalEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{},
		},
		{
			name: "a source in loadBalancerSourceRanges is let through",
			svcs: []svc{lbRanges}, packet: pkt(externalClient, "192.0.2.13:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &yes, wantText: []string{},
		},
		{
			name: "a source outside loadBalancerSourceRanges is dropped",
			svcs: []svc{lbRanges}, packet: pkt(netip.MustParseAddr("203.0.113.99"), "192.0.2.13:80"),
			wantAction: ActionDrop, wantCause: CauseSourceRange, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP,
			wantCandidates: []string{}, wantText: []string{"not in the Service's loadBalancerSourceRanges"},
		},
		{
			name: "the LoadBalancer IP itself is an allowed source when the node IP is in a range",
			svcs: []svc{lbRanges}, packet: pkt(netip.MustParseAddr("192.0.2.13"), "192.0.2.13:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "NodePorts are not filtered by loadBalancerSourceRanges",
			svcs: []svc{lbRanges}, packet: pkt(netip.MustParseAddr("203.0.113.99"), "172.18.0.2:30083"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaNodePort, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "iptables rejects a Service without endpoints before checking source ranges",
			svcs: []svc{lbRangesNoEndpoints}, packet: pkt(externalClient, "192.0.2.14:80"),
			wantAction: ActionReject, wantCause: CauseNoEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{},
		},
		{
			name: "nftables checks source ranges before anything else",
			svcs: []svc{lbRangesNoEndpoints}, packet: pkt(externalClient, "192.0.2.14:80"), config: func(c *Config) { c.Mode = dataplane.ModeNFTables },
			wantAction: ActionDrop, wantCause: CauseSourceRange, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP,
			wantCandidates: []string{},
		},
		{
			name: "an externalIP",
			svcs: []svc{externalIP}, packet: pkt(externalClient, "198.51.100.5:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaExternalIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &yes,
		},
		{
			name: "two Services claiming one externalIP and port are a conflict",
			svcs: []svc{externalIP, externalIPTwin}, packet: pkt(externalClient, "198.51.100.5:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceExternal, wantVia: ViaExternalIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.2.10:8080"}, wantMasq: &yes, wantText: []string{"the API objects conflict"},
		},
		{
			name: "sessionAffinity ClientIP is explained",
			svcs: []svc{sticky}, packet: pkt(podA0, "10.96.0.50:80"),
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no,
			wantText: []string{"sessionAffinity ClientIP", "less than 60s apart"},
		},
		{
			name: "no Service matches: left alone",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.0.10:81"),
			wantAction: ActionNone, wantCause: CauseNoService, wantSource: SourcePod, wantCandidates: []string{},
			wantText: []string{"10.96.0.10 belongs to demo/web:http/TCP 80/TCP; none is 81/TCP", "routed as usual"},
		},
		{
			name: "nftables rejects an undefined port of a ClusterIP",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.0.10:81"), config: func(c *Config) { c.Mode = dataplane.ModeNFTables },
			wantAction: ActionReject, wantCause: CauseUndefinedPort, wantSource: SourcePod, wantCandidates: []string{},
		},
		{
			name: "nftables drops traffic to an unallocated Service address",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.7.7:80"), config: func(c *Config) { c.Mode = dataplane.ModeNFTables },
			wantAction: ActionDrop, wantCause: CauseUnallocatedAddress, wantSource: SourcePod, wantCandidates: []string{},
			wantText: []string{"in the Service range 10.96.0.0/16"},
		},
		{
			name: "without a detector no traffic is pod traffic",
			svcs: []svc{lbLocalElsewhere}, packet: pkt(podA0, "192.0.2.12:80"),
			config:     func(c *Config) { c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR} },
			wantAction: ActionDrop, wantCause: CauseNoLocalEndpoints, wantSource: SourceExternal, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyLocal,
			wantCandidates: []string{}, wantText: []string{"no local-traffic detector is configured"},
		},
		{
			name: "without a detector ClusterIP traffic is not masqueraded",
			svcs: []svc{web}, packet: pkt(nodeAIP, "10.96.0.10:80"),
			config:     func(c *Config) { c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalClusterCIDR} },
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourceNode, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no,
		},
		{
			name: "an interface detector: pods assumed from the node's pod CIDR",
			svcs: []svc{web}, packet: pkt(podA0, "10.96.0.10:80"),
			config: func(c *Config) {
				c.LocalDetector = dataplane.LocalDetector{Mode: dataplane.DetectLocalBridgeInterface, Interface: "cbr0"}
			},
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaClusterIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, wantMasq: &no, wantText: []string{"assumed from this node's pod CIDR"},
		},
		{
			name: "the source kind can be given",
			svcs: []svc{lbLocal},
			packet: Packet{Source: externalClient, Destination: netip.MustParseAddrPort("192.0.2.11:80"), Protocol: model.TCP,
				SourceKind: SourcePod},
			wantAction: ActionDNAT, wantCause: CauseEndpoints, wantSource: SourcePod, wantVia: ViaLoadBalancerIP, wantPolicy: PolicyCluster,
			wantCandidates: []string{"10.244.1.11:8080", "10.244.2.10:8080"}, wantMasq: &no, wantText: []string{"given on the command line"},
		},
		{
			name: "the protocol must match",
			svcs: []svc{web}, packet: Packet{Source: podA0, Destination: netip.MustParseAddrPort("10.96.0.10:80"), Protocol: model.UDP},
			wantAction: ActionNone, wantCause: CauseNoService, wantSource: SourcePod, wantCandidates: []string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := stateOf(t, tt.svcs...)
			cfg := defaultConfig()
			if tt.config != nil {
				tt.config(&cfg)
			}
			e := Explain(state, cfg, tt.packet)
			if e.Verdict.Action != tt.wantAction || e.Verdict.Cause != tt.wantCause {
				t.Errorf("verdict %+v, want %s (%s)", e.Verdict, tt.wantAction, tt.wantCause)
			}
			if e.SourceClass.Kind != tt.wantSource {
				t.Errorf("source %+v, want %s", e.SourceClass, tt.wantSource)
			}
			switch {
			case tt.wantVia == "" && e.Match != nil:
				t.Errorf("matched %+v, want no match", e.Match)
			case tt.wantVia != "" && (e.Match == nil || e.Match.Via != tt.wantVia):
				t.Errorf("matched %+v, want via %s", e.Match, tt.wantVia)
			}
			if tt.wantPolicy != "" && (e.Policy == nil || e.Policy.Applied != tt.wantPolicy) {
				t.Errorf("policy %+v, want %s", e.Policy, tt.wantPolicy)
			}
			if strings.Join(e.Candidates, ",") != strings.Join(tt.wantCandidates, ",") || e.Candidates == nil {
				t.Errorf("candidates %#v, want %v", e.Candidates, tt.wantCandidates)
			}
			switch {
			case tt.wantMasq == nil && e.Masquerade != nil:
				t.Errorf("masquerade %+v, want none (no DNAT)", e.Masquerade)
			case tt.wantMasq != nil && (e.Masquerade == nil || e.Masquerade.Masquerade != *tt.wantMasq):
				t.Errorf("masquerade %+v, want %v", e.Masquerade, *tt.wantMasq)
			}
			text := e.Verdict.Summary + "\n" + e.SourceClass.Reason + "\n" + strings.Join(e.Notes, "\n")
			if e.Masquerade != nil {
				text += "\n" + e.Masquerade.Reason
			}
			if e.Policy != nil {
				text += "\n" + e.Policy.Reason
			}
			for _, w := range tt.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("explanation lacks %q:\n%s", w, text)
				}
			}
		})
	}
}
