//go:build e2e

package e2e

// Tests of the control plane every e2e test, the conformance suite and the sandbox run
// on (test/framework/controlplane): real etcd and kube-apiserver, TLS, RBAC, and the
// identity sluice runs as.
//
// Conventions: Services in 10.96.0.0/16 (fd00:10:96::/112 for dual-stack), pod IPs in
// 10.244.0.0/16, node "node-1".

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
	"github.com/sluiceproxy/sluice/test/framework/reexec"
	"github.com/sluiceproxy/sluice/test/require"
)

const nodeName = "node-1"

func TestControlPlaneServesSluiceIdentity(t *testing.T) {
	ctx := t.Context()
	began := time.Now()
	cp := controlplane.StartForTest(t, controlplane.Options{})
	timings := cp.Timings()
	t.Logf("control plane up in %s at %s: etcd healthy after %s, kube-apiserver ready after %s",
		time.Since(began).Round(time.Millisecond), cp.URL(), timings.Etcd.Round(time.Millisecond), timings.APIServer.Round(time.Millisecond))

	admin := cp.AdminClient()
	svc, slice := createServiceWithSlice(ctx, t, admin, "echo", "10.244.1.5")
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node: %v", err)
	}

	// The proxy's client comes from its kubeconfig file, as sluice's would.
	restCfg, err := clientcmd.BuildConfigFromFlags("", cp.ProxyKubeconfig())
	if err != nil {
		t.Fatalf("loading %s: %v", cp.ProxyKubeconfig(), err)
	}
	proxy := kubernetes.NewForConfigOrDie(restCfg)

	t.Run("authenticates as system:kube-proxy", func(t *testing.T) {
		review, err := proxy.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review: %v", err)
		}
		if got := review.Status.UserInfo.Username; got != controlplane.ProxyUser {
			t.Errorf("username = %q, want %q", got, controlplane.ProxyUser)
		}
	})

	t.Run("lists and watches what a proxy reads", func(t *testing.T) {
		services, err := proxy.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing services: %v", err)
		}
		if !slices.ContainsFunc(services.Items, func(s corev1.Service) bool { return s.UID == svc.UID }) {
			t.Errorf("service list lacks %s", svc.Name)
		}
		slicesList, err := proxy.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing endpointslices: %v", err)
		}
		if !slices.ContainsFunc(slicesList.Items, func(s discoveryv1.EndpointSlice) bool { return s.UID == slice.UID }) {
			t.Errorf("endpointslice list lacks %s", slice.Name)
		}
		if _, err := proxy.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
			t.Errorf("getting node: %v", err)
		}
		nodes, err := proxy.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing nodes: %v", err)
		}
		cidrs, err := proxy.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing servicecidrs: %v", err)
		}
		if len(cidrs.Items) != 1 || !slices.Equal(cidrs.Items[0].Spec.CIDRs, []string{controlplane.DefaultServiceCIDR}) {
			t.Errorf("servicecidrs = %+v, want one with %s", cidrs.Items, controlplane.DefaultServiceCIDR)
		}

		watches := map[string]func() (watch.Interface, error){
			"services": func() (watch.Interface, error) {
				return proxy.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{ResourceVersion: services.ResourceVersion})
			},
			"endpointslices": func() (watch.Interface, error) {
				return proxy.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{ResourceVersion: slicesList.ResourceVersion})
			},
			"nodes": func() (watch.Interface, error) {
				return proxy.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nodes.ResourceVersion})
			},
			"servicecidrs": func() (watch.Interface, error) {
				return proxy.NetworkingV1().ServiceCIDRs().Watch(ctx, metav1.ListOptions{ResourceVersion: cidrs.ResourceVersion})
			},
		}
		for resource, open := range watches {
			w, err := open()
			if err != nil {
				t.Errorf("watching %s: %v", resource, err)
				continue
			}
			w.Stop()
		}

		// A watch delivers what the admin does next.
		w, err := proxy.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{ResourceVersion: services.ResourceVersion})
		if err != nil {
			t.Fatalf("watching services: %v", err)
		}
		defer w.Stop()
		created, _ := createServiceWithSlice(ctx, t, admin, "echo-2", "10.244.1.6")
		waitForEvent(t, w, watch.Added, created.UID)
	})

	t.Run("records events", func(t *testing.T) {
		now := time.Now()
		nodeRef := corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeName}
		_, err := proxy.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{GenerateName: "sluice-"},
			EventTime:           metav1.NewMicroTime(now),
			ReportingController: "sluice",
			ReportingInstance:   "sluice-" + nodeName,
			Action:              "StartProxy",
			Reason:              "Starting",
			Regarding:           nodeRef,
			Type:                corev1.EventTypeNormal,
			Note:                "events.k8s.io/v1 event from the proxy identity",
		}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating events.k8s.io/v1 event: %v", err)
		}
		_, err = proxy.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "sluice-"},
			InvolvedObject: nodeRef,
			Reason:         "Starting",
			Message:        "core/v1 event from the proxy identity",
			Type:           corev1.EventTypeNormal,
			Source:         corev1.EventSource{Component: "sluice", Host: nodeName},
			FirstTimestamp: metav1.NewTime(now),
			LastTimestamp:  metav1.NewTime(now),
			Count:          1,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating core/v1 event: %v", err)
		}
	})

	t.Run("is forbidden what a proxy must not do", func(t *testing.T) {
		forbidden := map[string]func() error{
			"list secrets": func() error {
				_, err := proxy.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
				return err
			},
			"list secrets in kube-system": func() error {
				_, err := proxy.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
				return err
			},
			"get services": func() error {
				_, err := proxy.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, svc.Name, metav1.GetOptions{})
				return err
			},
			"create services": func() error {
				_, err := proxy.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, newService("by-proxy"), metav1.CreateOptions{})
				return err
			},
			"delete endpointslices": func() error {
				return proxy.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Delete(ctx, slice.Name, metav1.DeleteOptions{})
			},
		}
		for what, do := range forbidden {
			if err := do(); !apierrors.IsForbidden(err) {
				t.Errorf("%s: got error %v, want Forbidden", what, err)
			}
		}
	})

	t.Run("serves the same data after an apiserver restart", func(t *testing.T) {
		// A watch open across the restart ends: that is what sluice has to recover from.
		w, err := proxy.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("watching services: %v", err)
		}
		defer w.Stop()

		began := time.Now()
		if err := cp.RestartAPIServer(ctx); err != nil {
			t.Fatalf("restarting: %v", err)
		}
		t.Logf("kube-apiserver restarted in %s (stop and start; ready after %s)",
			time.Since(began).Round(time.Millisecond), cp.Timings().APIServer.Round(time.Millisecond))

		select {
		case <-drained(w.ResultChan()):
		case <-time.After(10 * time.Second):
			t.Errorf("watch opened before the restart did not end")
		}

		// The clients made before the restart keep working: same port, same certificates.
		// (The proxy may list but not get: node-proxier grants list and watch only.)
		byName := func(name string) metav1.ListOptions {
			return metav1.ListOptions{FieldSelector: "metadata.name=" + name}
		}
		services, err := proxy.CoreV1().Services(svc.Namespace).List(ctx, byName(svc.Name))
		if err != nil {
			t.Fatalf("listing services after restart: %v", err)
		}
		if len(services.Items) != 1 || services.Items[0].UID != svc.UID || services.Items[0].Spec.ClusterIP != svc.Spec.ClusterIP {
			t.Errorf("services after restart = %+v, want %s with UID %s and clusterIP %s", services.Items, svc.Name, svc.UID, svc.Spec.ClusterIP)
		}
		endpointSlices, err := proxy.DiscoveryV1().EndpointSlices(slice.Namespace).List(ctx, byName(slice.Name))
		if err != nil {
			t.Fatalf("listing endpointslices after restart: %v", err)
		}
		if len(endpointSlices.Items) != 1 || endpointSlices.Items[0].UID != slice.UID ||
			!slices.Equal(endpointSlices.Items[0].Endpoints[0].Addresses, slice.Endpoints[0].Addresses) {
			t.Errorf("endpointslices after restart = %+v, want %s with UID %s and addresses %v", endpointSlices.Items, slice.Name, slice.UID, slice.Endpoints[0].Addresses)
		}
		if _, err := admin.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("admin after restart: %v", err)
		}
	})
}

