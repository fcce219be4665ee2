package model

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// fuzzInput is what FuzzComputeService decodes from its bytes (JSON): a Service, its
// slices and the node, so that the fuzzer mutates the API objects themselves.
type fuzzInput struct {
	Service           *v1.Service                  `json:"service"`
	Slices            []*discoveryv1.EndpointSlice `json:"slices"`
	NodeName          string                       `json:"nodeName"`
	Zone              string                       `json:"zone"`
	IPv6              bool                         `json:"ipv6"`
	IgnoreExternalIPs bool                         `json:"ignoreExternalIPs"`
	// KeepSliceLabels leaves the slices' service-name label and namespace as given;
	// otherwise they are pointed at the Service, so that most inputs reach the endpoint
	// code instead of being ignored as another Service's.
	KeepSliceLabels bool `json:"keepSliceLabels"`
}

// FuzzComputeService feeds arbitrary Services and EndpointSlices to ComputeService and
// checks that it never panics, never modifies its input, is deterministic and independent
// of slice order, and that what it returns respects the contract's invariants.
//
// Its seed corpus is testdata/fuzz/FuzzComputeService, written from fuzzSeeds by
// TestWriteFuzzSeedCorpus.
func FuzzComputeService(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var in fuzzInput
		if err := json.Unmarshal(data, &in); err != nil || in.Service == nil {
			return
		}
		if !in.KeepSliceLabels {
			for _, s := range in.Slices {
				if s != nil {
					s.Namespace = in.Service.Namespace
					if s.Labels == nil {
						s.Labels = map[string]string{}
					}
					s.Labels[discoveryv1.LabelServiceName] = in.Service.Name
				}
			}
		}
		family := IPv4
		if in.IPv6 {
			family = IPv6
		}
		node := NodeInfo{Name: in.NodeName, Zone: in.Zone}
		opts := Options{IgnoreExternalIPs: in.IgnoreExternalIPs}

		svcBefore := in.Service.DeepCopy()
		slicesBefore := deepCopySlices(in.Slices)
		ports, problems := ComputeService(in.Service, in.Slices, node, family, opts)
		if !reflect.DeepEqual(svcBefore, in.Service) || !reflect.DeepEqual(slicesBefore, in.Slices) {
			t.Fatal("ComputeService modified its input")
		}
		checkServicePorts(t, in.Service, family, node, ports)
		checkProblems(t, in.Service, problems)

		again, againProblems := ComputeService(in.Service, in.Slices, node, family, opts)
		if !portListsEqual(ports, again) || !slices.Equal(problems, againProblems) {
			t.Fatal("ComputeService is not deterministic")
		}
		if uniqueSliceNames(in.Slices) {
			reversed := slices.Clone(in.Slices)
			slices.Reverse(reversed)
			if r, _ := ComputeService(in.Service, reversed, node, family, opts); !portListsEqual(ports, r) {
				t.Fatal("the result depends on the order of the slices")
			}
		}
	})
}

func deepCopySlices(in []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	if in == nil {
		return nil
	}
	out := make([]*discoveryv1.EndpointSlice, len(in))
	for i, s := range in {
		out[i] = s.DeepCopy()
	}
	return out
}

func uniqueSliceNames(in []*discoveryv1.EndpointSlice) bool {
	seen := map[string]bool{}
	for _, s := range in {
		if s == nil {
			continue
		}
		if seen[s.Name] {
			return false
		}
		seen[s.Name] = true
	}
	return true
}

func portListsEqual(a, b []*ServicePort) bool {
	return slices.EqualFunc(a, b, (*ServicePort).Equal)
}

