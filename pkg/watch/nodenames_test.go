package watch

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatafake "k8s.io/client-go/metadata/fake"
)

var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

func nodeMetadata(name string, labels map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name:          name,
			Labels:        labels,
			Annotations:   map[string]string{"node.alpha.kubernetes.io/ttl": "0", "big": strings.Repeat("x", 4096)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
	}
}

func sortedNodes(n *NodeNames) []string {
	out := slices.Collect(n.Nodes())
	slices.Sort(out)
	return out
}

func waitForNodes(t *testing.T, n *NodeNames, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := sortedNodes(n)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNodeNamesFollowsLinuxNodes(t *testing.T) {
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	client := metadatafake.NewSimpleMetadataClient(scheme,
		nodeMetadata("node-a", map[string]string{v1.LabelOSStable: "linux", "role": "worker"}),
		nodeMetadata("node-b", nil), // no os label: may run sluice
		nodeMetadata("win-1", map[string]string{v1.LabelOSStable: "windows"}),
	)
	n, err := NewNodeNames(client)
	if err != nil {
		t.Fatal(err)
	}
	if n.HasSynced() {
		t.Error("synced before starting")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n.Start(ctx)
	if !n.WaitForSync(ctx) {
		t.Fatal("never synced")
	}
	waitForNodes(t, n, "node-a", "node-b")

	// What the cache keeps is the name and the os label only.
	for _, obj := range n.informer.GetStore().List() {
		m := obj.(*metav1.PartialObjectMetadata)
		if len(m.ManagedFields) != 0 || len(m.Annotations) != 0 || len(m.Labels) > 1 {
			t.Errorf("cached %s keeps %d managedFields, %d annotations, labels %v", m.Name, len(m.ManagedFields), len(m.Annotations), m.Labels)
		}
	}

	// The metadata fake has no Create or Update; its object tracker does.
	tracker := client.Tracker()
	if err := tracker.Create(nodesResource, nodeMetadata("node-c", nil), ""); err != nil {
		t.Fatal(err)
	}
	waitForNodes(t, n, "node-a", "node-b", "node-c")
	if err := client.Resource(nodesResource).Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForNodes(t, n, "node-b", "node-c")
	relabelled := nodeMetadata("node-b", map[string]string{v1.LabelOSStable: "windows"})
	if err := tracker.Update(nodesResource, relabelled, ""); err != nil {
		t.Fatal(err)
	}
	waitForNodes(t, n, "node-c")
}

func TestNodeNamesStopsEarlyIteration(t *testing.T) {
	n := &NodeNames{names: map[string]struct{}{"a": {}, "b": {}, "c": {}}}
	count := 0
	for range n.Nodes() {
		count++
		break
	}
	if count != 1 {
		t.Errorf("iterated %d names after break", count)
	}
	// The read lock is released: a write goes through.
	n.update(nodeMetadata("d", nil))
	if got := sortedNodes(n); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("nodes %v", got)
	}
}
