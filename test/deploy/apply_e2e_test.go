//go:build e2e

package deploy

// The manifests against a real kube-apiserver (test/framework/controlplane): they are
// applied the way the README says (server-side apply), the API server validates and
// defaults them, and the checks run on what it stored. There is no kubelet or
// controller-manager, so no pod runs; what the pods would do is checked by running sluice's
// own flag parsing and configuration on their arguments and ConfigMaps, and by asking the
// API server whether their service accounts may make every request sluice makes.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/sluiceproxy/sluice/test/framework/controlplane"
)

// clusterOptions are those of a real cluster where they matter here: kube-proxy and
// sluice's init container are privileged, which kube-apiserver refuses unless
// --allow-privileged (kubeadm and every distribution set it).
var clusterOptions = controlplane.Options{ExtraAPIServerFlags: []string{"--allow-privileged=true"}}

// applier applies rendered objects with server-side apply, as
// `kubectl apply --server-side --force-conflicts --field-manager=sluice` does.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cp *controlplane.ControlPlane) *applier {
	t.Helper()
	cfg := cp.AdminRESTConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{
		dyn:    dynamic.NewForConfigOrDie(cfg),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
	}
}

// apply server-side applies one object given as JSON.
func (a *applier) apply(ctx context.Context, raw []byte) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(raw, &u.Object); err != nil {
		return nil, err
	}
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	return ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "sluice", Force: true})
}

// serviceAccountClient is a client authenticated as a ServiceAccount, with the groups the
// API server gives service-account tokens.
func serviceAccountClient(t *testing.T, cp *controlplane.ControlPlane, namespace, name string) kubernetes.Interface {
	t.Helper()
	cfg, err := cp.RESTConfigFor("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// checkProxyPermissions makes every request sluice makes (pkg/watch's informers, the Node
// lookup in pkg/app, pkg/events' events.k8s.io/v1 broadcaster) as the client, and checks
// that it is refused what a proxy should never get.
func checkProxyPermissions(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	ctx := withTimeout(t)
	list := metav1.ListOptions{Limit: 1}
	watchOnce := func(what string, w interface{ Stop() }, err error) {
		if err != nil {
			t.Errorf("watch %s: %v", what, err)
			return
		}
		w.Stop()
	}
	if _, err := client.CoreV1().Services("").List(ctx, list); err != nil {
		t.Errorf("list services: %v", err)
	}
	w, err := client.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
	watchOnce("services", w, err)
	if _, err := client.DiscoveryV1().EndpointSlices("").List(ctx, list); err != nil {
		t.Errorf("list endpointslices: %v", err)
	}
	ws, err := client.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{})
	watchOnce("endpointslices", ws, err)
	if _, err := client.NetworkingV1().ServiceCIDRs().List(ctx, list); err != nil {
		t.Errorf("list servicecidrs: %v", err)
	}
	wc, err := client.NetworkingV1().ServiceCIDRs().Watch(ctx, metav1.ListOptions{})
	watchOnce("servicecidrs", wc, err)
	own := metav1.ListOptions{FieldSelector: "metadata.name=" + testNodeName}
	if _, err := client.CoreV1().Nodes().List(ctx, own); err != nil {
		t.Errorf("list own node: %v", err)
	}
	wn, err := client.CoreV1().Nodes().Watch(ctx, own)
	watchOnce("nodes", wn, err)
	if _, err := client.CoreV1().Nodes().Get(ctx, testNodeName, metav1.GetOptions{}); err != nil {
		t.Errorf("get own node: %v", err)
	}
	// Every Node's name (metadata only; the election of the node that writes a Service's
	// InvalidService Event, pkg/watch.NodeNames).
	if _, err := client.CoreV1().Nodes().List(ctx, list); err != nil {
		t.Errorf("list nodes: %v", err)
	}
	wa, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	watchOnce("all nodes", wa, err)

	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: "sluice-deploy-test-", Namespace: "default"},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: "sluice", ReportingInstance: "sluice-" + testNodeName,
		Action: "Starting", Reason: "Starting", Type: corev1.EventTypeNormal, Note: "permission check",
		Regarding: corev1.ObjectReference{Kind: "Node", Name: testNodeName, APIVersion: "v1"},
	}
	created, err := client.EventsV1().Events("default").Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		t.Errorf("create events.k8s.io event: %v", err)
	} else {
		patch := []byte(`{"series":{"count":2,"lastObservedTime":"` + time.Now().UTC().Format("2006-01-02T15:04:05.000000Z") + `"}}`)
		if _, err := client.EventsV1().Events("default").Patch(ctx, created.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("patch events.k8s.io event: %v", err)
		}
	}

	// Least privilege: no secrets, no writes to what it watches, no single-Service get.
	if _, err := client.CoreV1().Secrets("kube-system").List(ctx, list); !apierrors.IsForbidden(err) {
		t.Errorf("list secrets: want Forbidden, got %v", err)
	}
	if err := client.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("delete a service: want Forbidden, got %v", err)
	}
}