// checkServicePorts asserts the invariants every ServicePort must hold.
func checkServicePorts(t *testing.T, svc *v1.Service, family IPFamily, node NodeInfo, ports []*ServicePort) {
	t.Helper()
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	inFamily := func(what string, a netip.Addr) {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() || FamilyOf(a) != family || a.IsUnspecified() || a.IsMulticast() {
			t.Fatalf("%s %v is not a usable %v address", what, a, family)
		}
	}
	sortedUnique := func(what string, addrs []netip.Addr) {
		for i := 1; i < len(addrs); i++ {
			if addrs[i-1].Compare(addrs[i]) >= 0 {
				t.Fatalf("%s not sorted and unique: %v", what, addrs)
			}
		}
	}
	names := map[ServicePortName]bool{}
	numbers := map[string]bool{}
	for _, sp := range ports {
		if sp.Name.NamespacedName != name {
			t.Fatalf("port %v of Service %v", sp.Name, name)
		}
		if names[sp.Name] {
			t.Fatalf("duplicate port name %v", sp.Name)
		}
		names[sp.Name] = true
		if k := fmt.Sprint(sp.Port, sp.Name.Protocol); numbers[k] {
			t.Fatalf("duplicate port %s", k)
		} else {
			numbers[k] = true
		}
		if !slices.Contains([]Protocol{TCP, UDP, SCTP}, sp.Name.Protocol) {
			t.Fatalf("protocol %q", sp.Name.Protocol)
		}
		if !slices.Contains([]ServiceType{TypeClusterIP, TypeNodePort, TypeLoadBalancer}, sp.Type) {
			t.Fatalf("type %q", sp.Type)
		}
		if !validPort(sp.Port) || sp.NodePort < 0 || sp.NodePort > 65535 || sp.HealthCheckNodePort < 0 || sp.HealthCheckNodePort > 65535 {
			t.Fatalf("port out of range: %+v", sp)
		}
		if sp.NodePort != 0 && sp.Type == TypeClusterIP {
			t.Fatalf("NodePort on a ClusterIP port: %+v", sp)
		}
		if sp.AffinityTimeoutSeconds < 0 || sp.AffinityTimeoutSeconds > maxAffinityTimeoutSeconds {
			t.Fatalf("affinity timeout %d", sp.AffinityTimeoutSeconds)
		}
		if sp.Scheduler != "" && !ValidIPVSScheduler(sp.Scheduler) {
			t.Fatalf("scheduler %q", sp.Scheduler)
		}
		inFamily("ClusterIP", sp.ClusterIP)
		for _, a := range sp.ExternalIPs {
			inFamily("externalIP", a)
		}
		sortedUnique("externalIPs", sp.ExternalIPs)
		for _, a := range sp.LoadBalancerVIPs {
			inFamily("LB VIP", a)
		}
		sortedUnique("LB VIPs", sp.LoadBalancerVIPs)
		for i, p := range sp.LoadBalancerSourceRanges {
			if !p.IsValid() || p.Bits() == 0 || p != p.Masked() || FamilyOf(p.Addr()) != family || p.Addr().Is4In6() {
				t.Fatalf("source range %v", p)
			}
			if i > 0 && sp.LoadBalancerSourceRanges[i-1] == p {
				t.Fatalf("duplicate source range %v", p)
			}
		}

		usable := false
		for i, e := range sp.AllEndpoints {
			inFamily("endpoint", e.IP)
			if !validPort(e.Port) {
				t.Fatalf("endpoint port %d", e.Port)
			}
			if i > 0 && compareEndpointAddr(&sp.AllEndpoints[i-1], &sp.AllEndpoints[i]) >= 0 {
				t.Fatalf("endpoints not sorted and unique: %v", endpointStrings(sp.AllEndpoints))
			}
			if e.IsLocal != (node.Name != "" && e.NodeName == node.Name) {
				t.Fatalf("IsLocal wrong: %+v", e)
			}
			usable = usable || e.Ready || (e.Serving && e.Terminating)
		}
		if sp.HasAnyEndpoints != usable {
			t.Fatalf("HasAnyEndpoints = %v, want %v", sp.HasAnyEndpoints, usable)
		}
		checkSubList(t, "ClusterEndpoints", sp.ClusterEndpoints, sp.AllEndpoints, sp.UsesClusterEndpoints())
		checkSubList(t, "LocalEndpoints", sp.LocalEndpoints, sp.AllEndpoints, sp.UsesLocalEndpoints())
		for _, e := range sp.LocalEndpoints {
			if !e.IsLocal {
				t.Fatalf("remote endpoint %v in LocalEndpoints", e)
			}
		}
		if sp.UsesClusterEndpoints() && usable && len(sp.ClusterEndpoints) == 0 {
			t.Fatal("usable endpoints exist but ClusterEndpoints is empty")
		}
		if sp.Topology != TopologyNone && !sp.UsesClusterEndpoints() {
			t.Fatalf("topology %q without Cluster endpoints", sp.Topology)
		}
	}
}

