//go:build e2e

package e2e

// What sluice makes of Services and EndpointSlices, end to end: one dual-stack control
// plane and one sluice (recording backend) for the whole group; each subtest has a
// namespace of its own and asserts on the desired state sluice serves on app.StatePath.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/watch"
	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/require"
)

func TestSluiceServices(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{ServiceCIDRs: controlplane.DualStackServiceCIDRs()})
	admin := cp.AdminClient()
	createNode(t, admin, nodeName, nodeIPv4, nodeIPv6)
	p := startSluice(t, cp, nodeName, "")
	first := p.waitFor(t, "the first sync of every family", 30*time.Second, func(r *app.StatusReport) bool {
		for _, f := range r.Families {
			if f.Status.LastSuccess.IsZero() {
				return false
			}
		}
		return len(r.Families) > 0
	})
	dual := hasFamily(first, model.IPv6)
	if !dual {
		t.Log("sluice proxies IPv4 only on this host: the IPv6 halves of the tests are skipped")
	}
	// Node-wide inputs: the cluster's Service ranges and this node, per family.
	cidrs := map[model.IPFamily]string{model.IPv4: controlplane.DefaultServiceCIDR, model.IPv6: controlplane.DefaultServiceCIDRv6}
	p.waitFor(t, "the ServiceCIDRs", 30*time.Second, func(r *app.StatusReport) bool {
		for _, f := range r.Families {
			family := model.IPv4
			if f.State.Family == model.IPv6.String() {
				family = model.IPv6
			}
			if !equalStrings(f.State.ServiceCIDRs, []string{cidrs[family]}) {
				return false
			}
		}
		return true
	})
	if f := familyReport(first, model.IPv4); f.State.Node.Name != nodeName || !equalStrings(f.State.Node.IPs, []string{nodeIPv4, nodeIPv6}) {
		t.Errorf("node in the state: %+v", f.State.Node)
	}
	wantFamilies := `families=["IPv4"]`
	if dual {
		wantFamilies = `families=["IPv4","IPv6"]`
	}
	if !strings.Contains(p.log(), wantFamilies) {
		t.Errorf("the start-up log does not say %s:\n%s", wantFamilies, lastLines(p.log(), 30))
	}
	env := &servicesEnv{admin: admin, p: p, dual: dual}

	// Alone, before the parallel subtests: it counts every change that reaches sluice.
	t.Run("selectors keep other proxies' and headless Services out", env.testSelectors)

	t.Run("Service lifecycle", env.testServiceLifecycle)
	t.Run("endpoints merged over several slices", env.testSlicesMerged)
	t.Run("named target ports", env.testNamedPorts)
	t.Run("dual-stack Services", env.testDualStack)
	t.Run("UDP, SCTP and ExternalName Services", env.testProtocolsAndExternalName)
	t.Run("bad fields are reported and the rest syncs", env.testProblems)
	t.Run("bad input at scale", env.testScale)
}

// servicesEnv is what TestSluiceServices' subtests share.
type servicesEnv struct {
	admin kubernetes.Interface
	p     *sluiceProcess
	dual  bool
}

func v4(ns, name, port string) portRef { return portRef{model.IPv4, ns, name, port} }
func v6(ns, name, port string) portRef { return portRef{model.IPv6, ns, name, port} }

// changeCounters reads the Service and EndpointSlice change counters once they are
// stable: the counters are added to right after the state is published, so a scrape
// taken at the same moment may miss the last addition.
func (e *servicesEnv) changeCounters(t *testing.T) (services, endpointSlices float64) {
	t.Helper()
	var prevS, prevE float64 = -1, -1
	e.p.waitForMetrics(t, "the change counters to settle", 10*time.Second, func(m metricFamilies) bool {
		s, _ := m.value("kubeproxy_sync_proxy_rules_service_changes_total")
		ep, _ := m.value("kubeproxy_sync_proxy_rules_endpoint_changes_total")
		stable := s == prevS && ep == prevE
		prevS, prevE, services, endpointSlices = s, ep, s, ep
		return stable
	})
	return services, endpointSlices
}

