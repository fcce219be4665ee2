package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/test/topology"
)

// The sample objects. Fixed ClusterIPs, NodePorts and LoadBalancer IPs keep the printed
// addresses the same from run to run.
const (
	// Namespace holds every sample Service.
	Namespace = "demo"
	// EchoPort is what every pod's echo server listens on (TCP and UDP).
	EchoPort = 8080
)

// zoneOf is the zone label of each node.
var zoneOf = map[string]string{"node-a": "zone-a", "node-b": "zone-b"}

// sampleService is one sample Service and the pods behind it.
type sampleService struct {
	name      string
	typ       corev1.ServiceType
	clusterIP string
	nodePort  int32
	// lbIP is written into status.loadBalancer.ingress, as a cloud controller would, and
	// routed by the external client to node-a.
	lbIP     string
	etpLocal bool
	affinity bool
	udp      bool // also a UDP port 80
	pods     []string
	// about says in one line what the Service shows.
	about string
}

// sampleServices are what the sandbox creates.
var sampleServices = []sampleService{
	{name: "web", typ: corev1.ServiceTypeClusterIP, clusterIP: "10.96.100.10", udp: true,
		pods: []string{"a0", "a1", "b0", "b1"}, about: "ClusterIP: every pod on both nodes, client addresses kept for pods"},
	{name: "web-nodeport", typ: corev1.ServiceTypeNodePort, clusterIP: "10.96.100.11", nodePort: 30080,
		pods: []string{"a0", "a1", "b0", "b1"}, about: "NodePort 30080 on every node (externalTrafficPolicy Cluster: masqueraded)"},
	{name: "web-lb", typ: corev1.ServiceTypeLoadBalancer, clusterIP: "10.96.100.12", nodePort: 30081, lbIP: "192.0.2.10",
		pods: []string{"a0", "a1", "b0", "b1"}, about: "LoadBalancer IP 192.0.2.10 (the external client routes it to node-a)"},
	{name: "web-local", typ: corev1.ServiceTypeLoadBalancer, clusterIP: "10.96.100.13", nodePort: 30082, lbIP: "192.0.2.11", etpLocal: true,
		pods: []string{"a1"}, about: "externalTrafficPolicy Local, one pod (a1, on node-a): client address kept, node-b drops external traffic"},
	{name: "web-sticky", typ: corev1.ServiceTypeClusterIP, clusterIP: "10.96.100.14", affinity: true,
		pods: []string{"a0", "a1", "b0", "b1"}, about: "sessionAffinity ClientIP: each client keeps its pod"},
}

func (s sampleService) object() *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.name, Labels: map[string]string{"app": "echo"}},
		Spec: corev1.ServiceSpec{
			Type:      s.typ,
			ClusterIP: s.clusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(EchoPort), NodePort: s.nodePort}},
		},
	}
	if s.udp {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(EchoPort)})
	}
	if s.etpLocal {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	return svc
}

// createObjects creates the namespace, the Services (with their load balancer status) and
// their EndpointSlices, as the endpointslice controller and a cloud controller would.
func createObjects(ctx context.Context, kube kubernetes.Interface, topo *topology.Cluster) (map[string]*corev1.Service, error) {
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	created := map[string]*corev1.Service{}
	for _, s := range sampleServices {
		svc, err := kube.CoreV1().Services(Namespace).Create(ctx, s.object(), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating Service %s/%s: %w", Namespace, s.name, err)
		}
		if s.lbIP != "" {
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.lbIP}}
			if svc, err = kube.CoreV1().Services(Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				return nil, fmt.Errorf("setting the load balancer status of %s/%s: %w", Namespace, s.name, err)
			}
		}
		if _, err := kube.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, endpointSlice(svc, s.pods, topo), metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating the EndpointSlice of %s/%s: %w", Namespace, s.name, err)
		}
		created[s.name] = svc
	}
	return created, nil
}

// endpointSlice is the slice the endpointslice controller would write for svc backed by
// pods: ready endpoints with their node and zone.
func endpointSlice(svc *corev1.Service, pods []string, topo *topology.Cluster) *discoveryv1.EndpointSlice {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace,
			Name:      svc.Name + "-sandbox",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   "sandbox.sluice.dev",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range svc.Spec.Ports {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal)})
	}
	for _, name := range pods {
		pod := topo.Pod(name)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{pod.IPv4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(pod.Node.Name),
			Zone:       ptr.To(zoneOf[pod.Node.Name]),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: name},
		})
	}
	return slice
}

// registerNode creates the Node object a kubelet would: addresses, pod CIDR, zone, Ready.
func registerNode(ctx context.Context, kube kubernetes.Interface, n *topology.Node) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
			"kubernetes.io/hostname":      n.Name,
			"topology.kubernetes.io/zone": zoneOf[n.Name],
		}},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDRs[0].String(), PodCIDRs: []string{n.PodCIDRs[0].String()}},
	}
	created, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.IPv4.String()},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "SluiceSandbox", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the status of Node %s: %w", n.Name, err)
	}
	return nil
}

// healthCheckNodePort returns the port the apiserver allocated for an
// externalTrafficPolicy Local LoadBalancer Service.
func healthCheckNodePort(svcs map[string]*corev1.Service) (string, int32) {
	for _, s := range sampleServices {
		if s.etpLocal && s.typ == corev1.ServiceTypeLoadBalancer {
			return s.name, svcs[s.name].Spec.HealthCheckNodePort
		}
	}
	return "", 0
}

// lbRoutes are the LoadBalancer IPs the external client sends to node-a.
func lbRoutes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range sampleServices {
		if s.lbIP != "" {
			out = append(out, netip.PrefixFrom(netip.MustParseAddr(s.lbIP), 32))
		}
	}
	return out
}

func serviceByName(name string) sampleService {
	for _, s := range sampleServices {
		if s.name == name {
			return s
		}
	}
	panic("no sample Service " + name)
}

func joinPods(pods []string) string { return strings.Join(pods, " ") }