// checkSubList asserts that sub is nil exactly when unused, and otherwise an ordered
// sub-list of all.
func checkSubList(t *testing.T, what string, sub, all []Endpoint, used bool) {
	t.Helper()
	if (sub != nil) != used {
		t.Fatalf("%s nil = %v, but used = %v", what, sub == nil, used)
	}
	j := 0
	for i := range sub {
		for j < len(all) && !all[j].Equal(&sub[i]) {
			j++
		}
		if j == len(all) {
			t.Fatalf("%s is not an ordered sub-list of AllEndpoints: %v vs %v", what, endpointStrings(sub), endpointStrings(all))
		}
		j++
	}
}

func checkProblems(t *testing.T, svc *v1.Service, problems []Problem) {
	t.Helper()
	if len(problems) > maxProblemsPerService+1 {
		t.Fatalf("%d problems", len(problems))
	}
	for _, p := range problems {
		if p.Service.Name != svc.Name || p.Service.Namespace != svc.Namespace || p.Object == "" || p.Message == "" {
			t.Fatalf("problem without its Service, object or message: %+v", p)
		}
		if len(p.Message) > 1024 {
			t.Fatalf("problem message of %d bytes", len(p.Message))
		}
	}
}

// FuzzParseAddress checks that address and prefix parsing never panics and normalises.
// Its seed corpus is testdata/fuzz/FuzzParseAddress, written from addressSeeds.
func FuzzParseAddress(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		if a, err := parseIP(s); err == nil {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() {
				t.Fatalf("parseIP(%q) = %v", s, a)
			}
		}
		if p, err := parsePrefix(s); err == nil {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				t.Fatalf("parsePrefix(%q) = %v", s, p)
			}
		}
	})
}

// addressSeeds are the seed corpus of FuzzParseAddress.
var addressSeeds = []string{"10.0.0.1", "010.000.000.001", "::ffff:10.0.0.1", "fe80::1%eth0", "0.0.0.0", "224.0.0.1",
	"2001:db8::1", " 10.0.0.0/8 ", "::ffff:10.0.0.0/104", "::ffff:0:0/90", "10.0.0.1/33", "0.0.0.0/0", "1.2.3.4/24"}

// structuredSeeds are the seed corpus of FuzzComputeServiceStructured: an empty input (a
// ClusterIP-less Service), a mostly-valid LoadBalancer with endpoints, and a spread of
// byte values.
var structuredSeeds = [][]byte{
	{},
	{3, 1, 0, 2, 1, 1, 1, 3, 3, 1, 1, 9, 1, 1, 0, 2, 1, 2, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1, 2, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 2, 1, 0},
	[]byte("\x02\x01\x0d\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"),
	[]byte("the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the lazy dog"),
}

// fuzzSeed is one named input of the committed seed corpus.
type fuzzSeed struct {
	name  string
	input fuzzInput
}

