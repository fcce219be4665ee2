package model

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// onePort fails unless ports holds exactly one port, and returns it.
func onePort(t *testing.T, ports []*ServicePort) *ServicePort {
	t.Helper()
	if len(ports) != 1 {
		t.Fatalf("got %d ports, want 1: %+v", len(ports), ports)
	}
	return ports[0]
}

// wantProblem fails unless some problem's field is field and its message contains msg.
func wantProblem(t *testing.T, problems []Problem, field, msg string) {
	t.Helper()
	for _, p := range problems {
		if p.Field == field && strings.Contains(p.Message, msg) {
			if p.Service.Name == "" || p.Object == "" {
				t.Errorf("problem %v does not name its Service and object", p)
			}
			return
		}
	}
	t.Errorf("no problem for %s containing %q; got %v", field, msg, problems)
}

func wantNoProblems(t *testing.T, problems []Problem) {
	t.Helper()
	if len(problems) > 0 {
		t.Errorf("unexpected problems: %v", problems)
	}
}

func TestComputeServiceFields(t *testing.T) {
	lbStatus := func(ings ...v1.LoadBalancerIngress) func(*v1.Service) {
		return func(s *v1.Service) { s.Status.LoadBalancer.Ingress = ings }
	}
	ipMode := func(m v1.LoadBalancerIPMode) *v1.LoadBalancerIPMode { return &m }
	etp := func(p v1.ServiceExternalTrafficPolicy) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = p }
	}
	annotate := func(k, v string) func(*v1.Service) {
		return func(s *v1.Service) { s.Annotations = map[string]string{k: v} }
	}

	// The checks several rows share: nothing at all; one port with this ClusterIP (or
	// session affinity timeout) and no problem; no port and a problem naming field with msg.
	yieldsNothing := func(t *testing.T, ports []*ServicePort, problems []Problem) {
		t.Helper()
		if len(ports) != 0 || len(problems) != 0 {
			t.Errorf("got %v %v, want no port and no problem", ports, problems)
		}
	}
	yieldsClusterIP := func(ip string) func(*testing.T, []*ServicePort, []Problem) {
		return func(t *testing.T, ports []*ServicePort, problems []Problem) {
			t.Helper()
			if sp := onePort(t, ports); sp.ClusterIP.String() != ip {
				t.Errorf("ClusterIP %v, want %s", sp.ClusterIP, ip)
			}
			wantNoProblems(t, problems)
		}
	}
	yieldsAffinityTimeout := func(seconds int32) func(*testing.T, []*ServicePort, []Problem) {
		return func(t *testing.T, ports []*ServicePort, problems []Problem) {
			t.Helper()
			if sp := onePort(t, ports); sp.AffinityTimeoutSeconds != seconds {
				t.Errorf("timeout %d, want %d", sp.AffinityTimeoutSeconds, seconds)
			}
			wantNoProblems(t, problems)
		}
	}
	refusedWith := func(field, msg string) func(*testing.T, []*ServicePort, []Problem) {
		return func(t *testing.T, ports []*ServicePort, problems []Problem) {
			t.Helper()
			if len(ports) != 0 {
				t.Errorf("got ports %v", ports)
			}
			wantProblem(t, problems, field, msg)
		}
	}

	tests := []struct {
		name   string
		svc    *v1.Service
		family IPFamily
		opts   Options
		check  func(t *testing.T, ports []*ServicePort, problems []Problem)
	}{
		{
			name: "ClusterIP service yields its port",
			svc:  makeService("a"),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				sp := onePort(t, ports)
				want := ServicePortName{NamespacedName: nn("a"), Port: "p80", Protocol: TCP}
				if sp.Name != want || sp.Type != TypeClusterIP || sp.ClusterIP.String() != "172.30.0.1" || sp.Port != 80 || sp.NodePort != 0 {
					t.Errorf("got %+v", sp)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name:  "ExternalName skipped",
			svc:   makeService("a", withType(v1.ServiceTypeExternalName)),
			check: yieldsNothing,
		},
		{
			name:  "headless skipped",
			svc:   makeService("a", withClusterIPs("None")),
			check: yieldsNothing,
		},
		{
			name: "service-proxy-name label skipped whatever its value",
			svc:  makeService("a", func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: ""} }),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if len(ports) != 0 {
					t.Errorf("got %v", ports)
				}
			},
		},
		{
			name:  "Service without ClusterIP skipped",
			svc:   makeService("a", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
			check: yieldsNothing,
		},
		{
			name:   "single-stack IPv4 service has nothing in IPv6",
			svc:    makeService("a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"bad"} }),
			family: IPv6,
			// Problems of a Service with nothing in this family would be noise.
			check: yieldsNothing,
		},
		{
			name:   "dual-stack service yields the IPv6 ClusterIP in IPv6",
			svc:    makeService("a", withClusterIPs("172.30.0.1", "fd00:30::1")),
			family: IPv6,
			check:  yieldsClusterIP("fd00:30::1"),
		},
		{
			name:  "legacy spec.clusterIP used when clusterIPs is unset",
			svc:   makeService("a", func(s *v1.Service) { s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil }),
			check: yieldsClusterIP("172.30.0.1"),
		},
		{
			name:  "invalid ClusterIP reported and nothing programmed",
			svc:   makeService("a", withClusterIPs("172.30.0.300")),
			check: refusedWith("spec.clusterIPs[0]", "not an IP address"),
		},
		{
			name:  "leading-zero IPv4 ClusterIP read as decimal like upstream",
			svc:   makeService("a", withClusterIPs("172.030.000.010")),
			check: yieldsClusterIP("172.30.0.10"),
		},
		{
			name:  "IPv4-mapped ClusterIP treated as IPv4",
			svc:   makeService("a", withClusterIPs("::ffff:172.30.0.1")),
			check: yieldsClusterIP("172.30.0.1"),
		},
		{
			name:  "unspecified ClusterIP refused",
			svc:   makeService("a", withClusterIPs("0.0.0.0")),
			check: refusedWith("spec.clusterIPs[0]", "not a unicast address"),
		},
		{
			name: "NodePort kept for NodePort service",
			svc: makeService("a", withType(v1.ServiceTypeNodePort),
				withPorts(v1.ServicePort{Name: "p80", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.NodePort != 30080 || sp.Type != TypeNodePort {
					t.Errorf("got %+v", sp)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "NodePort on ClusterIP service ignored with a problem",
			svc:  makeService("a", withPorts(v1.ServicePort{Name: "p80", Port: 80, NodePort: 30080})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.NodePort != 0 {
					t.Errorf("NodePort %d", sp.NodePort)
				}
				wantProblem(t, problems, "spec.ports[0].nodePort", "ClusterIP Service has no NodePorts")
			},
		},
		{
			name: "NodePort out of range ignored, port kept",
			svc: makeService("a", withType(v1.ServiceTypeNodePort),
				withPorts(v1.ServicePort{Name: "p80", Port: 80, NodePort: 70000})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.NodePort != 0 {
					t.Errorf("NodePort %d", sp.NodePort)
				}
				wantProblem(t, problems, "spec.ports[0].nodePort", "not a valid port")
			},
		},
		{
			name: "duplicate NodePort within a service ignored on the second port",
			svc: makeService("a", withType(v1.ServiceTypeNodePort), withPorts(
				v1.ServicePort{Name: "a", Port: 80, NodePort: 30080},
				v1.ServicePort{Name: "b", Port: 81, NodePort: 30080})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if len(ports) != 2 || ports[0].NodePort != 30080 || ports[1].NodePort != 0 {
					t.Errorf("got %+v", ports)
				}
				wantProblem(t, problems, "spec.ports[1].nodePort", "listed twice")
			},
		},
		{
			name: "port 0 and port 65536 skipped, valid port kept",
			svc: makeService("a", withPorts(
				v1.ServicePort{Name: "zero", Port: 0},
				v1.ServicePort{Name: "big", Port: 65536},
				v1.ServicePort{Name: "ok", Port: 65535})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.Name.Port != "ok" {
					t.Errorf("got %+v", sp)
				}
				wantProblem(t, problems, "spec.ports[0].port", "0 is not a valid port")
				wantProblem(t, problems, "spec.ports[1].port", "65536 is not a valid port")
			},
		},
		{
			name: "duplicate port name skipped",
			svc: makeService("a", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "http", Port: 81})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.Port != 80 {
					t.Errorf("got %+v", sp)
				}
				wantProblem(t, problems, "spec.ports[1].name", "another port is named")
			},
		},
		{
			name: "duplicate port number and protocol skipped",
			svc: makeService("a", withPorts(
				v1.ServicePort{Name: "a", Port: 80},
				v1.ServicePort{Name: "b", Port: 80, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "c", Port: 80, Protocol: v1.ProtocolUDP})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if len(ports) != 2 || ports[0].Name.Port != "a" || ports[1].Name.Port != "c" || ports[1].Name.Protocol != UDP {
					t.Errorf("got %+v", ports)
				}
				wantProblem(t, problems, "spec.ports[1].port", "listed twice")
			},
		},
		{
			name: "unknown protocol port skipped, empty protocol is TCP",
			svc: makeService("a", withPorts(
				v1.ServicePort{Name: "icmp", Port: 1, Protocol: "ICMP"},
				v1.ServicePort{Name: "tcp", Port: 80},
				v1.ServicePort{Name: "sctp", Port: 81, Protocol: v1.ProtocolSCTP})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if len(ports) != 2 || ports[0].Name.Protocol != TCP || ports[1].Name.Protocol != SCTP {
					t.Errorf("got %+v", ports)
				}
				wantProblem(t, problems, "spec.ports[0].protocol", `unknown protocol "ICMP"`)
			},
		},
		{
			name: "unknown type treated as ClusterIP with a problem",
			svc:  makeService("a", withType("Magic")),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.Type != TypeClusterIP {
					t.Errorf("type %v", sp.Type)
				}
				wantProblem(t, problems, "spec.type", "unknown type")
			},
		},
		{
			name: "externalIPs filtered by family, sorted and deduplicated",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"203.0.113.9", "2001:db8::1", "203.0.113.2", "203.0.113.9"}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(addrs("203.0.113.2", "203.0.113.9"), onePort(t, ports).ExternalIPs); d != "" {
					t.Error(d)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "invalid externalIP skipped with a problem, the others kept",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"203.0.113.1", "nonsense", "", "fe80::1%eth0", "203.0.113.2"}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(addrs("203.0.113.1", "203.0.113.2"), onePort(t, ports).ExternalIPs); d != "" {
					t.Error(d)
				}
				wantProblem(t, problems, "spec.externalIPs[1]", "not an IP address")
				wantProblem(t, problems, "spec.externalIPs[3]", "zone")
				if len(problems) != 2 {
					t.Errorf("an empty string is skipped silently, like upstream: %v", problems)
				}
			},
		},
		{
			name: "externalIPs dropped when the AllowServiceExternalIPs gate is off",
			svc:  makeService("a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.1", "bad"} }),
			opts: Options{IgnoreExternalIPs: true},
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.ExternalIPs != nil || sp.ExternallyAccessible() {
					t.Errorf("got %+v", sp)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "LB ingress IPs with ipMode unset or VIP kept, ipMode Proxy and hostname-only ignored",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), lbStatus(
				v1.LoadBalancerIngress{IP: "203.0.113.10"},
				v1.LoadBalancerIngress{IP: "203.0.113.11", IPMode: ipMode(v1.LoadBalancerIPModeVIP)},
				v1.LoadBalancerIngress{IP: "203.0.113.12", IPMode: ipMode(v1.LoadBalancerIPModeProxy)},
				v1.LoadBalancerIngress{Hostname: "lb.example.com"},
				v1.LoadBalancerIngress{IP: "2001:db8::10"},
			)),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(addrs("203.0.113.10", "203.0.113.11"), onePort(t, ports).LoadBalancerVIPs); d != "" {
					t.Error(d)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "ipMode Proxy LB IP ignored",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), lbStatus(
				v1.LoadBalancerIngress{IP: "203.0.113.12", IPMode: ipMode(v1.LoadBalancerIPModeProxy)})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.LoadBalancerVIPs != nil {
					t.Errorf("VIPs %v", sp.LoadBalancerVIPs)
				}
			},
		},
		{
			name: "LB ingress with unknown ipMode or invalid IP ignored with a problem",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), lbStatus(
				v1.LoadBalancerIngress{IP: "203.0.113.12", IPMode: ipMode("Tunnel")},
				v1.LoadBalancerIngress{IP: "203.0.113.256"},
				v1.LoadBalancerIngress{IP: "203.0.113.13"})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(addrs("203.0.113.13"), onePort(t, ports).LoadBalancerVIPs); d != "" {
					t.Error(d)
				}
				wantProblem(t, problems, "status.loadBalancer.ingress[0].ipMode", "unknown ipMode")
				wantProblem(t, problems, "status.loadBalancer.ingress[1].ip", "not an IP address")
			},
		},
		{
			name:   "LB ingress IPs of this family only (IPv6)",
			family: IPv6,
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), withClusterIPs("fd00:30::1"),
				lbStatus(v1.LoadBalancerIngress{IP: "203.0.113.10"}, v1.LoadBalancerIngress{IP: "2001:db8::10"})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(addrs("2001:db8::10"), onePort(t, ports).LoadBalancerVIPs); d != "" {
					t.Error(d)
				}
			},
		},
		{
			name: "source ranges trimmed, masked and filtered by family",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{" 198.51.100.0/24 ", "2001:db8::/32", "192.0.2.7/24\t", ""}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(prefixes("192.0.2.0/24", "198.51.100.0/24"), onePort(t, ports).LoadBalancerSourceRanges); d != "" {
					t.Error(d)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "0.0.0.0/0 source range means no filtering",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "0.0.0.0/0"}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.LoadBalancerSourceRanges != nil {
					t.Errorf("ranges %v", sp.LoadBalancerSourceRanges)
				}
			},
		},
		{
			name: "::/0 source range does not lift IPv4 filtering",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"::/0", "198.51.100.0/24"}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(prefixes("198.51.100.0/24"), onePort(t, ports).LoadBalancerSourceRanges); d != "" {
					t.Error(d)
				}
			},
		},
		{
			name: "invalid source range reported, the others kept",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/33", "198.51.100.0/24"}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if d := diff(prefixes("198.51.100.0/24"), onePort(t, ports).LoadBalancerSourceRanges); d != "" {
					t.Error(d)
				}
				wantProblem(t, problems, "spec.loadBalancerSourceRanges[0]", "not a CIDR")
			},
		},
		{
			name: "session affinity ClientIP with its timeout",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			}),
			check: yieldsAffinityTimeout(60),
		},
		{
			name:  "session affinity ClientIP without config uses the API default",
			svc:   makeService("a", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			check: yieldsAffinityTimeout(10800),
		},
		{
			name: "session affinity timeout out of range uses the default with a problem",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](86401)}}
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.AffinityTimeoutSeconds != 10800 {
					t.Errorf("timeout %d", sp.AffinityTimeoutSeconds)
				}
				wantProblem(t, problems, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "outside")
			},
		},
		{
			name: "session affinity None has timeout 0",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			}),
			check: yieldsAffinityTimeout(0),
		},
		{
			name: "eTP Local on NodePort service is ExternalPolicyLocal",
			svc: makeService("a", withType(v1.ServiceTypeNodePort), etp(v1.ServiceExternalTrafficPolicyLocal),
				withPorts(v1.ServicePort{Name: "p80", Port: 80, NodePort: 30080})),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); !sp.ExternalPolicyLocal || sp.HealthCheckNodePort != 0 {
					t.Errorf("got %+v", sp)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "eTP Local on ClusterIP-only service is not ExternalPolicyLocal",
			svc:  makeService("a", etp(v1.ServiceExternalTrafficPolicyLocal)),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.ExternalPolicyLocal || sp.LocalEndpoints != nil {
					t.Errorf("got %+v", sp)
				}
			},
		},
		{
			name: "eTP Local on ClusterIP service with externalIPs is ExternalPolicyLocal",
			svc: makeService("a", etp(v1.ServiceExternalTrafficPolicyLocal),
				func(s *v1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.1"} }),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); !sp.ExternalPolicyLocal || sp.LocalEndpoints == nil {
					t.Errorf("got %+v", sp)
				}
			},
		},
		{
			name: "iTP Local sets InternalPolicyLocal",
			svc: makeService("a", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); !sp.InternalPolicyLocal || sp.ClusterEndpoints != nil || sp.LocalEndpoints == nil {
					t.Errorf("got %+v", sp)
				}
			},
		},
		{
			name: "unknown traffic policies treated as Cluster with problems",
			svc: makeService("a", withType(v1.ServiceTypeNodePort), etp("Nearby"), func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To[v1.ServiceInternalTrafficPolicy]("Nearby")
			}),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.ExternalPolicyLocal || sp.InternalPolicyLocal {
					t.Errorf("got %+v", sp)
				}
				wantProblem(t, problems, "spec.externalTrafficPolicy", "unknown policy")
				wantProblem(t, problems, "spec.internalTrafficPolicy", "unknown policy")
			},
		},
		{
			name: "healthCheckNodePort set for LoadBalancer with eTP Local",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer), etp(v1.ServiceExternalTrafficPolicyLocal),
				func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.HealthCheckNodePort != 32000 {
					t.Errorf("got %+v", sp)
				}
			},
		},
		{
			name: "healthCheckNodePort ignored for LoadBalancer with eTP Cluster",
			svc: makeService("a", withType(v1.ServiceTypeLoadBalancer),
				func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.HealthCheckNodePort != 0 {
					t.Errorf("got %+v", sp)
				}
			},
		},
		{
			name: "missing healthCheckNodePort reported",
			svc:  makeService("a", withType(v1.ServiceTypeLoadBalancer), etp(v1.ServiceExternalTrafficPolicyLocal)),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				onePort(t, ports)
				wantProblem(t, problems, "spec.healthCheckNodePort", "has no healthCheckNodePort")
			},
		},
		{
			name: "IPVS scheduler annotation sets Scheduler",
			svc:  makeService("a", annotate(AnnotationIPVSScheduler, "mh")),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.Scheduler != "mh" {
					t.Errorf("scheduler %q", sp.Scheduler)
				}
				wantNoProblems(t, problems)
			},
		},
		{
			name: "unknown IPVS scheduler ignored with a problem",
			svc:  makeService("a", annotate(AnnotationIPVSScheduler, "RR")),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				if sp := onePort(t, ports); sp.Scheduler != "" {
					t.Errorf("scheduler %q", sp.Scheduler)
				}
				wantProblem(t, problems, "metadata.annotations["+AnnotationIPVSScheduler+"]", "unknown IPVS scheduler")
			},
		},
		{
			name: "huge annotation value is cut in the problem",
			svc:  makeService("a", annotate(AnnotationIPVSScheduler, strings.Repeat("x", 1<<20))),
			check: func(t *testing.T, ports []*ServicePort, problems []Problem) {
				onePort(t, ports)
				if len(problems) != 1 || len(problems[0].Message) > 300 {
					t.Errorf("problem not bounded: %d problems, message of %d bytes", len(problems), len(problems[0].Message))
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			family := tc.family
			if family == 0 {
				family = IPv4
			}
			ports, problems := ComputeService(tc.svc, nil, testNode, family, tc.opts)
			tc.check(t, ports, problems)
		})
	}
}

