package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/sluiceproxy/sluice/pkg/config"
)

// The Prometheus Operator's types are not a dependency of sluice; these hold exactly the
// fields of monitoring.coreos.com/v1 that deploy/observability uses, with the operator's
// JSON names, so that strict decoding catches a misspelt or misplaced field. A field added
// to the manifests has to be added here, after checking the operator's API reference.
type (
	objectMeta struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels,omitempty"`
	}
	podMonitor struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   objectMeta     `json:"metadata"`
		Spec       podMonitorSpec `json:"spec"`
	}
	podMonitorSpec struct {
		JobLabel string `json:"jobLabel,omitempty"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings,omitempty"`
		} `json:"podMetricsEndpoints"`
	}
	prometheusRule struct {
		APIVersion string     `json:"apiVersion"`
		Kind       string     `json:"kind"`
		Metadata   objectMeta `json:"metadata"`
		Spec       struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	ruleGroup struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	}
)

// deployFiles lists the files under deploy/ with one of the extensions.
func deployFiles(t *testing.T, exts ...string) []string {
	t.Helper()
	var out []string
	root := filepath.Join(repoRoot(t), "deploy")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && slices.Contains(exts, filepath.Ext(path)) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no %v files under %s", exts, root)
	}
	return out
}

// yamlDocuments splits a YAML stream into its documents, skipping empty ones.
func yamlDocuments(t *testing.T, data []byte) [][]byte {
	t.Helper()
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

func TestEveryYAMLUnderDeployDecodesStrictly(t *testing.T) {
	for _, path := range deployFiles(t, ".yaml", ".yml") {
		rel, _ := filepath.Rel(repoRoot(t), path)
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			docs := yamlDocuments(t, data)
			if len(docs) == 0 {
				t.Fatal("no document")
			}
			for _, doc := range docs {
				var head struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
				}
				if err := yaml.Unmarshal(doc, &head); err != nil {
					t.Fatalf("not YAML: %v", err)
				}
				switch {
				case head.Kind == types.KustomizationKind:
					var k types.Kustomization
					if err := yaml.UnmarshalStrict(doc, &k); err != nil {
						t.Errorf("kustomization: %v", err)
					}
					if k.APIVersion != types.KustomizationVersion {
						t.Errorf("kustomization apiVersion %q, want %s", k.APIVersion, types.KustomizationVersion)
					}
					//nolint:staticcheck // SA1019: the check is that the deprecated field stays unused
					if len(k.CommonLabels) > 0 {
						t.Error("commonLabels rewrites selectors, which cannot change on an existing DaemonSet; use labels")
					}
				case head.APIVersion == "monitoring.coreos.com/v1" && head.Kind == "PodMonitor":
					var pm podMonitor
					if err := yaml.UnmarshalStrict(doc, &pm); err != nil {
						t.Errorf("PodMonitor: %v", err)
					}
				case head.APIVersion == "monitoring.coreos.com/v1" && head.Kind == "PrometheusRule":
					var pr prometheusRule
					if err := yaml.UnmarshalStrict(doc, &pr); err != nil {
						t.Errorf("PrometheusRule: %v", err)
					}
				default:
					obj, gvk, err := decodeStrict(doc)
					if err != nil {
						t.Errorf("%s/%s: %v", head.APIVersion, head.Kind, err)
						continue
					}
					if obj.GetObjectKind().GroupVersionKind() != *gvk {
						t.Errorf("decoded %v as %v", gvk, obj.GetObjectKind().GroupVersionKind())
					}
				}
			}
		})
	}
}

func TestBaseConfigurationDecodesStrictlyAndValidates(t *testing.T) {
	path := filepath.Join(repoRoot(t), "deploy", "base", "config.conf")
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	config.SetDefaults(cfg)
	config.ApplyPlatformDefaults(cfg)
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatalf("config.conf does not validate: %v", errs.ToAggregate())
	}
	if cfg.Mode != "nftables" {
		t.Errorf("mode = %q, want nftables", cfg.Mode)
	}
	if cfg.ClientConnection.Kubeconfig != "" {
		t.Errorf("kubeconfig = %q; the base uses the in-cluster service account", cfg.ClientConnection.Kubeconfig)
	}
	// What kubeadm clusters use: its kube-proxy ConfigMap leaves detectLocalMode empty
	// (ClusterCIDR) and sets clusterCIDR to the pod network, which the operator fills in.
	if cfg.DetectLocalMode != "ClusterCIDR" {
		t.Errorf("detectLocalMode = %q, want ClusterCIDR, as kubeadm clusters have", cfg.DetectLocalMode)
	}
}

func TestBaseAPIServerAddressIsLeftToTheOperator(t *testing.T) {
	// apiserver.env must set exactly the two variables client-go's in-cluster
	// configuration reads, and must not guess the host: a guess that is the Service
	// ClusterIP works until the first node reboots.
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "base", "apiserver.env"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("apiserver.env: %q is not NAME=value", l)
		}
		vars[k] = v
	}
	if got := keys(vars); !slices.Equal(got, []string{"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}) {
		t.Errorf("apiserver.env sets %v", got)
	}
	if vars["KUBERNETES_SERVICE_HOST"] != "" {
		t.Errorf("KUBERNETES_SERVICE_HOST = %q; leave it for the operator", vars["KUBERNETES_SERVICE_HOST"])
	}
}