// fuzzSeeds are inputs worth starting from: one per interesting shape of the objects.
func fuzzSeeds() []fuzzSeed {
	lb := makeService("lb", withType(v1.ServiceTypeLoadBalancer), withClusterIPs("172.30.0.1", "fd00:30::1"), func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{
			{Name: "http", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP},
			{Name: "dns", Port: 53, NodePort: 30053, Protocol: v1.ProtocolUDP},
		}
		s.Spec.ExternalIPs = []string{"203.0.113.1", "2001:db8::1", "bad"}
		s.Spec.LoadBalancerSourceRanges = []string{" 198.51.100.0/24", "0.0.0.0/0", "2001:db8::/32"}
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
		s.Spec.HealthCheckNodePort = 32000
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](300)}}
		s.Annotations = map[string]string{AnnotationIPVSScheduler: "mh"}
		proxy := v1.LoadBalancerIPModeProxy
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.2"}, {IP: "203.0.113.3", IPMode: &proxy}, {Hostname: "x"}}
	})
	lbSlice := makeSlice("lb", "lb-1", IPv4, 8080,
		makeEndpoint("10.0.0.1", onNode("node-a", "zone-a"), zoneHints("zone-a"), nodeHints("node-a")),
		makeEndpoint("10.0.0.2", terminatingServing, zoneHints("zone-b")),
		makeEndpoint("10.0.0.3", terminatingNotServing, onNode("node-a", "zone-a")))
	lbSlice.Ports = append(lbSlice.Ports, discoveryv1.EndpointPort{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(v1.ProtocolUDP)})
	dupSlice := makeSlice("lb", "lb-2", IPv4, 8080, makeEndpoint("10.0.0.2"), makeEndpoint("10.0.0.1", terminatingServing))

	bad := makeService("bad", withType(v1.ServiceTypeNodePort), withClusterIPs("172.030.0.1", "::ffff:172.30.0.2", "nope"), func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{
			{Name: "a", Port: 0}, {Name: "b", Port: 70000}, {Name: "c", Port: 80, NodePort: -1},
			{Name: "c", Port: 81}, {Name: "d", Port: 80}, {Name: "e", Port: 82, Protocol: "ICMP"},
			{Name: "f", Port: 83, NodePort: 30000}, {Name: "g", Port: 84, NodePort: 30000},
		}
		s.Spec.ExternalIPs = []string{"", "fe80::1%eth0", "0.0.0.0", "224.0.0.1", "203.0.113.1"}
		s.Spec.LoadBalancerSourceRanges = []string{"1.2.3.4/33", "::ffff:10.0.0.0/104", "garbage"}
		s.Spec.SessionAffinity = "Sticky"
		s.Spec.ExternalTrafficPolicy = "Nearby"
		s.Annotations = map[string]string{AnnotationIPVSScheduler: "RoundRobin"}
	})
	badSlice := makeSlice("bad", "bad-1", IPv4, 8080,
		makeEndpoint("10.0.0.256"), makeEndpoint("fd00::1"), makeEndpoint("", func(e *discoveryv1.Endpoint) { e.Addresses = nil }),
		makeEndpoint("010.0.0.1"))
	badSlice.Ports = append(badSlice.Ports,
		discoveryv1.EndpointPort{Name: ptr.To("c")}, discoveryv1.EndpointPort{Name: ptr.To("c"), Port: ptr.To[int32](0)},
		discoveryv1.EndpointPort{Name: ptr.To("p80"), Port: ptr.To[int32](9090)})

	big := makeSlice("many", "many-1", IPv4, 8080)
	for i := range 300 {
		big.Endpoints = append(big.Endpoints, makeEndpoint(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String(), onNode([]string{"node-a", "node-b"}[i%2], "zone-a")))
	}

	v6 := makeService("v6", withClusterIPs("fd00:30::5"), func(s *v1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	})
	v6Slice := makeSlice("v6", "v6-1", IPv6, 8080, makeEndpoint("fd00:10::1", onNode("node-a", "zone-a")), makeEndpoint("::ffff:10.0.0.1"))
	v4InV6 := makeSlice("v6", "v6-2", IPv4, 8080, makeEndpoint("10.0.0.1"))

	return []fuzzSeed{
		{"loadbalancer-dualstack-everything", fuzzInput{Service: lb, Slices: []*discoveryv1.EndpointSlice{lbSlice, dupSlice}, NodeName: "node-a", Zone: "zone-a"}},
		{"loadbalancer-ipv6-gate-off", fuzzInput{Service: lb, Slices: []*discoveryv1.EndpointSlice{lbSlice}, NodeName: "node-a", Zone: "zone-b", IPv6: true, IgnoreExternalIPs: true}},
		{"bad-input-everywhere", fuzzInput{Service: bad, Slices: []*discoveryv1.EndpointSlice{badSlice, nil}, NodeName: "node-a"}},
		{"300-endpoints", fuzzInput{Service: makeService("many"), Slices: []*discoveryv1.EndpointSlice{big}, NodeName: "node-a", Zone: "zone-a"}},
		{"ipv6-internal-local", fuzzInput{Service: v6, Slices: []*discoveryv1.EndpointSlice{v6Slice, v4InV6}, NodeName: "node-a", IPv6: true}},
		{"headless", fuzzInput{Service: makeService("h", withClusterIPs("None"))}},
		{"externalname", fuzzInput{Service: makeService("x", withType(v1.ServiceTypeExternalName))}},
		{"foreign-slice-labels", fuzzInput{Service: makeService("a"), Slices: []*discoveryv1.EndpointSlice{makeSlice("b", "b-1", IPv4, 80, makeEndpoint("10.0.0.1"))}, KeepSliceLabels: true}},
	}
}