// TestTrafficCountersSwitch: the annotation decides when it parses, the node-wide
// choice otherwise; off overrides everything; a malformed value is a problem and counts
// as absent.
func TestTrafficCountersSwitch(t *testing.T) {
	annotated := func(v string) *v1.Service {
		return makeService("a", func(s *v1.Service) { s.Annotations = map[string]string{AnnotationTrafficCounters: v} })
	}
	tests := []struct {
		name        string
		svc         *v1.Service
		mode        TrafficCounters
		wantCounted bool
		wantProblem bool
	}{
		{name: "default: not annotated is not counted", svc: makeService("a")},
		{name: "default: annotated true is counted", svc: annotated("true"), wantCounted: true},
		{name: "default: annotated TRUE is counted", svc: annotated("TRUE"), wantCounted: true},
		{name: "default: annotated false is not counted", svc: annotated("false")},
		{name: "annotated mode: annotated 1 is counted", svc: annotated("1"), mode: TrafficCountersAnnotated, wantCounted: true},
		{name: "all: not annotated is counted", svc: makeService("a"), mode: TrafficCountersAll, wantCounted: true},
		{name: "all: annotated false is not counted", svc: annotated("false"), mode: TrafficCountersAll},
		{name: "off: annotated true is not counted", svc: annotated("true"), mode: TrafficCountersOff},
		{name: "default: malformed is a problem and off", svc: annotated("yes please"), wantProblem: true},
		{name: "all: malformed is a problem and counted as the node says", svc: annotated("yes"), mode: TrafficCountersAll, wantCounted: true, wantProblem: true},
		{name: "off: malformed is still a problem", svc: annotated(""), mode: TrafficCountersOff, wantProblem: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ports, problems := ComputeService(tc.svc, nil, testNode, IPv4, Options{TrafficCounters: tc.mode})
			if sp := onePort(t, ports); sp.Counted != tc.wantCounted {
				t.Errorf("Counted = %v, want %v", sp.Counted, tc.wantCounted)
			}
			if tc.wantProblem {
				wantProblem(t, problems, "metadata.annotations["+AnnotationTrafficCounters+"]", "is not true or false")
			} else {
				wantNoProblems(t, problems)
			}
		})
	}
}

