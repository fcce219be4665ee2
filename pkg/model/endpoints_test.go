package model

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

func TestComputeServiceEndpoints(t *testing.T) {
	twoPorts := makeService("a", withPorts(
		v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}))
	withSlicePorts := func(s *discoveryv1.EndpointSlice, ports ...discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
		s.Ports = ports
		return s
	}
	port := func(name string, proto v1.Protocol, n int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(n)}
	}
	// nonTerminatingCopyWins checks the one endpoint kept of a duplicate: the ready copy
	// (makeEndpoint's default node, node-b), not the terminating one on node-c.
	nonTerminatingCopyWins := func(t *testing.T, ports []*ServicePort, _ []Problem) {
		t.Helper()
		if e := ports[0].AllEndpoints[0]; e.Terminating || e.NodeName != "node-b" {
			t.Errorf("terminating copy won: %+v", e)
		}
	}

	tests := []struct {
		name   string
		svc    *v1.Service
		slices []*discoveryv1.EndpointSlice
		// want maps each port name to its AllEndpoints as ip:port strings.
		want  map[string][]string
		check func(t *testing.T, ports []*ServicePort, problems []Problem)
	}{
		{
			name: "named target port: endpoints carry the slice's port number",
			svc:  makeService("a", withPorts(v1.ServicePort{Name: "p80", Port: 80})),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1"), makeEndpoint("10.0.0.2")),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080", "10.0.0.2:8080"}},
		},
		{
			name: "endpoints merged per Service port by slice port name and protocol",
			svc:  twoPorts,
			slices: []*discoveryv1.EndpointSlice{
				withSlicePorts(makeSlice("a", "a-1", IPv4, 0, makeEndpoint("10.0.0.1")),
					port("http", v1.ProtocolTCP, 8080), port("dns", v1.ProtocolUDP, 5353), port("dns", v1.ProtocolTCP, 5354)),
				withSlicePorts(makeSlice("a", "a-2", IPv4, 0, makeEndpoint("10.0.0.2")),
					port("http", v1.ProtocolTCP, 8081)),
			},
			want: map[string][]string{
				"http": {"10.0.0.1:8080", "10.0.0.2:8081"},
				"dns":  {"10.0.0.1:5353"},
			},
		},
		{
			name: "slice port of another protocol is not matched",
			svc:  makeService("a", withPorts(v1.ServicePort{Name: "p80", Port: 80, Protocol: v1.ProtocolUDP})),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")),
			},
			want: map[string][]string{"p80": nil},
		},
		{
			name: "nil slice port name means the unnamed port, nil protocol means TCP",
			svc:  makeService("a", withPorts(v1.ServicePort{Port: 80})),
			slices: []*discoveryv1.EndpointSlice{
				withSlicePorts(makeSlice("a", "a-1", IPv4, 0, makeEndpoint("10.0.0.1")), discoveryv1.EndpointPort{Port: ptr.To[int32](8080)}),
			},
			want: map[string][]string{"": {"10.0.0.1:8080"}},
		},
		{
			name: "endpoints merged across slices and sorted by ip:port",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-2", IPv4, 8080, makeEndpoint("10.0.0.10"), makeEndpoint("10.0.0.9")),
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.2"), makeEndpoint("10.0.0.100")),
				makeSlice("a", "a-3", IPv4, 80, makeEndpoint("10.0.0.9")),
			},
			want: map[string][]string{"p80": {"10.0.0.2:8080", "10.0.0.9:80", "10.0.0.9:8080", "10.0.0.10:8080", "10.0.0.100:8080"}},
		},
		{
			name: "slices of the other address family and FQDN slices ignored",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-v6", IPv6, 8080, makeEndpoint("fd00:10::1")),
				func() *discoveryv1.EndpointSlice {
					s := makeSlice("a", "a-fqdn", IPv4, 8080, makeEndpoint("example.com"))
					s.AddressType = discoveryv1.AddressTypeFQDN
					return s
				}(),
				makeSlice("a", "a-v4", IPv4, 8080, makeEndpoint("10.0.0.1")),
			},
			want:  map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: func(t *testing.T, _ []*ServicePort, problems []Problem) { wantNoProblems(t, problems) },
		},
		{
			name: "slice labelled for another Service or headless ignored",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("b", "b-1", IPv4, 8080, makeEndpoint("10.0.0.1")),
				func() *discoveryv1.EndpointSlice {
					s := makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.2"))
					s.Labels[v1.IsHeadlessService] = ""
					return s
				}(),
			},
			want: map[string][]string{"p80": nil},
		},
		{
			name: "duplicate endpoint across slices: non-terminating wins (terminating copy first)",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1", terminatingServing, onNode("node-c", "zone-a"))),
				makeSlice("a", "a-2", IPv4, 8080, makeEndpoint("10.0.0.1")),
			},
			want:  map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: nonTerminatingCopyWins,
		},
		{
			name: "duplicate endpoint across slices: non-terminating wins (terminating copy last)",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")),
				makeSlice("a", "a-2", IPv4, 8080, makeEndpoint("10.0.0.1", terminatingServing, onNode("node-c", "zone-a"))),
			},
			want:  map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: nonTerminatingCopyWins,
		},
		{
			name: "duplicate endpoint, both ready: the first slice by name wins whatever the input order",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-2", IPv4, 8080, makeEndpoint("10.0.0.1", onNode("node-c", "zone-a"))),
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: func(t *testing.T, ports []*ServicePort, _ []Problem) {
				if e := ports[0].AllEndpoints[0]; e.NodeName != "node-b" {
					t.Errorf("got %+v", e)
				}
			},
		},
		{
			name: "unset conditions mean ready and serving, not terminating",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1")),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: func(t *testing.T, ports []*ServicePort, _ []Problem) {
				if e := ports[0].AllEndpoints[0]; !e.Ready || !e.Serving || e.Terminating {
					t.Errorf("got %+v", e)
				}
			},
		},
		{
			name: "only the first address of an endpoint is used",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080, makeEndpoint("10.0.0.1", func(e *discoveryv1.Endpoint) {
					e.Addresses = append(e.Addresses, "10.0.0.2")
				})),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080"}},
		},
		{
			name: "endpoint on this node is local, hints and zone copied",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080,
					makeEndpoint("10.0.0.1", onNode("node-a", "zone-a"), zoneHints("zone-a"), nodeHints("node-a")),
					makeEndpoint("10.0.0.2")),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080", "10.0.0.2:8080"}},
			check: func(t *testing.T, ports []*ServicePort, _ []Problem) {
				eps := ports[0].AllEndpoints
				if !eps[0].IsLocal || eps[0].Zone != "zone-a" || eps[0].ZoneHints()[0] != "zone-a" || eps[0].NodeHints()[0] != "node-a" || eps[1].IsLocal {
					t.Errorf("got %+v", eps)
				}
			},
		},
		{
			name: "invalid endpoint addresses skipped with problems, the rest kept",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				makeSlice("a", "a-1", IPv4, 8080,
					makeEndpoint("10.0.0.1"),
					makeEndpoint("10.0.0.256"),
					makeEndpoint("fd00:10::1"),
					makeEndpoint("", func(e *discoveryv1.Endpoint) { e.Addresses = nil }),
					makeEndpoint("10.0.0.2")),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080", "10.0.0.2:8080"}},
			check: func(t *testing.T, _ []*ServicePort, problems []Problem) {
				wantProblem(t, problems, "endpoints[1].addresses[0]", "not an IP address")
				wantProblem(t, problems, "endpoints[2].addresses[0]", "not an IPv4 address")
				wantProblem(t, problems, "endpoints[3].addresses", "no address")
				if problems[0].Object != "EndpointSlice ns/a-1" {
					t.Errorf("object %q", problems[0].Object)
				}
			},
		},
		{
			name: "invalid slice ports skipped with problems",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				withSlicePorts(makeSlice("a", "a-1", IPv4, 0, makeEndpoint("10.0.0.1")),
					discoveryv1.EndpointPort{Name: ptr.To("p80")},
					port("p80", v1.ProtocolTCP, 0),
					port("p80", v1.ProtocolTCP, 65536),
					port("p80", "ICMP", 1),
					port("p80", v1.ProtocolTCP, 8080),
					port("p80", v1.ProtocolTCP, 8081)),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: func(t *testing.T, _ []*ServicePort, problems []Problem) {
				wantProblem(t, problems, "ports[0].port", "unset is not a valid port")
				wantProblem(t, problems, "ports[1].port", "0 is not a valid port")
				wantProblem(t, problems, "ports[2].port", "65536 is not a valid port")
				wantProblem(t, problems, "ports[3].protocol", "unknown protocol")
				wantProblem(t, problems, "ports[5].name", "another port is named")
			},
		},
		{
			name: "problems are capped with a summary",
			svc:  makeService("a"),
			slices: []*discoveryv1.EndpointSlice{
				func() *discoveryv1.EndpointSlice {
					s := makeSlice("a", "a-1", IPv4, 8080)
					for i := range 1000 {
						s.Endpoints = append(s.Endpoints, makeEndpoint(fmt.Sprintf("bad-%d", i)))
					}
					s.Endpoints = append(s.Endpoints, makeEndpoint("10.0.0.1"))
					return s
				}(),
			},
			want: map[string][]string{"p80": {"10.0.0.1:8080"}},
			check: func(t *testing.T, _ []*ServicePort, problems []Problem) {
				if len(problems) != maxProblemsPerService+1 {
					t.Fatalf("%d problems", len(problems))
				}
				wantProblem(t, problems, "", fmt.Sprintf("%d more problems", 1000-maxProblemsPerService))
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ports, problems := ComputeService(tc.svc, tc.slices, testNode, IPv4, Options{})
			got := map[string][]string{}
			for _, sp := range ports {
				got[sp.Name.Port] = endpointStrings(sp.AllEndpoints)
			}
			if d := diff(tc.want, got); d != "" {
				t.Errorf("AllEndpoints (-want +got):\n%s", d)
			}
			if tc.check != nil {
				tc.check(t, ports, problems)
			}
		})
	}
}