// TestWriteFuzzSeedCorpus writes fuzzSeeds into testdata/fuzz, the committed seed corpus
// (go test runs it as part of the fuzz tests). Run with SLUICE_WRITE_FUZZ_SEEDS=1 after
// changing fuzzSeeds.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	if os.Getenv("SLUICE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set SLUICE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	write := func(target, name, value string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("go test fuzz v1\n"+value+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, seed := range fuzzSeeds() {
		data, err := json.Marshal(seed.input)
		if err != nil {
			t.Fatal(err)
		}
		write("FuzzComputeService", seed.name, "[]byte("+strconv.Quote(string(data))+")")
	}
	for i, s := range addressSeeds {
		write("FuzzParseAddress", fmt.Sprintf("seed-%02d", i), "string("+strconv.Quote(s)+")")
	}
	for i, s := range structuredSeeds {
		write("FuzzComputeServiceStructured", fmt.Sprintf("seed-%02d", i), "[]byte("+strconv.Quote(string(s))+")")
	}
}

// fuzzBytes turns fuzzer bytes into choices; past the end every choice is 0.
type fuzzBytes struct {
	data []byte
	i    int
}

func (b *fuzzBytes) next() int {
	if b.i >= len(b.data) {
		return 0
	}
	b.i++
	return int(b.data[b.i-1])
}

func (b *fuzzBytes) upTo(n int) int { return b.next() % (n + 1) }

func pick[T any](b *fuzzBytes, list []T) T { return list[b.next()%len(list)] }

// optional returns nil or a pointer to one of list.
func optional[T any](b *fuzzBytes, list []T) *T {
	if b.next()%3 == 0 {
		return nil
	}
	v := pick(b, list)
	return &v
}

// Palettes of values the structured fuzzer builds objects from: valid and invalid ones of
// both families, so that few bytes reach every branch.
var (
	fuzzIPs = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "010.0.0.1", "::ffff:10.0.0.2", "10.0.0.256", "", "0.0.0.0",
		"224.0.0.1", "fd00::1", "fd00::2", "fe80::1%eth0", "::", "2001:db8::1", "not-an-ip"}
	fuzzCIDRs = []string{"10.0.0.0/8", " 192.0.2.0/24 ", "0.0.0.0/0", "::/0", "2001:db8::/32", "10.0.0.1/33",
		"::ffff:10.0.0.0/104", "junk", ""}
	fuzzPorts     = []int32{0, 1, 53, 80, 8080, 30000, 65535, 65536, -1}
	fuzzProtocols = []v1.Protocol{"", v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "ICMP"}
	fuzzNames     = []string{"", "http", "dns"}
	fuzzNodes     = []string{"", "node-a", "node-b"}
	fuzzZones     = []string{"", "zone-a", "zone-b"}
)