func (e *servicesEnv) testSelectors(t *testing.T) {
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "selectors")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}

	createService(t, c, clusterIPService(ns, "before"))
	createSlice(t, c, endpointSlice(ns, "before", "before-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.9.1", nodeName)))
	p.waitForPort(t, "programmed", v4(ns, "before", "http"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == 1
	})
	svcBefore, slicesBefore := e.changeCounters(t)

	// A Service another proxy handles, and a headless Service with the slice the
	// EndpointSlice controller gives it (labelled headless).
	other := clusterIPService(ns, "other-proxy")
	other.Labels = map[string]string{watch.LabelServiceProxyName: "someone-else"}
	createService(t, c, other)
	headless := clusterIPService(ns, "headless")
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	createService(t, c, headless)
	hs := endpointSlice(ns, "headless", "headless-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.9.2", nodeName))
	hs.Labels[watch.LabelHeadless] = ""
	createSlice(t, c, hs)

	// Watches deliver in order: once the Service and slice created after them are
	// programmed, sluice would have seen them.
	createService(t, c, clusterIPService(ns, "after"))
	createSlice(t, c, endpointSlice(ns, "after", "after-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.9.3", nodeName)))
	r := p.waitFor(t, "after to be programmed", 30*time.Second, func(r *app.StatusReport) bool {
		v := v4(ns, "after", "http").find(r)
		return v != nil && len(v.ClusterEndpoints) == 1
	})
	svcAfter, slicesAfter := e.changeCounters(t)
	if d := svcAfter - svcBefore; d != 1 {
		t.Errorf("Service changes that reached sluice: %v, want 1 (only %q; the service-proxy-name and headless Services must be filtered by the watch)", d, "after")
	}
	if d := slicesAfter - slicesBefore; d != 1 {
		t.Errorf("EndpointSlice changes that reached sluice: %v, want 1 (only after-1; the headless slice must be filtered by the watch)", d)
	}
	for _, f := range r.Families {
		for _, sp := range f.State.Services {
			if sp.Namespace == ns && (sp.Name == "other-proxy" || sp.Name == "headless") {
				t.Errorf("%s: %s is programmed", f.State.Family, sp.String())
			}
		}
		for _, pr := range f.State.Problems {
			if pr.Namespace == ns {
				t.Errorf("%s: unexpected problem %+v", f.State.Family, pr)
			}
		}
	}
}

