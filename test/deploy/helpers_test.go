package deploy

// Helpers shared by the unit and e2e tests: rendering kustomizations, strict decoding of
// Kubernetes objects, and the checks a sluice DaemonSet must pass wherever it comes from
// (rendered from the files, or read back from the API server).
//
// Conventions: node "node-1"; Services in 10.96.0.0/16 (the control plane's default).

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	cliflag "k8s.io/component-base/cli/flag"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/health"
)

const testNodeName = "node-1"

// repoRoot is the repository's top directory (this file is in test/deploy).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test's source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// strictDecoder decodes YAML or JSON into the typed Kubernetes objects client-go knows,
// failing on unknown or duplicate fields.
var strictDecoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	json.SerializerOptions{Yaml: true, Strict: true})

// decodeStrict decodes one Kubernetes object strictly.
func decodeStrict(data []byte) (k8sruntime.Object, *schema.GroupVersionKind, error) {
	return strictDecoder.Decode(data, nil, nil)
}

// rendered is the output of one kustomization: typed objects and their YAML.
type rendered struct {
	objects []k8sruntime.Object
	yaml    []byte
	// raw holds every resource as JSON, in order, for applying (typed or not).
	raw [][]byte
}

// render builds the kustomization in dir (on fsys) with kustomize's default options, as
// `kubectl kustomize dir` does, and decodes every resource kustomize produced that client-go
// knows.
func render(t testing.TB, fsys filesys.FileSystem, dir string) rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out rendered
	if out.yaml, err = m.AsYaml(); err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	for _, r := range m.Resources() {
		j, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		out.raw = append(out.raw, j)
		if !scheme.Scheme.Recognizes(schema.FromAPIVersionAndKind(r.GetApiVersion(), r.GetKind())) {
			continue
		}
		obj, _, err := decodeStrict(j)
		if err != nil {
			t.Fatalf("%s: %s does not decode strictly: %v", dir, r.CurId(), err)
		}
		out.objects = append(out.objects, obj)
	}
	return out
}

// onlyDaemonSet returns the single DaemonSet of r.
func (r rendered) onlyDaemonSet(t testing.TB) *appsv1.DaemonSet {
	t.Helper()
	var found []*appsv1.DaemonSet
	for _, o := range r.objects {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			found = append(found, ds)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one DaemonSet, got %d", len(found))
	}
	return found[0]
}

// configMap returns the ConfigMap named name from r, or nil.
func (r rendered) configMap(name string) *corev1.ConfigMap {
	for _, o := range r.objects {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == name {
			return cm
		}
	}
	return nil
}

// clusterRoleBindings returns r's ClusterRoleBindings.
func (r rendered) clusterRoleBindings() []*rbacv1.ClusterRoleBinding {
	var out []*rbacv1.ClusterRoleBinding
	for _, o := range r.objects {
		if b, ok := o.(*rbacv1.ClusterRoleBinding); ok {
			out = append(out, b)
		}
	}
	return out
}

// daemonSetWant says what a sluice DaemonSet must look like besides what every one must
// have (hostNetwork, critical priority, every taint tolerated, one node at a time, NODE_NAME,
// probes on sluice's health endpoints, a configuration sluice accepts).
type daemonSetWant struct {
	container      string // the container running sluice
	configPath     string // the --config argument
	serviceAccount string
	mode           string // the configuration's mode
	// privileged: the sluice container runs privileged (kubeadm's kube-proxy does).
	// Otherwise it must drop ALL and add exactly capabilities, and a privileged init
	// container must run sluice --init-only with the same configuration.
	privileged   bool
	capabilities []corev1.Capability
	// metricsExposed: metricsBindAddress must listen on all addresses so that Prometheus
	// can scrape the "metrics" port.
	metricsExposed bool
}

// sluiceBinary is where the image puts sluice (the Dockerfile's COPY destination).
const sluiceBinary = "/usr/local/bin/sluice"