func TestControlPlaneDualStackServiceCIDRs(t *testing.T) {
	ctx := t.Context()
	cp := controlplane.StartForTest(t, controlplane.Options{ServiceCIDRs: controlplane.DualStackServiceCIDRs()})
	t.Logf("dual-stack control plane: kube-apiserver ready after %s", cp.Timings().APIServer.Round(time.Millisecond))

	svc := newService("dual")
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	created, err := cp.AdminClient().CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating dual-stack service: %v", err)
	}
	if len(created.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs = %v, want one per family", created.Spec.ClusterIPs)
	}
	for i, cidr := range controlplane.DualStackServiceCIDRs() {
		_, ipnet, _ := net.ParseCIDR(cidr)
		if ip := net.ParseIP(created.Spec.ClusterIPs[i]); !ipnet.Contains(ip) {
			t.Errorf("clusterIPs[%d] = %s, not in %s", i, ip, cidr)
		}
	}
	defaultCIDR, err := cp.AdminClient().NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the default servicecidr: %v", err)
	}
	if !slices.Equal(defaultCIDR.Spec.CIDRs, controlplane.DualStackServiceCIDRs()) {
		t.Errorf("default servicecidr = %v, want %v", defaultCIDR.Spec.CIDRs, controlplane.DualStackServiceCIDRs())
	}
}