func (e *servicesEnv) testServiceLifecycle(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "lifecycle")
	svc := clusterIPService(ns, "web")
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	svc = createService(t, c, svc)
	createSlice(t, c, endpointSlice(ns, "web", "web-1", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{tcpPort("http", 8080)},
		readyEndpoint("10.244.1.1", nodeName), readyEndpoint("10.244.1.2", "node-2")))
	ref := v4(ns, "web", "http")

	v := p.waitForPort(t, "created", ref, func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == 2
	})
	if v.Type != "ClusterIP" || v.ClusterIP != svc.Spec.ClusterIP || v.Port != 80 || v.NodePort != 0 ||
		v.SessionAffinity != "None" || v.ExternalTrafficPolicy != "Cluster" || v.InternalTrafficPolicy != "Cluster" ||
		v.LocalEndpoints != nil || v.HealthCheckNodePort != 0 || !v.HasAnyEndpoints {
		t.Errorf("created: %+v", *v)
	}
	if got, want := endpointAddrs(v.ClusterEndpoints), []string{"10.244.1.1:8080", "10.244.1.2:8080"}; !equalStrings(got, want) {
		t.Errorf("created: cluster endpoints %v, want %v", got, want)
	}
	if !v.ClusterEndpoints[0].Local || v.ClusterEndpoints[1].Local {
		t.Errorf("created: locality %+v, want only 10.244.1.1 local", v.ClusterEndpoints)
	}
	if e.dual {
		r, err := p.state(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if v6 := v6(ns, "web", "http").find(r); v6 != nil {
			t.Errorf("single-stack IPv4 Service in the IPv6 state: %+v", *v6)
		}
	}

	updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })
	p.waitForPort(t, "port changed to 81", ref, func(v *model.ServicePortView) bool { return v != nil && v.Port == 81 })

	updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.10", "203.0.113.9"} })
	p.waitForPort(t, "externalIPs", ref, func(v *model.ServicePortView) bool {
		return v != nil && equalStrings(v.ExternalIPs, []string{"203.0.113.9", "203.0.113.10"})
	})

	svc = updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	nodePort := svc.Spec.Ports[0].NodePort
	p.waitForPort(t, "type NodePort", ref, func(v *model.ServicePortView) bool {
		return v != nil && v.Type == "NodePort" && v.NodePort == nodePort && nodePort != 0
	})

	updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "198.51.100.0/24"}
	})
	updateServiceStatus(t, c, ns, "web", func(st *corev1.ServiceStatus) {
		st.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "198.51.100.7", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)},
			{IP: "198.51.100.8", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)},
			{IP: "198.51.100.9"},
			{Hostname: "lb.example.com"},
		}
	})
	v = p.waitForPort(t, "type LoadBalancer with VIPs", ref, func(v *model.ServicePortView) bool {
		// ipMode Proxy and hostname-only ingress are not captured by the proxy.
		return v != nil && v.Type == "LoadBalancer" && equalStrings(v.LoadBalancerVIPs, []string{"198.51.100.7", "198.51.100.9"})
	})
	if !equalStrings(v.LoadBalancerSourceRanges, []string{"192.0.2.0/24", "198.51.100.0/24"}) || v.NodePort != nodePort {
		t.Errorf("LoadBalancer: source ranges %v, nodePort %d (want %d)", v.LoadBalancerSourceRanges, v.NodePort, nodePort)
	}

	updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](300)}}
	})
	p.waitForPort(t, "session affinity", ref, func(v *model.ServicePortView) bool {
		return v != nil && v.SessionAffinity == "ClientIP" && v.AffinityTimeoutSeconds == 300
	})

	svc = updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	hcPort := svc.Spec.HealthCheckNodePort
	v = p.waitForPort(t, "externalTrafficPolicy Local", ref, func(v *model.ServicePortView) bool {
		return v != nil && v.ExternalTrafficPolicy == "Local" && v.HealthCheckNodePort == hcPort && hcPort != 0
	})
	if got := endpointAddrs(v.LocalEndpoints); !equalStrings(got, []string{"10.244.1.1:8080"}) {
		t.Errorf("eTP Local: local endpoints %v, want [10.244.1.1:8080]", got)
	}

	updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	})
	p.waitForPort(t, "internalTrafficPolicy Local", ref, func(v *model.ServicePortView) bool {
		return v != nil && v.InternalTrafficPolicy == "Local"
	})

	// The EndpointSlice changes: one endpoint terminates, another one starts.
	updateSlice(t, c, ns, "web-1", func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = []discoveryv1.Endpoint{
			readyEndpoint("10.244.1.1", nodeName),
			endpoint("10.244.1.2", "node-2", false, true, true),
			readyEndpoint("10.244.1.3", nodeName),
		}
	})
	v = p.waitForPort(t, "slice updated", ref, func(v *model.ServicePortView) bool { return v != nil && len(v.AllEndpoints) == 3 })
	if got, want := endpointAddrs(v.ClusterEndpoints), []string{"10.244.1.1:8080", "10.244.1.3:8080"}; !equalStrings(got, want) {
		t.Errorf("slice updated: cluster endpoints %v, want %v (the terminating one left out)", got, want)
	}
	if got, want := endpointAddrs(v.LocalEndpoints), []string{"10.244.1.1:8080", "10.244.1.3:8080"}; !equalStrings(got, want) {
		t.Errorf("slice updated: local endpoints %v, want %v", got, want)
	}
	if ep := v.AllEndpoints[1]; ep.IP != "10.244.1.2" || ep.Ready || !ep.Serving || !ep.Terminating {
		t.Errorf("slice updated: terminating endpoint %+v", ep)
	}

	deleteSlice(t, c, ns, "web-1")
	v = p.waitForPort(t, "slice deleted", ref, func(v *model.ServicePortView) bool { return v != nil && len(v.AllEndpoints) == 0 })
	if v.HasAnyEndpoints || len(v.ClusterEndpoints) != 0 || len(v.LocalEndpoints) != 0 {
		t.Errorf("slice deleted: %+v", *v)
	}

	deleteService(t, c, ns, "web")
	p.waitForPort(t, "Service deleted", ref, func(v *model.ServicePortView) bool { return v == nil })
}