// configMapLookup finds a ConfigMap of the DaemonSet's namespace by name.
type configMapLookup func(name string) (*corev1.ConfigMap, error)

// checkDaemonSet checks that ds runs sluice as want says, with the configuration found
// through configMaps. It returns the sluice container's completed options.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, configMaps configMapLookup, want daemonSetWant) *config.Options {
	t.Helper()
	spec := ds.Spec.Template.Spec

	if !spec.HostNetwork {
		t.Error("hostNetwork must be true: sluice programs the node's network namespace")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
	}
	if spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet {
		t.Error("dnsPolicy ClusterFirstWithHostNet makes the proxy depend on the cluster DNS Service it programs")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
	}) {
		t.Errorf("no toleration of every taint (operator Exists, no key, no effect): %+v", spec.Tolerations)
	}
	if spec.ServiceAccountName != want.serviceAccount {
		t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, want.serviceAccount)
	}
	checkUpdateStrategy(t, ds.Spec.UpdateStrategy)

	c := findContainer(spec.Containers, want.container)
	if c == nil {
		t.Fatalf("no container %q", want.container)
	}
	checkSecurity(t, c, want)
	checkXtablesLock(t, spec, c)

	opts := checkSluiceCommand(t, spec, c, configMaps, want.configPath, nil)
	if opts == nil {
		return nil
	}
	if got := string(opts.Effective.Mode); got != want.mode {
		t.Errorf("mode = %q, want %q", got, want.mode)
	}
	checkProbes(t, c, opts)
	checkMetricsPort(t, c, opts, want.metricsExposed)

	if !want.privileged {
		var inits []corev1.Container
		for _, ic := range spec.InitContainers {
			if slices.Contains(ic.Command, "--init-only") {
				inits = append(inits, ic)
			}
		}
		if len(inits) != 1 {
			t.Fatalf("want one init container running sluice --init-only (conntrack sysctls need a writable /proc/sys), got %d", len(inits))
		}
		ic := inits[0]
		if ic.SecurityContext == nil || ic.SecurityContext.Privileged == nil || !*ic.SecurityContext.Privileged {
			t.Errorf("init container %q must be privileged to write /proc/sys/net/netfilter", ic.Name)
		}
		if ic.Image != c.Image {
			t.Errorf("init container image %q differs from sluice's %q", ic.Image, c.Image)
		}
		initOpts := checkSluiceCommand(t, spec, &ic, configMaps, want.configPath, []string{"--init-only"})
		if initOpts != nil && !initOpts.InitOnly {
			t.Errorf("init container %q does not run --init-only", ic.Name)
		}
	}
	return opts
}

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// checkUpdateStrategy: one node at a time and never a surge, so two proxies never run on
// one node.
func checkUpdateStrategy(t *testing.T, s appsv1.DaemonSetUpdateStrategy) {
	t.Helper()
	if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil {
		t.Errorf("updateStrategy = %+v, want RollingUpdate", s)
		return
	}
	if mu := s.RollingUpdate.MaxUnavailable; mu == nil || *mu != intstr.FromInt32(1) {
		t.Errorf("maxUnavailable = %v, want 1", mu)
	}
	if ms := s.RollingUpdate.MaxSurge; ms != nil && ms.IntValue() != 0 {
		t.Errorf("maxSurge = %v: a surge runs two proxies on one node", ms)
	}
}

func checkSecurity(t *testing.T, c *corev1.Container, want daemonSetWant) {
	t.Helper()
	sc := c.SecurityContext
	privileged := sc != nil && sc.Privileged != nil && *sc.Privileged
	if want.privileged {
		if !privileged {
			t.Errorf("container %q: want privileged", c.Name)
		}
		return
	}
	if privileged {
		t.Errorf("container %q is privileged; want capabilities only", c.Name)
		return
	}
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("container %q has no capabilities", c.Name)
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container %q drops %v, want [ALL]", c.Name, sc.Capabilities.Drop)
	}
	got := slices.Clone(sc.Capabilities.Add)
	slices.Sort(got)
	wantCaps := slices.Clone(want.capabilities)
	slices.Sort(wantCaps)
	if !slices.Equal(got, wantCaps) {
		t.Errorf("container %q adds capabilities %v, want %v", c.Name, got, wantCaps)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %q: allowPrivilegeEscalation should be false", c.Name)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("container %q must run as root: added capabilities are not effective for other users", c.Name)
	}
}