func createNode(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNodeName, Labels: map[string]string{"kubernetes.io/os": "linux"}}}
	if _, err := admin.CoreV1().Nodes().Create(withTimeout(t), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node: %v", err)
	}
}

// configMapsFrom looks ConfigMaps up in the API server.
func configMapsFrom(ctx context.Context, admin kubernetes.Interface, namespace string) configMapLookup {
	return func(name string) (*corev1.ConfigMap, error) {
		return admin.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}

// siteOverlay is what an operator writes on top of deploy/base: the API server's address
// and the image, as deploy/README.md describes.
const siteOverlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../base
configMapGenerator:
- name: sluice-apiserver
  behavior: merge
  literals:
  - KUBERNETES_SERVICE_HOST=192.0.2.10
  - KUBERNETES_SERVICE_PORT=6443
images:
- name: sluice
  newName: registry.example/sluice
  newTag: v9.9.9
`

// copyDir copies a directory of deploy/ into the in-memory file system at dst.
func copyDir(t *testing.T, fsys filesys.FileSystem, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.MkdirAll(dst); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := fsys.WriteFile(filepath.Join(dst, e.Name()), data); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBaseAppliesToARealAPIServerAndGrantsWhatSluiceNeeds(t *testing.T) {
	cp := controlplane.StartForTest(t, clusterOptions)
	admin := cp.AdminClient()
	createNode(t, admin)
	sa := serviceAccountClient(t, cp, "kube-system", "sluice")

	// Before the base is applied, the sluice ServiceAccount may do nothing: the
	// permissions checked below come from the base's binding.
	if _, err := sa.CoreV1().Services("").List(withTimeout(t), metav1.ListOptions{Limit: 1}); !apierrors.IsForbidden(err) {
		t.Fatalf("before applying: list services as sluice: want Forbidden, got %v", err)
	}

	fsys := filesys.MakeFsInMemory()
	copyDir(t, fsys, filepath.Join(repoRoot(t), "deploy", "base"), "/deploy/base")
	if err := fsys.MkdirAll("/deploy/site"); err != nil {
		t.Fatal(err)
	}
	if err := fsys.WriteFile("/deploy/site/kustomization.yaml", []byte(siteOverlay)); err != nil {
		t.Fatal(err)
	}
	r := render(t, fsys, "/deploy/site")

	a := newApplier(t, cp)
	ctx := withTimeout(t)
	for _, raw := range r.raw {
		if _, err := a.apply(ctx, raw); err != nil {
			t.Fatalf("server-side apply: %v\n%s", err, raw)
		}
	}

	ds, err := admin.AppsV1().DaemonSets("kube-system").Get(ctx, "sluice", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkDaemonSet(t, ds, configMapsFrom(ctx, admin, "kube-system"), baseWant)

	c := findContainer(ds.Spec.Template.Spec.Containers, "sluice")
	if c.Image != "registry.example/sluice:v9.9.9" {
		t.Errorf("image %q: the site overlay's image did not apply", c.Image)
	}
	ic := ds.Spec.Template.Spec.InitContainers
	if len(ic) != 1 || ic[0].Image != c.Image {
		t.Errorf("init container image does not follow the site overlay: %+v", ic)
	}
	// The API server's address reaches the container through the generated ConfigMap.
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil {
		t.Fatalf("envFrom %+v", c.EnvFrom)
	}
	env, err := admin.CoreV1().ConfigMaps("kube-system").Get(ctx, c.EnvFrom[0].ConfigMapRef.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the ConfigMap the sluice container takes its environment from: %v", err)
	}
	if env.Data["KUBERNETES_SERVICE_HOST"] != "192.0.2.10" || env.Data["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("sluice-apiserver data %v: want the site's address", env.Data)
	}

	// Every object is in the API server, with the labels that let it be found.
	if _, err := admin.CoreV1().ServiceAccounts("kube-system").Get(ctx, "sluice", metav1.GetOptions{}); err != nil {
		t.Errorf("ServiceAccount: %v", err)
	}
	crb, err := admin.RbacV1().ClusterRoleBindings().Get(ctx, "sluice", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ClusterRoleBinding: %v", err)
	}
	if crb.RoleRef.Name != "system:node-proxier" {
		t.Errorf("binding to %s", crb.RoleRef.Name)
	}
	if _, err := admin.RbacV1().ClusterRoles().Get(ctx, "system:node-proxier", metav1.GetOptions{}); err != nil {
		t.Errorf("the ClusterRole the binding names: %v", err)
	}

	checkProxyPermissions(t, sa)

	// Applying again changes nothing (a second `kubectl apply` is a no-op).
	before := ds.Generation
	for _, raw := range r.raw {
		if _, err := a.apply(ctx, raw); err != nil {
			t.Fatalf("second apply: %v", err)
		}
	}
	again, err := admin.AppsV1().DaemonSets("kube-system").Get(ctx, "sluice", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Generation != before {
		t.Errorf("re-applying the same manifests changed the DaemonSet (generation %d -> %d)", before, again.Generation)
	}
}

// createKubeadmKubeProxy creates kubeadm's kube-proxy objects (testdata), owned by the
// field manager "kubeadm" as kubeadm's would be.
func createKubeadmKubeProxy(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "kubeadm-kube-proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := withTimeout(t)
	opts := metav1.CreateOptions{FieldManager: "kubeadm"}
	for _, doc := range yamlDocuments(t, data) {
		obj, _, err := decodeStrict(doc)
		if err != nil {
			t.Fatalf("testdata: %v", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		case *corev1.ConfigMap:
			_, err = admin.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
		case *appsv1.DaemonSet:
			_, err = admin.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
		default:
			t.Fatalf("testdata: unexpected %T", obj)
		}
		if err != nil {
			t.Fatalf("creating kubeadm's %T: %v", obj, err)
		}
	}
}

func TestReplaceKubeProxyOverlayTurnsKubeadmsKubeProxyIntoSluice(t *testing.T) {
	cp := controlplane.StartForTest(t, clusterOptions)
	admin := cp.AdminClient()
	createNode(t, admin)
	createKubeadmKubeProxy(t, admin)
	ctx := withTimeout(t)
	original, err := admin.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "replace-kube-proxy"))
	a := newApplier(t, cp)
	for _, raw := range r.raw {
		if _, err := a.apply(ctx, raw); err != nil {
			t.Fatalf("server-side apply of the overlay: %v", err)
		}
	}
	ds, err := admin.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	checkDaemonSet(t, ds, configMapsFrom(ctx, admin, "kube-system"), daemonSetWant{
		container:      "kube-proxy",
		configPath:     "/var/lib/kube-proxy/config.conf",
		serviceAccount: "kube-proxy",
		mode:           "iptables", // kubeadm's config.conf
		privileged:     true,       // kubeadm's securityContext stays
	})

	c := findContainer(ds.Spec.Template.Spec.Containers, "kube-proxy")
	if !strings.HasPrefix(c.Image, "sluice:") {
		t.Errorf("image %q, want sluice's", c.Image)
	}
	// What kubeadm made and the overlay does not mention is unchanged.
	if !equalJSON(t, ds.Spec.Selector, original.Spec.Selector) {
		t.Errorf("selector changed: %v", ds.Spec.Selector)
	}
	if !equalJSON(t, ds.Spec.Template.Spec.Volumes, original.Spec.Template.Spec.Volumes) {
		t.Errorf("volumes changed: %+v", ds.Spec.Template.Spec.Volumes)
	}
	oc := findContainer(original.Spec.Template.Spec.Containers, "kube-proxy")
	if !equalJSON(t, c.VolumeMounts, oc.VolumeMounts) || !equalJSON(t, c.Env, oc.Env) {
		t.Error("the container's mounts or environment changed")
	}
	if !equalJSON(t, ds.Spec.Template.Spec.Tolerations, original.Spec.Template.Spec.Tolerations) ||
		!equalJSON(t, ds.Spec.Template.Spec.NodeSelector, original.Spec.Template.Spec.NodeSelector) {
		t.Error("tolerations or node selector changed")
	}
	if got := ds.Spec.Template.Labels; got["k8s-app"] != "kube-proxy" || got["app.kubernetes.io/part-of"] != "sluice" {
		t.Errorf("template labels %v: want kubeadm's k8s-app plus app.kubernetes.io/part-of=sluice", got)
	}
	if ds.Generation == original.Generation {
		t.Error("the pod template did not change, so the DaemonSet would not roll")
	}
	// kubeadm's own fields keep their owner: a later kubeadm apply of them does not
	// conflict with us, and ours are recorded under "sluice".
	var managers []string
	for _, mf := range ds.ManagedFields {
		managers = append(managers, mf.Manager)
	}
	if !slices.Contains(managers, "sluice") || !slices.Contains(managers, "kubeadm") {
		t.Errorf("managers %v: want kubeadm's and sluice's", managers)
	}

	checkProxyPermissions(t, serviceAccountClient(t, cp, "kube-system", "kube-proxy"))
}

func TestReplaceKubeProxyOverlayCreatesNothingWithoutKubeProxy(t *testing.T) {
	cp := controlplane.StartForTest(t, clusterOptions)
	admin := cp.AdminClient()
	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "replace-kube-proxy"))
	ctx := withTimeout(t)
	_, err := newApplier(t, cp).apply(ctx, r.raw[0])
	if err == nil {
		t.Fatal("applying the overlay to a cluster without kube-proxy succeeded; it must not create a partial DaemonSet")
	}
	if !apierrors.IsInvalid(err) {
		t.Errorf("want an Invalid error, got %v", err)
	}
	if _, err := admin.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("kube-proxy DaemonSet after the failed apply: %v", err)
	}
}

func TestObservabilityConfigMapAppliesToARealAPIServer(t *testing.T) {
	// The PodMonitor and PrometheusRule need the Prometheus Operator's CRDs, which this
	// control plane lacks (their schema is checked by the unit tests); the dashboard
	// ConfigMap is core and must be accepted as is (size, key names, labels).
	cp := controlplane.StartForTest(t, clusterOptions)
	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "observability"))
	a := newApplier(t, cp)
	ctx := withTimeout(t)
	applied := 0
	for _, raw := range r.raw {
		var head metav1.TypeMeta
		if err := json.Unmarshal(raw, &head); err != nil {
			t.Fatal(err)
		}
		if head.APIVersion != "v1" || head.Kind != "ConfigMap" {
			continue
		}
		if _, err := a.apply(ctx, raw); err != nil {
			t.Fatalf("applying the dashboard ConfigMap: %v", err)
		}
		applied++
	}
	if applied != 1 {
		t.Fatalf("applied %d ConfigMaps, want 1", applied)
	}
	cm, err := cp.AdminClient().CoreV1().ConfigMaps("kube-system").Get(ctx, "sluice-dashboard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(cm.Data["sluice-dashboard.json"])) {
		t.Error("stored dashboard is not JSON")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}