func (e *servicesEnv) testSlicesMerged(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "merged")
	createService(t, c, clusterIPService(ns, "web"))
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
	createSlice(t, c, endpointSlice(ns, "web", "web-a", discoveryv1.AddressTypeIPv4, ports,
		readyEndpoint("10.244.3.1", nodeName), readyEndpoint("10.244.3.2", "node-2")))
	// The same pod IP in a second slice, terminating there: an endpoint moving between
	// slices, or an IP reused while the old pod terminates. The ready copy wins.
	createSlice(t, c, endpointSlice(ns, "web", "web-b", discoveryv1.AddressTypeIPv4, ports,
		endpoint("10.244.3.2", "node-2", false, true, true), readyEndpoint("10.244.3.3", "node-2")))
	// Slices of another family or of another Service do not count.
	createSlice(t, c, endpointSlice(ns, "web", "web-fqdn", discoveryv1.AddressTypeFQDN, ports, readyEndpoint("web.example.com", "node-2")))
	createSlice(t, c, endpointSlice(ns, "web-other", "web-other-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.3.9", nodeName)))
	ref := v4(ns, "web", "http")

	v := p.waitForPort(t, "merged", ref, func(v *model.ServicePortView) bool { return v != nil && len(v.AllEndpoints) == 3 })
	if got, want := endpointAddrs(v.ClusterEndpoints), []string{"10.244.3.1:8080", "10.244.3.2:8080", "10.244.3.3:8080"}; !equalStrings(got, want) {
		t.Errorf("merged: cluster endpoints %v, want %v", got, want)
	}
	if ep := v.AllEndpoints[1]; !ep.Ready || ep.Terminating {
		t.Errorf("duplicate 10.244.3.2 resolved to %+v, want the ready copy", ep)
	}

	deleteSlice(t, c, ns, "web-a")
	v = p.waitForPort(t, "first slice deleted", ref, func(v *model.ServicePortView) bool { return v != nil && len(v.AllEndpoints) == 2 })
	if got := endpointAddrs(v.ClusterEndpoints); !equalStrings(got, []string{"10.244.3.3:8080"}) {
		t.Errorf("first slice deleted: cluster endpoints %v, want [10.244.3.3:8080]", got)
	}
	if ep := v.AllEndpoints[0]; ep.IP != "10.244.3.2" || ep.Ready || !ep.Terminating {
		t.Errorf("first slice deleted: 10.244.3.2 is %+v, want the terminating copy", ep)
	}

	// No ready endpoint left: the serving terminating ones take the traffic.
	updateSlice(t, c, ns, "web-b", func(s *discoveryv1.EndpointSlice) {
		s.Endpoints[1] = endpoint("10.244.3.3", "node-2", false, false, false)
	})
	v = p.waitForPort(t, "only terminating endpoints", ref, func(v *model.ServicePortView) bool {
		return v != nil && equalStrings(endpointAddrs(v.ClusterEndpoints), []string{"10.244.3.2:8080"})
	})
	if !v.HasAnyEndpoints {
		t.Errorf("only terminating endpoints: hasAnyEndpoints false")
	}
}

func (e *servicesEnv) testNamedPorts(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "named")
	svc := clusterIPService(ns, "app")
	svc.Spec.Ports = []corev1.ServicePort{
		{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http-web")},
		{Name: "metrics", Port: 9100, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9100)},
	}
	createService(t, c, svc)
	// The EndpointSlice controller resolves the named targetPort per pod: pods whose
	// containers number "http-web" differently land in different slices.
	createSlice(t, c, endpointSlice(ns, "app", "app-8080", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{tcpPort("web", 8080), tcpPort("metrics", 9100)}, readyEndpoint("10.244.4.1", nodeName)))
	createSlice(t, c, endpointSlice(ns, "app", "app-8081", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{tcpPort("web", 8081), tcpPort("metrics", 9100), tcpPort("unused", 1234)}, readyEndpoint("10.244.4.2", "node-2")))

	web := p.waitForPort(t, "web endpoints", v4(ns, "app", "web"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == 2
	})
	if got, want := endpointAddrs(web.ClusterEndpoints), []string{"10.244.4.1:8080", "10.244.4.2:8081"}; !equalStrings(got, want) {
		t.Errorf("web: endpoints %v, want %v", got, want)
	}
	metrics := p.waitForPort(t, "metrics endpoints", v4(ns, "app", "metrics"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == 2
	})
	if got, want := endpointAddrs(metrics.ClusterEndpoints), []string{"10.244.4.1:9100", "10.244.4.2:9100"}; !equalStrings(got, want) {
		t.Errorf("metrics: endpoints %v, want %v", got, want)
	}
	if web.Port != 80 || metrics.Port != 9100 {
		t.Errorf("ports: web %d, metrics %d", web.Port, metrics.Port)
	}
}