// checkXtablesLock: the host's /run/xtables.lock shared with the container.
func checkXtablesLock(t *testing.T, spec corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != "/run/xtables.lock" {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			hp := v.HostPath
			if hp == nil || hp.Path != "/run/xtables.lock" || hp.Type == nil || *hp.Type != corev1.HostPathFileOrCreate {
				t.Errorf("volume %q: want hostPath /run/xtables.lock, FileOrCreate; got %+v", v.Name, v.VolumeSource)
			}
			if m.ReadOnly {
				t.Error("the xtables lock must be writable")
			}
			return
		}
	}
	t.Errorf("container %q does not mount the host's /run/xtables.lock", c.Name)
}

// checkSluiceCommand checks that c runs sluice with --config=configPath (plus extra), that
// the path is a key of a mounted ConfigMap, and that sluice's own flag parsing and
// configuration completion accept the arguments with that file. It returns the completed
// options, or nil after reporting an error.
func checkSluiceCommand(t *testing.T, spec corev1.PodSpec, c *corev1.Container, configMaps configMapLookup, configPath string, extra []string) *config.Options {
	t.Helper()
	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) == 0 || argv[0] != sluiceBinary {
		t.Errorf("container %q runs %q, want %s", c.Name, argv, sluiceBinary)
		return nil
	}
	args := argv[1:]
	for _, e := range extra {
		if !slices.Contains(args, e) {
			t.Errorf("container %q: %s missing from %q", c.Name, e, args)
		}
	}

	// $(NODE_NAME) must come from the Pod's node, so sluice finds its Node object.
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("container %q: no NODE_NAME from spec.nodeName", c.Name)
	}
	if !slices.Contains(args, "--hostname-override=$(NODE_NAME)") {
		t.Errorf("container %q: want --hostname-override=$(NODE_NAME) in %q", c.Name, args)
	}

	content := mountedConfigMapKey(t, spec, c, configMaps, configPath)
	if content == nil {
		return nil
	}
	if !slices.Contains(args, "--config="+configPath) {
		t.Errorf("container %q: want --config=%s in %q", c.Name, configPath, args)
		return nil
	}

	// Parse the arguments as sluice does, with the file at a temporary path.
	local := filepath.Join(t.TempDir(), filepath.Base(configPath))
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}
	var parsed []string
	for _, a := range args {
		a = strings.ReplaceAll(a, "$(NODE_NAME)", testNodeName)
		if a == "--config="+configPath {
			a = "--config=" + local
		}
		parsed = append(parsed, a)
	}
	opts := config.NewOptions()
	fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	opts.AddFlags(fs)
	if err := fs.Parse(parsed); err != nil {
		t.Errorf("container %q: sluice rejects its arguments %q: %v", c.Name, args, err)
		return nil
	}
	if err := opts.Complete(fs); err != nil {
		t.Errorf("container %q: sluice rejects its configuration %s: %v", c.Name, configPath, err)
		return nil
	}
	if opts.Effective.NodeName != testNodeName {
		t.Errorf("node name = %q, want %q from --hostname-override", opts.Effective.NodeName, testNodeName)
	}
	if len(opts.IgnoredFlags) > 0 {
		t.Errorf("container %q passes flags that --config overrides: %v", c.Name, opts.IgnoredFlags)
	}
	// The strict decoder alone, so that a failure names the file's problem plainly.
	if _, err := config.Decode(content); err != nil {
		t.Errorf("%s does not decode strictly: %v", configPath, err)
	}
	return opts
}