// tenThousandDuplicatedEndpoints is one Service's 10 000 endpoints in a slice, and the
// same endpoints again in a second slice, reversed: all duplicates.
func tenThousandDuplicatedEndpoints() []*discoveryv1.EndpointSlice {
	s := makeSlice("a", "a-1", IPv4, 8080)
	for i := range 10000 {
		s.Endpoints = append(s.Endpoints, makeEndpoint(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String()))
	}
	s2 := makeSlice("a", "a-2", IPv4, 8080)
	for i := len(s.Endpoints) - 1; i >= 0; i-- {
		s2.Endpoints = append(s2.Endpoints, s.Endpoints[i])
	}
	return []*discoveryv1.EndpointSlice{s, s2}
}

func TestTenThousandEndpointsInOneSlice(t *testing.T) {
	ports, problems := ComputeService(makeService("a"), tenThousandDuplicatedEndpoints(), testNode, IPv4, Options{})
	wantNoProblems(t, problems)
	sp := onePort(t, ports)
	if len(sp.AllEndpoints) != 10000 || len(sp.ClusterEndpoints) != 10000 {
		t.Fatalf("%d endpoints, %d cluster endpoints", len(sp.AllEndpoints), len(sp.ClusterEndpoints))
	}
	for i := 1; i < len(sp.AllEndpoints); i++ {
		if compareEndpointAddr(&sp.AllEndpoints[i-1], &sp.AllEndpoints[i]) >= 0 {
			t.Fatalf("not sorted at %d", i)
		}
	}
}

// BenchmarkTenThousandEndpointsInOneSlice keeps the merge of duplicated endpoints
// O(n log n); it replaces a wall-clock limit that failed under -race on a busy machine.
func BenchmarkTenThousandEndpointsInOneSlice(b *testing.B) {
	slices := tenThousandDuplicatedEndpoints()
	svc := makeService("a")
	for b.Loop() {
		ComputeService(svc, slices, testNode, IPv4, Options{})
	}
}