func TestBaseRendersASluiceDaemonSetWithCapabilitiesOnly(t *testing.T) {
	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "base"))
	ds := r.onlyDaemonSet(t)
	if ds.Namespace != "kube-system" || ds.Name != "sluice" {
		t.Errorf("DaemonSet %s/%s, want kube-system/sluice", ds.Namespace, ds.Name)
	}
	checkDaemonSet(t, ds, func(name string) (*corev1.ConfigMap, error) { return r.configMap(name), nil }, baseWant)

	// The configuration's ConfigMap name carries a content hash, so a change rolls the
	// DaemonSet; the reference was rewritten to it.
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && !strings.HasPrefix(v.ConfigMap.Name, "sluice-config-") {
			t.Errorf("volume %q mounts ConfigMap %q, want the hashed sluice-config-*", v.Name, v.ConfigMap.Name)
		}
	}
	c := findContainer(ds.Spec.Template.Spec.Containers, "sluice")
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || r.configMap(c.EnvFrom[0].ConfigMapRef.Name) == nil {
		t.Errorf("the sluice container must take KUBERNETES_SERVICE_HOST/PORT from the generated sluice-apiserver ConfigMap: %+v", c.EnvFrom)
	}

	bindings := r.clusterRoleBindings()
	if len(bindings) != 1 {
		t.Fatalf("want one ClusterRoleBinding, got %d", len(bindings))
	}
	b := bindings[0]
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != "system:node-proxier" {
		t.Errorf("binding to %+v, want ClusterRole system:node-proxier", b.RoleRef)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != "sluice" || b.Subjects[0].Namespace != "kube-system" {
		t.Errorf("binding subjects %+v, want ServiceAccount kube-system/sluice", b.Subjects)
	}
}

// baseWant is what deploy/base's DaemonSet must be.
var baseWant = daemonSetWant{
	container:      "sluice",
	configPath:     "/var/lib/sluice/config.conf",
	serviceAccount: "sluice",
	mode:           "nftables",
	capabilities:   []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_RESOURCE"},
	metricsExposed: true,
}

func TestReplaceKubeProxyOverlayRendersAPartialKubeProxyDaemonSet(t *testing.T) {
	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "replace-kube-proxy"))
	if len(r.raw) != 1 {
		t.Fatalf("the overlay must hold only the kube-proxy DaemonSet's changes, got %d objects", len(r.raw))
	}
	ds := r.onlyDaemonSet(t)
	if ds.Namespace != "kube-system" || ds.Name != "kube-proxy" {
		t.Errorf("DaemonSet %s/%s, want kube-system/kube-proxy", ds.Namespace, ds.Name)
	}
	// Server-side apply merges only what is given: the selector, volumes, service account
	// and security context must stay kubeadm's, so the partial object must not carry them.
	spec := ds.Spec.Template.Spec
	if ds.Spec.Selector != nil || len(spec.Volumes) > 0 || spec.ServiceAccountName != "" || len(spec.Tolerations) > 0 || spec.HostNetwork {
		t.Error("the overlay restates fields kubeadm owns; it should only change the container")
	}
	c := findContainer(spec.Containers, "kube-proxy")
	if c == nil || len(spec.Containers) != 1 {
		t.Fatalf("want the one container kube-proxy, got %d containers", len(spec.Containers))
	}
	if c.SecurityContext != nil || len(c.VolumeMounts) > 0 || len(c.Env) > 0 {
		t.Error("the overlay restates the container's security context, mounts or env that kubeadm owns")
	}
	if want := []string{sluiceBinary, "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"}; !slices.Equal(c.Command, want) {
		t.Errorf("command = %q, want %q", c.Command, want)
	}
	if !strings.HasPrefix(c.Image, "sluice:") {
		t.Errorf("image %q: want the sluice image", c.Image)
	}
}

func TestObservabilityKitRenders(t *testing.T) {
	r := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "observability"))
	cm := r.configMap("sluice-dashboard")
	if cm == nil {
		t.Fatal("no sluice-dashboard ConfigMap")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v: Grafana's sidecar looks for grafana_dashboard=1", cm.Labels)
	}
	if !json.Valid([]byte(cm.Data["sluice-dashboard.json"])) {
		t.Error("the dashboard in the ConfigMap is not JSON")
	}
	var kinds []string
	for _, raw := range r.raw {
		var head struct{ Kind string }
		_ = json.Unmarshal(raw, &head)
		kinds = append(kinds, head.Kind)
	}
	slices.Sort(kinds)
	if want := []string{"ConfigMap", "PodMonitor", "PrometheusRule"}; !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
}