func (e *servicesEnv) testDualStack(t *testing.T) {
	require.Feature(t, require.IPv6, e.dual, "sluice proxies IPv4 only on this host")
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "dual")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}

	svc := clusterIPService(ns, "both")
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"203.0.113.20", "2001:db8::30"}
	svc = createService(t, c, svc)
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs %v, want two", svc.Spec.ClusterIPs)
	}
	updateServiceStatus(t, c, ns, "both", func(st *corev1.ServiceStatus) {
		st.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.20"}, {IP: "2001:db8::20"}}
	})
	createSlice(t, c, endpointSlice(ns, "both", "both-v4", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.5.1", nodeName)))
	createSlice(t, c, endpointSlice(ns, "both", "both-v6", discoveryv1.AddressTypeIPv6, ports, readyEndpoint("fd00:10:244::5:1", nodeName)))

	want := map[model.IPFamily]struct {
		clusterIP, endpoint, externalIP, vip string
	}{
		model.IPv4: {svc.Spec.ClusterIPs[0], "10.244.5.1:8080", "203.0.113.20", "198.51.100.20"},
		model.IPv6: {svc.Spec.ClusterIPs[1], "[fd00:10:244::5:1]:8080", "2001:db8::30", "2001:db8::20"},
	}
	for family, w := range want {
		ref := portRef{family, ns, "both", "http"}
		v := p.waitForPort(t, "dual-stack Service", ref, func(v *model.ServicePortView) bool {
			return v != nil && len(v.ClusterEndpoints) == 1 && len(v.LoadBalancerVIPs) == 1
		})
		if v.ClusterIP != w.clusterIP || endpointAddrs(v.ClusterEndpoints)[0] != w.endpoint ||
			!equalStrings(v.ExternalIPs, []string{w.externalIP}) || v.LoadBalancerVIPs[0] != w.vip || v.NodePort == 0 {
			t.Errorf("%s: %+v, want clusterIP %s, endpoint %s, externalIP %s, VIP %s and a NodePort", family, *v, w.clusterIP, w.endpoint, w.externalIP, w.vip)
		}
	}

	// An IPv6 single-stack Service lives in the IPv6 state only.
	only6 := clusterIPService(ns, "only6")
	only6.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	only6 = createService(t, c, only6)
	createSlice(t, c, endpointSlice(ns, "only6", "only6-v6", discoveryv1.AddressTypeIPv6, ports, readyEndpoint("fd00:10:244::5:2", "node-2")))
	p.waitForPort(t, "IPv6-only Service", v6(ns, "only6", "http"), func(v *model.ServicePortView) bool {
		return v != nil && v.ClusterIP == only6.Spec.ClusterIP && len(v.ClusterEndpoints) == 1
	})
	if r, err := p.state(t.Context()); err != nil || v4(ns, "only6", "http").find(r) != nil {
		t.Errorf("IPv6-only Service in the IPv4 state (err %v)", err)
	}

	// The clusterIP families of a Service change: single-stack → dual-stack → single-stack.
	createService(t, c, clusterIPService(ns, "grow"))
	createSlice(t, c, endpointSlice(ns, "grow", "grow-v4", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.5.3", nodeName)))
	createSlice(t, c, endpointSlice(ns, "grow", "grow-v6", discoveryv1.AddressTypeIPv6, ports, readyEndpoint("fd00:10:244::5:3", nodeName)))
	p.waitForPort(t, "single-stack", v4(ns, "grow", "http"), func(v *model.ServicePortView) bool { return v != nil && len(v.ClusterEndpoints) == 1 })
	grown := updateService(t, c, ns, "grow", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	})
	if len(grown.Spec.ClusterIPs) != 2 {
		t.Fatalf("upgraded to dual-stack: clusterIPs %v", grown.Spec.ClusterIPs)
	}
	p.waitForPort(t, "upgraded to dual-stack", v6(ns, "grow", "http"), func(v *model.ServicePortView) bool {
		return v != nil && v.ClusterIP == grown.Spec.ClusterIPs[1] && equalStrings(endpointAddrs(v.ClusterEndpoints), []string{"[fd00:10:244::5:3]:8080"})
	})
	updateService(t, c, ns, "grow", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
		s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
	})
	p.waitForPort(t, "downgraded to single-stack", v6(ns, "grow", "http"), func(v *model.ServicePortView) bool { return v == nil })
	if r, err := p.state(t.Context()); err != nil || v4(ns, "grow", "http").find(r) == nil {
		t.Errorf("downgraded to single-stack: IPv4 port gone (err %v)", err)
	}
}

func (e *servicesEnv) testProblems(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "problems")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
	m0, err := p.metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	serviceProblems0, _ := m0.value("sluice_input_problems_total", "kind", "Service")
	sliceProblems0, _ := m0.value("sluice_input_problems_total", "kind", "EndpointSlice")

	// Everything below is accepted by the API server, and still malformed for a proxy.
	createService(t, c, clusterIPService(ns, "good"))
	createSlice(t, c, endpointSlice(ns, "good", "good-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.6.1", nodeName)))

	sched := clusterIPService(ns, "sched")
	sched.Annotations = map[string]string{watch.AnnotationScheduler: "bogus"}
	createService(t, c, sched)
	createSlice(t, c, endpointSlice(ns, "sched", "sched-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.6.2", nodeName)))

	createService(t, c, clusterIPService(ns, "badslice"))
	createSlice(t, c, endpointSlice(ns, "badslice", "badslice-port0", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{tcpPort("http", 0)}, readyEndpoint("10.244.6.3", nodeName)))
	createSlice(t, c, endpointSlice(ns, "badslice", "badslice-ok", discoveryv1.AddressTypeIPv4, ports,
		readyEndpoint("10.244.6.4", nodeName), readyEndpoint("239.1.2.3", nodeName)))

	badlb := clusterIPService(ns, "badlb")
	badlb.Spec.Type = corev1.ServiceTypeLoadBalancer
	createService(t, c, badlb)
	updateServiceStatus(t, c, ns, "badlb", func(st *corev1.ServiceStatus) {
		st.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "0.0.0.0"}, {IP: "198.51.100.40"}}
	})
	createSlice(t, c, endpointSlice(ns, "badlb", "badlb-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.244.6.5", nodeName)))

	type want struct {
		service   string
		endpoints []string
		problems  []string // "object field"
	}
	for _, w := range []want{
		{"good", []string{"10.244.6.1:8080"}, nil},
		{"sched", []string{"10.244.6.2:8080"}, []string{"Service metadata.annotations[" + watch.AnnotationScheduler + "]"}},
		{"badslice", []string{"10.244.6.4:8080"}, []string{
			"EndpointSlice " + ns + "/badslice-ok endpoints[1].addresses[0]",
			"EndpointSlice " + ns + "/badslice-port0 ports[0].port",
		}},
		{"badlb", []string{"10.244.6.5:8080"}, []string{"Service status.loadBalancer.ingress[0].ip"}},
	} {
		var problems []model.ProblemView
		r := p.waitFor(t, w.service+" synced with its problems", 30*time.Second, func(r *app.StatusReport) bool {
			v := v4(ns, w.service, "http").find(r)
			if v == nil || !equalStrings(endpointAddrs(v.ClusterEndpoints), w.endpoints) {
				return false
			}
			problems = problemsOf(r, model.IPv4, ns, w.service)
			return len(problems) == len(w.problems)
		})
		var got []string
		for _, pr := range problems {
			got = append(got, pr.Object+" "+pr.Field)
		}
		if !equalStrings(got, w.problems) {
			t.Errorf("%s: problems %+v, want %v", w.service, problems, w.problems)
		}
		if f := familyReport(r, model.IPv4); len(f.Status.Failed) != 0 || f.Status.LastError != "" {
			t.Errorf("%s: sync status %+v", w.service, f.Status)
		}
	}
	r, err := p.state(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v := v4(ns, "sched", "http").find(r); v.Scheduler != "" {
		t.Errorf("sched: scheduler %q, want the default", v.Scheduler)
	}
	if v := v4(ns, "badlb", "http").find(r); !equalStrings(v.LoadBalancerVIPs, []string{"198.51.100.40"}) {
		t.Errorf("badlb: VIPs %v, want only 198.51.100.40", v.LoadBalancerVIPs)
	}

	// One Warning per bad Service, on the Service.
	for service, field := range map[string]string{
		"sched":    "metadata.annotations[" + watch.AnnotationScheduler + "]",
		"badslice": "ports[0].port",
		"badlb":    "status.loadBalancer.ingress[0].ip",
	} {
		ev := waitForAPIEvent(t, c, ns, "InvalidService on "+service, 30*time.Second, func(ev *eventsv1.Event) bool {
			return ev.Reason == events.ReasonInvalidService && ev.Regarding.Kind == "Service" && ev.Regarding.Name == service
		})
		if ev.Type != corev1.EventTypeWarning || ev.ReportingController != events.ReportingController || !strings.Contains(ev.Note, field) {
			t.Errorf("Event on %s: type %s, controller %s, note %q (want a Warning from sluice naming %s)", service, ev.Type, ev.ReportingController, ev.Note, field)
		}
	}
	list, err := c.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Only sluice's own Events count: the apiserver's ClusterIP repair loop may report on any
	// new Service ("ClusterIPNotAllocated … repairing", a race inside the apiserver under
	// load, seen in CI).
	for _, ev := range list.Items {
		if ev.Regarding.Name == "good" && ev.ReportingController == events.ReportingController {
			t.Errorf("Event about the good Service: %s %s", ev.Reason, ev.Note)
		}
	}

	p.waitForMetrics(t, "sluice_input_problems_total to count the problems", 10*time.Second, func(m metricFamilies) bool {
		s, _ := m.value("sluice_input_problems_total", "kind", "Service")
		es, _ := m.value("sluice_input_problems_total", "kind", "EndpointSlice")
		return s >= serviceProblems0+2 && es >= sliceProblems0+2
	})

	// Fixing the field clears the problem.
	updateService(t, c, ns, "sched", func(s *corev1.Service) { s.Annotations[watch.AnnotationScheduler] = "rr" })
	p.waitFor(t, "the scheduler problem to clear", 30*time.Second, func(r *app.StatusReport) bool {
		v := v4(ns, "sched", "http").find(r)
		return v != nil && v.Scheduler == "rr" && len(problemsOf(r, model.IPv4, ns, "sched")) == 0
	})
}