// mountedConfigMapKey returns the content of the ConfigMap key that c sees at path.
func mountedConfigMapKey(t *testing.T, spec corev1.PodSpec, c *corev1.Container, configMaps configMapLookup, path string) []byte {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") || m.SubPath != "" {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			key := rel
			for _, item := range v.ConfigMap.Items {
				if item.Path == rel {
					key = item.Key
				}
			}
			cm, err := configMaps(v.ConfigMap.Name)
			if err != nil || cm == nil {
				t.Errorf("container %q mounts ConfigMap %q at %s, which does not exist (%v)", c.Name, v.ConfigMap.Name, m.MountPath, err)
				return nil
			}
			data, ok := cm.Data[key]
			if !ok {
				t.Errorf("ConfigMap %q has no key %q for %s (keys: %v)", cm.Name, key, path, keys(cm.Data))
				return nil
			}
			return []byte(data)
		}
	}
	t.Errorf("container %q: %s is not in a mounted ConfigMap", c.Name, path)
	return nil
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// containerPort resolves a probe's port (a number or a port name) in c.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	t.Errorf("container %q has no port named %q", c.Name, p.StrVal)
	return -1
}

// addressPort is the port of a host:port address.
func addressPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return n
}

// checkProbes: liveness and startup on /livez, readiness on /healthz, both on the port of
// healthzBindAddress, and both paths answered by sluice's health server (not 404).
func checkProbes(t *testing.T, c *corev1.Container, opts *config.Options) {
	t.Helper()
	if opts.Effective.HealthzBindAddress == "" {
		t.Error("healthzBindAddress is empty: sluice serves no /healthz or /livez for the probes")
		return
	}
	healthzPort := addressPort(t, opts.Effective.HealthzBindAddress)
	handler := health.NewProxyHealthServer(opts.Effective.HealthzBindAddress, 2*opts.Effective.SyncPeriod).Handler()
	probes := []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, "/livez"},
		{"readiness", c.ReadinessProbe, "/healthz"},
		{"startup", c.StartupProbe, "/livez"},
	}
	for _, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("container %q: no HTTP %s probe", c.Name, p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s probe path = %q, want %s", p.name, g.Path, p.path)
		}
		if port := containerPort(t, c, g.Port); port != healthzPort {
			t.Errorf("%s probe port = %d, but sluice serves health on %s", p.name, port, opts.Effective.HealthzBindAddress)
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s probe scheme = %s; sluice's health server speaks HTTP", p.name, g.Scheme)
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, g.Path, nil))
		if rec.Code == http.StatusNotFound {
			t.Errorf("%s probe: sluice's health server does not serve %s", p.name, g.Path)
		}
	}
	if l := c.LivenessProbe; l != nil {
		// A liveness probe that gives up before /livez itself would (2 x syncPeriod)
		// restarts a proxy that is only slow.
		patience := time.Duration(l.PeriodSeconds*l.FailureThreshold) * time.Second
		if patience < opts.Effective.SyncPeriod {
			t.Errorf("liveness probe gives up after %s, less than syncPeriod %s", patience, opts.Effective.SyncPeriod)
		}
	}
}

// checkMetricsPort: the container's "metrics" port is metricsBindAddress's, reachable from
// other pods when want says Prometheus scrapes it.
func checkMetricsPort(t *testing.T, c *corev1.Container, opts *config.Options, exposed bool) {
	t.Helper()
	addr := opts.Effective.MetricsBindAddress
	port := containerPort(t, c, intstr.FromString("metrics"))
	if port != addressPort(t, addr) {
		t.Errorf("port \"metrics\" is %d but sluice serves metrics on %s", port, addr)
	}
	if !exposed {
		return
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Errorf("metricsBindAddress %s is not reachable from Prometheus; want 0.0.0.0:%d", addr, port)
	}
}

// withTimeout is a context for one API round trip in e2e tests.
func withTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