// structuredInput builds a Service and its slices from fuzzer bytes.
func structuredInput(data []byte) (*v1.Service, []*discoveryv1.EndpointSlice, NodeInfo, IPFamily, Options) {
	b := &fuzzBytes{data: data}
	svc := &v1.Service{}
	svc.Namespace, svc.Name = "ns", "svc"
	svc.Spec.Type = pick(b, []v1.ServiceType{"", v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName, "Odd"})
	for range b.upTo(3) {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, pick(b, append(fuzzIPs, "None")))
	}
	if len(svc.Spec.ClusterIPs) > 0 {
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	} else {
		svc.Spec.ClusterIP = pick(b, fuzzIPs)
	}
	for range b.upTo(4) {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: pick(b, fuzzNames), Protocol: pick(b, fuzzProtocols), Port: pick(b, fuzzPorts), NodePort: pick(b, fuzzPorts),
		})
	}
	for range b.upTo(3) {
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, pick(b, fuzzIPs))
	}
	for range b.upTo(3) {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{
			IP: pick(b, fuzzIPs), IPMode: optional(b, []v1.LoadBalancerIPMode{v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy, "Odd"}),
		})
	}
	for range b.upTo(3) {
		svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, pick(b, fuzzCIDRs))
	}
	svc.Spec.ExternalTrafficPolicy = pick(b, []v1.ServiceExternalTrafficPolicy{"", v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal, "Odd"})
	svc.Spec.InternalTrafficPolicy = optional(b, []v1.ServiceInternalTrafficPolicy{v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal, "Odd"})
	svc.Spec.HealthCheckNodePort = pick(b, fuzzPorts)
	svc.Spec.SessionAffinity = pick(b, []v1.ServiceAffinity{"", v1.ServiceAffinityNone, v1.ServiceAffinityClientIP, "Odd"})
	if t := optional(b, []int32{0, 60, 86400, 86401, -5}); t != nil {
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: t}}
	}
	if s := optional(b, []string{"rr", "mh", "", "RR", "twos "}); s != nil {
		svc.Annotations = map[string]string{AnnotationIPVSScheduler: *s}
	}
	if b.next()%8 == 0 {
		svc.Labels = map[string]string{LabelServiceProxyName: "x"}
	}

	var slices []*discoveryv1.EndpointSlice
	for i := range b.upTo(3) {
		s := &discoveryv1.EndpointSlice{}
		s.Namespace, s.Name = "ns", pick(b, []string{"s-a", "s-b", "s-c"})+strconv.Itoa(i)
		s.Labels = map[string]string{discoveryv1.LabelServiceName: pick(b, []string{"svc", "svc", "svc", "other", ""})}
		s.AddressType = pick(b, []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN})
		for range b.upTo(3) {
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{
				Name: optional(b, fuzzNames), Protocol: optional(b, fuzzProtocols), Port: optional(b, fuzzPorts),
			})
		}
		for range b.upTo(8) {
			e := discoveryv1.Endpoint{
				Conditions: discoveryv1.EndpointConditions{
					Ready: optional(b, []bool{true, false}), Serving: optional(b, []bool{true, false}), Terminating: optional(b, []bool{true, false}),
				},
				NodeName: optional(b, fuzzNodes), Zone: optional(b, fuzzZones),
			}
			for range b.upTo(2) {
				e.Addresses = append(e.Addresses, pick(b, fuzzIPs))
			}
			if h := b.next() % 4; h > 0 {
				e.Hints = &discoveryv1.EndpointHints{}
				for range h >> 1 {
					e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: pick(b, fuzzZones)})
				}
				for range h & 1 {
					e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: pick(b, fuzzNodes)})
				}
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		slices = append(slices, s)
	}
	node := NodeInfo{Name: pick(b, fuzzNodes), Zone: pick(b, fuzzZones)}
	family := pick(b, Families)
	return svc, slices, node, family, Options{IgnoreExternalIPs: b.next()%4 == 0}
}

// FuzzComputeServiceStructured is FuzzComputeService with objects built from palettes of
// good and bad values instead of decoded from JSON: almost every input is meaningful, so
// it explores far more per second. Seeds: testdata/fuzz/FuzzComputeServiceStructured.
func FuzzComputeServiceStructured(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		svc, slices, node, family, opts := structuredInput(data)
		svcBefore, slicesBefore := svc.DeepCopy(), deepCopySlices(slices)
		ports, problems := ComputeService(svc, slices, node, family, opts)
		if !reflect.DeepEqual(svcBefore, svc) || !reflect.DeepEqual(slicesBefore, slices) {
			t.Fatal("ComputeService modified its input")
		}
		checkServicePorts(t, svc, family, node, ports)
		checkProblems(t, svc, problems)
		if uniqueSliceNames(slices) {
			reversed := append([]*discoveryv1.EndpointSlice(nil), slices...)
			for i, j := 0, len(reversed)-1; i < j; i, j = i+1, j-1 {
				reversed[i], reversed[j] = reversed[j], reversed[i]
			}
			if r, _ := ComputeService(svc, reversed, node, family, opts); !portListsEqual(ports, r) {
				t.Fatal("the result depends on the order of the slices")
			}
		}
	})
}