func (e *servicesEnv) testScale(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "scale")
	ports := []discoveryv1.EndpointPort{tcpPort("http", 8080)}
	const maxPerSlice = 1000 // the API's limit

	// One slice at the API's maximum.
	createService(t, c, clusterIPService(ns, "big"))
	var eps []discoveryv1.Endpoint
	for i := range maxPerSlice {
		eps = append(eps, readyEndpoint(fmt.Sprintf("10.200.%d.%d", i/250, i%250+1), fmt.Sprintf("node-%d", i%3+1)))
	}
	createSlice(t, c, endpointSlice(ns, "big", "big-1", discoveryv1.AddressTypeIPv4, ports, eps...))

	// Many slices for one Service.
	const slicesOfMany, perSlice = 100, 20
	createService(t, c, clusterIPService(ns, "many"))
	for s := range slicesOfMany {
		var eps []discoveryv1.Endpoint
		for i := range perSlice {
			eps = append(eps, readyEndpoint(fmt.Sprintf("10.201.%d.%d", s, i+1), "node-2"))
		}
		createSlice(t, c, endpointSlice(ns, "many", fmt.Sprintf("many-%03d", s), discoveryv1.AddressTypeIPv4, ports, eps...))
	}

	// A full slice of bad endpoints but one: the problems are capped, the good one syncs.
	createService(t, c, clusterIPService(ns, "badbig"))
	eps = []discoveryv1.Endpoint{readyEndpoint("10.202.0.1", nodeName)}
	for i := range maxPerSlice - 1 {
		eps = append(eps, readyEndpoint(fmt.Sprintf("239.2.%d.%d", i/250, i%250+1), nodeName))
	}
	createSlice(t, c, endpointSlice(ns, "badbig", "badbig-1", discoveryv1.AddressTypeIPv4, ports, eps...))

	// Huge annotations (the API allows 256 KiB in all): sluice drops the ones it does not
	// read, and keeps its own.
	annotated := clusterIPService(ns, "annotated")
	annotated.Annotations = map[string]string{
		"example.com/blob": strings.Repeat("x", 200<<10),
		"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("y", 40<<10),
		watch.AnnotationScheduler:                          "sh",
	}
	createService(t, c, annotated)
	createSlice(t, c, endpointSlice(ns, "annotated", "annotated-1", discoveryv1.AddressTypeIPv4, ports, readyEndpoint("10.203.0.1", nodeName)))

	v := p.waitForPort(t, "1000 endpoints in one slice", v4(ns, "big", "http"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == maxPerSlice
	})
	if n := len(v.LocalEndpoints); v.LocalEndpoints != nil {
		t.Errorf("big: %d local endpoints listed for a Cluster policy Service", n)
	}
	p.waitForPort(t, "endpoints of 100 slices", v4(ns, "many", "http"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == slicesOfMany*perSlice
	})
	var problems []model.ProblemView
	p.waitFor(t, "badbig synced with capped problems", 60*time.Second, func(r *app.StatusReport) bool {
		v := v4(ns, "badbig", "http").find(r)
		problems = problemsOf(r, model.IPv4, ns, "badbig")
		return v != nil && equalStrings(endpointAddrs(v.ClusterEndpoints), []string{"10.202.0.1:8080"}) && len(problems) > 0
	})
	if len(problems) > 17 || !slices.ContainsFunc(problems, func(pr model.ProblemView) bool { return strings.Contains(pr.Message, "more problems not listed") }) {
		t.Errorf("badbig: %d problems, want at most 16 and a summary", len(problems))
	}
	waitForAPIEvent(t, c, ns, "InvalidService on badbig", 30*time.Second, func(ev *eventsv1.Event) bool {
		return ev.Reason == events.ReasonInvalidService && ev.Regarding.Name == "badbig"
	})
	p.waitForPort(t, "annotated Service with its scheduler", v4(ns, "annotated", "http"), func(v *model.ServicePortView) bool {
		return v != nil && v.Scheduler == "sh" && len(v.ClusterEndpoints) == 1
	})

	// Churn: the huge annotation changes (sluice ignores it), then a field it reads.
	for i := range 5 {
		updateService(t, c, ns, "annotated", func(s *corev1.Service) {
			s.Annotations["example.com/blob"] = strings.Repeat(string(rune('a'+i)), 200<<10)
		})
	}
	updateService(t, c, ns, "annotated", func(s *corev1.Service) { s.Spec.Ports[0].Port = 8000 })
	p.waitForPort(t, "annotated Service port changed", v4(ns, "annotated", "http"), func(v *model.ServicePortView) bool {
		return v != nil && v.Port == 8000 && v.Scheduler == "sh"
	})
	// Half the slices of "many" go away.
	for s := 0; s < slicesOfMany; s += 2 {
		deleteSlice(t, c, ns, fmt.Sprintf("many-%03d", s))
	}
	p.waitForPort(t, "half the slices deleted", v4(ns, "many", "http"), func(v *model.ServicePortView) bool {
		return v != nil && len(v.ClusterEndpoints) == slicesOfMany*perSlice/2
	})

	p.checkRunning(t)
	waitForHTTP(t, "a healthy proxy", "http://"+p.healthzAddr+"/healthz", 10*time.Second, func(a *httpAnswer) bool { return a.code == 200 })
	m, err := p.metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rss, _ := m.value("process_resident_memory_bytes")
	t.Logf("sluice resident memory after the scale test: %.0f MiB", rss/(1<<20))
	if rss > 1<<30 {
		t.Errorf("sluice uses %.0f MiB", rss/(1<<20))
	}
}