// linkLocalAddress is what the conformance suite binds the apiserver to, on a bridge
// node network namespaces reach.
const linkLocalAddress = "169.254.20.1"

const envInNetns = "SLUICE_E2E_CONTROLPLANE_NETNS"

// TestControlPlaneOnLinkLocalAddress runs kube-apiserver on a link-local address, which
// it would refuse to advertise with its default endpoint reconciler. The address has to
// exist, and the root network namespace is not ours to change: the test re-runs itself
// in a private network namespace (unshare --net) and puts the address on its loopback.
func TestControlPlaneOnLinkLocalAddress(t *testing.T) {
	if os.Getenv(envInNetns) == "" {
		require.Feature(t, require.Root, os.Geteuid() == 0, "needs root to create a network namespace")
		// Resolve the binaries here, so the child does not build them inside its netns.
		bins, err := controlplane.FindBinaries(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		reexec.Run(t, []string{"unshare", "--net", "--"},
			[]string{envInNetns + "=1", "KUBE_APISERVER=" + bins.KubeAPIServer, "ETCD=" + bins.Etcd})
		return
	}

	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", linkLocalAddress + "/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ctx := t.Context()
	cp := controlplane.StartForTest(t, controlplane.Options{BindAddress: linkLocalAddress})
	t.Logf("kube-apiserver on %s: ready after %s", cp.URL(), cp.Timings().APIServer.Round(time.Millisecond))
	u, err := url.Parse(cp.URL())
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != linkLocalAddress {
		t.Errorf("URL %s does not use the bind address %s", cp.URL(), linkLocalAddress)
	}
	// The kubernetes Service exists (its ClusterIP is in the serving certificate), without
	// endpoints: nothing may publish a link-local endpoint.
	k, err := cp.AdminClient().CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the kubernetes service: %v", err)
	}
	if k.Spec.ClusterIP != "10.96.0.1" {
		t.Errorf("kubernetes service clusterIP = %s, want 10.96.0.1", k.Spec.ClusterIP)
	}
	// The proxy identity works over the link-local address too.
	restCfg, err := clientcmd.BuildConfigFromFlags("", cp.ProxyKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(restCfg).CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("proxy listing services over %s: %v", cp.URL(), err)
	}
}

func newService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
}

// createServiceWithSlice creates a ClusterIP Service and the EndpointSlice the
// EndpointSlice controller would make for one ready pod at podIP (no controller runs).
func createServiceWithSlice(ctx context.Context, t *testing.T, c kubernetes.Interface, name, podIP string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	t.Helper()
	svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, newService(name), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s: %v", name, err)
	}
	slice, err := c.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name + "-abcde",
			Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: name,
				discoveryv1.LabelManagedBy:   "sluice-e2e",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{podIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(nodeName),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating endpointslice for %s: %v", name, err)
	}
	return svc, slice
}

// waitForEvent waits for an event of type typ about the object with uid.
func waitForEvent(t *testing.T, w watch.Interface, typ watch.EventType, uid types.UID) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before a %s event for %s", typ, uid)
			}
			if obj, ok := ev.Object.(metav1.Object); ok && ev.Type == typ && obj.GetUID() == uid {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for %s within 10s", typ, uid)
		}
	}
}

// drained returns a channel closed once events is closed, discarding what it delivers.
func drained(events <-chan watch.Event) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range events {
		}
	}()
	return done
}