func TestPodMonitorScrapesThePodsOfBothDeployments(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "observability", "podmonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pm podMonitor
	if err := yaml.UnmarshalStrict(stripComments(data), &pm); err != nil {
		t.Fatal(err)
	}
	base := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "base")).onlyDaemonSet(t)
	overlay := render(t, filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "replace-kube-proxy")).onlyDaemonSet(t)
	for _, ds := range []struct {
		name      string
		labels    map[string]string
		container string
		ports     []corev1.ContainerPort
	}{
		{"base", base.Spec.Template.Labels, "sluice", findContainer(base.Spec.Template.Spec.Containers, "sluice").Ports},
		{"replace-kube-proxy", overlay.Spec.Template.Labels, "kube-proxy", findContainer(overlay.Spec.Template.Spec.Containers, "kube-proxy").Ports},
	} {
		for k, v := range pm.Spec.Selector.MatchLabels {
			if ds.labels[k] != v {
				t.Errorf("%s: pods lack the PodMonitor's label %s=%s", ds.name, k, v)
			}
		}
		if ds.labels[pm.Spec.JobLabel] != "sluice" {
			t.Errorf("%s: job label %s = %q, the rules and dashboard select job=\"sluice\"", ds.name, pm.Spec.JobLabel, ds.labels[pm.Spec.JobLabel])
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if !slices.ContainsFunc(ds.ports, func(p corev1.ContainerPort) bool {
				return p.Name == ep.Port && p.ContainerPort == config.DefaultMetricsPort
			}) {
				t.Errorf("%s: container %s has no port %q = %d", ds.name, ds.container, ep.Port, config.DefaultMetricsPort)
			}
			if ep.Path != "/metrics" {
				t.Errorf("path %q: sluice serves /metrics", ep.Path)
			}
		}
	}
}

// readmeSnippet returns the text between the line containing start and the next line
// equal to end, in deploy/README.md.
func readmeSnippet(t *testing.T, start, end string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if !strings.Contains(l, start) {
			continue
		}
		for j := i + 1; j < len(lines); j++ {
			if lines[j] == end {
				return strings.Join(lines[i+1:j], "\n") + "\n"
			}
		}
	}
	t.Fatalf("deploy/README.md has no snippet after %q", start)
	return ""
}

func TestReadmeSideBySideStepsGateBothDaemonSets(t *testing.T) {
	// Step 2's overlay keeps sluice off every node not yet labelled.
	fsys := filesys.MakeFsInMemory()
	base := filepath.Join(repoRoot(t), "deploy", "base")
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(base, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := fsys.WriteFile(filepath.Join("/deploy/base", e.Name()), data); err != nil {
			t.Fatal(err)
		}
	}
	gate := readmeSnippet(t, "cat > my-sluice/kustomization.yaml <<'EOF'", "EOF")
	if err := fsys.WriteFile("/my-sluice/kustomization.yaml", []byte(gate)); err != nil {
		t.Fatal(err)
	}
	ds := render(t, fsys, "/my-sluice").onlyDaemonSet(t)
	sel := ds.Spec.Template.Spec.NodeSelector
	if sel["sluice.io/proxy"] != "sluice" || sel["kubernetes.io/os"] != "linux" {
		t.Errorf("gated node selector %v", sel)
	}

	// Step 1's patch keeps kube-proxy off the labelled nodes: apply it to kubeadm's
	// DaemonSet as kubectl patch --type=strategic does.
	line := readmeSnippet(t, "# 1. Keep kube-proxy off nodes handed to sluice.", "kubectl -n kube-system rollout status ds/kube-proxy      # kube-proxy restarts once, in place")
	_, patch, ok := strings.Cut(strings.TrimSpace(line), "-p '")
	if !ok || !strings.HasSuffix(patch, "'") {
		t.Fatalf("cannot find the patch in %q", line)
	}
	patch = strings.TrimSuffix(patch, "'")
	var kubeProxy *appsv1.DaemonSet
	fixture, err := os.ReadFile(filepath.Join("testdata", "kubeadm-kube-proxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range yamlDocuments(t, fixture) {
		if obj, _, err := decodeStrict(doc); err == nil {
			if d, ok := obj.(*appsv1.DaemonSet); ok {
				kubeProxy = d
			}
		}
	}
	original, err := json.Marshal(kubeProxy)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := strategicpatch.StrategicMergePatch(original, []byte(patch), appsv1.DaemonSet{})
	if err != nil {
		t.Fatalf("the README's patch does not apply: %v", err)
	}
	obj, _, err := decodeStrict(patched)
	if err != nil {
		t.Fatalf("patched kube-proxy DaemonSet: %v", err)
	}
	aff := obj.(*appsv1.DaemonSet).Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatal("no required node affinity after the patch")
	}
	terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		t.Fatalf("node selector terms %+v", terms)
	}
	e := terms[0].MatchExpressions[0]
	if e.Key != "sluice.io/proxy" || e.Operator != corev1.NodeSelectorOpNotIn || !slices.Equal(e.Values, []string{"sluice"}) {
		t.Errorf("kube-proxy's affinity %+v does not exclude the nodes labelled for sluice", e)
	}
}