func (e *servicesEnv) testProtocolsAndExternalName(t *testing.T) {
	t.Parallel()
	c, p := e.admin, e.p
	ns := newNamespace(t, c, "protocols")
	svc := clusterIPService(ns, "dns")
	svc.Spec.Ports = []corev1.ServicePort{
		{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
		{Name: "sig", Port: 2905, Protocol: corev1.ProtocolSCTP},
	}
	createService(t, c, svc)
	createSlice(t, c, endpointSlice(ns, "dns", "dns-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
		{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolUDP)},
		{Name: ptr.To("dns-tcp"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolTCP)},
		{Name: ptr.To("sig"), Port: ptr.To[int32](2905), Protocol: ptr.To(corev1.ProtocolSCTP)},
	}, readyEndpoint("10.244.14.1", nodeName)))
	want := map[model.Protocol]struct {
		name     string
		port     int32
		endpoint string
	}{
		model.UDP:  {"dns", 53, "10.244.14.1:5353"},
		model.TCP:  {"dns-tcp", 53, "10.244.14.1:5353"},
		model.SCTP: {"sig", 2905, "10.244.14.1:2905"},
	}
	r := p.waitFor(t, "the three protocols", 30*time.Second, func(r *app.StatusReport) bool {
		f := familyReport(r, model.IPv4)
		for proto, w := range want {
			v := f.State.Find(ns, "dns", w.name, proto)
			if v == nil || v.Port != w.port || !equalStrings(endpointAddrs(v.ClusterEndpoints), []string{w.endpoint}) {
				return false
			}
		}
		return true
	})
	if probs := problemsOf(r, model.IPv4, ns, "dns"); len(probs) != 0 {
		t.Errorf("problems: %+v", probs)
	}

	// A Service that becomes an ExternalName (a DNS alias) is no longer proxied.
	updateService(t, c, ns, "dns", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeExternalName
		s.Spec.ExternalName = "dns.example.com"
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = nil, nil
		s.Spec.InternalTrafficPolicy = nil
	})
	p.waitFor(t, "the ExternalName Service to leave the state", 30*time.Second, func(r *app.StatusReport) bool {
		for _, f := range r.Families {
			for _, sp := range f.State.Services {
				if sp.Namespace == ns {
					return false
				}
			}
			if len(problemsOf(r, model.IPv4, ns, "dns")) != 0 {
				return false
			}
		}
		return true
	})
}