func TestParseTrafficCounters(t *testing.T) {
	for in, want := range map[string]TrafficCounters{"": TrafficCountersAnnotated, "annotated": TrafficCountersAnnotated, "all": TrafficCountersAll, "off": TrafficCountersOff} {
		if got, err := ParseTrafficCounters(in); err != nil || got != want {
			t.Errorf("ParseTrafficCounters(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"on", "ALL", "true"} {
		if _, err := ParseTrafficCounters(in); err == nil {
			t.Errorf("ParseTrafficCounters(%q) accepted", in)
		}
	}
}

func TestDualStackServiceYieldsOnePortPerFamily(t *testing.T) {
	svc := makeService("a", withType(v1.ServiceTypeLoadBalancer), withClusterIPs("172.30.0.1", "fd00:30::1"), func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{"203.0.113.1", "2001:db8::1"}
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.2"}, {IP: "2001:db8::2"}}
	})
	slices := []*discoveryv1.EndpointSlice{
		makeSlice("a", "a-v4", IPv4, 8080, makeEndpoint("10.0.0.1")),
		makeSlice("a", "a-v6", IPv6, 8080, makeEndpoint("fd00:10::1")),
	}
	want := map[IPFamily][]string{
		IPv4: {"172.30.0.1", "203.0.113.1", "203.0.113.2", "198.51.100.0/24", "10.0.0.1:8080"},
		IPv6: {"fd00:30::1", "2001:db8::1", "2001:db8::2", "2001:db8:1::/48", "[fd00:10::1]:8080"},
	}
	for _, family := range Families {
		ports, problems := ComputeService(svc, slices, testNode, family, Options{})
		wantNoProblems(t, problems)
		sp := onePort(t, ports)
		got := []string{sp.ClusterIP.String(), sp.ExternalIPs[0].String(), sp.LoadBalancerVIPs[0].String(),
			sp.LoadBalancerSourceRanges[0].String(), sp.AllEndpoints[0].String()}
		if d := diff(want[family], got); d != "" || len(sp.ExternalIPs) != 1 || len(sp.LoadBalancerVIPs) != 1 ||
			len(sp.LoadBalancerSourceRanges) != 1 || len(sp.AllEndpoints) != 1 {
			t.Errorf("%v: %s %+v", family, d, sp)
		}
	}
}
