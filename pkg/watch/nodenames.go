package watch

import (
	"context"
	"iter"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// NodeNames follows the names of the cluster's Nodes that can run sluice (Linux nodes),
// for electing, per Service, the one node that writes the Events about problems every
// node sees (events.Electorate). upstream's system:node-proxier role may list and watch
// Nodes.
//
// It watches metadata only (PartialObjectMetadata, in protobuf), and keeps only the name
// and the kubernetes.io/os label of each: every sluice watching every Node is a fan-out of
// N² events, so each must be small. A Node whose kubernetes.io/os label says another
// system is left out; a Node without the label counts (sluice may well run there).
type NodeNames struct {
	factory  metadatainformer.SharedInformerFactory
	informer cache.SharedIndexInformer

	mu    sync.RWMutex
	names map[string]struct{}
}

// NewNodeNames creates the Node informer; Start runs it.
func NewNodeNames(client metadata.Interface) (*NodeNames, error) {
	factory := metadatainformer.NewSharedInformerFactoryWithOptions(client, 0, metadatainformer.WithTransform(slimNodeMetadata))
	n := &NodeNames{
		factory:  factory,
		informer: factory.ForResource(v1.SchemeGroupVersion.WithResource("nodes")).Informer(),
		names:    map[string]struct{}{},
	}
	if _, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    n.update,
		UpdateFunc: func(_, cur any) { n.update(cur) },
		DeleteFunc: n.remove,
	}); err != nil {
		return nil, err
	}
	return n, nil
}

// Start runs the informer until ctx ends.
func (n *NodeNames) Start(ctx context.Context) { n.factory.Start(ctx.Done()) }

// HasSynced reports whether the Nodes have been listed once.
func (n *NodeNames) HasSynced() bool { return n.informer.HasSynced() }

// WaitForSync waits until the Nodes have been listed once; false when ctx ended first.
func (n *NodeNames) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), n.informer.HasSynced)
}

// Nodes yields the name of every Node that can run sluice. It holds a read lock while
// yielding: the loop body must not call back into n.
func (n *NodeNames) Nodes() iter.Seq[string] {
	return func(yield func(string) bool) {
		n.mu.RLock()
		defer n.mu.RUnlock()
		for name := range n.names {
			if !yield(name) {
				return
			}
		}
	}
}

func (n *NodeNames) update(obj any) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if runsSluice(m) {
		n.names[m.Name] = struct{}{}
	} else {
		delete(n.names, m.Name)
	}
}

func (n *NodeNames) remove(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.names, m.Name)
}

// runsSluice reports whether a Node can run sluice: it is not labelled as running another
// operating system.
func runsSluice(m *metav1.PartialObjectMetadata) bool {
	os, ok := m.Labels[v1.LabelOSStable]
	return !ok || os == "linux"
}

// slimNodeMetadata keeps of a Node's metadata what NodeNames reads: the name, the
// resourceVersion and the kubernetes.io/os label. managedFields, annotations and the
// other labels can be kilobytes per Node.
func slimNodeMetadata(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	slim := &metav1.PartialObjectMetadata{
		TypeMeta:   m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion},
	}
	if os, ok := m.Labels[v1.LabelOSStable]; ok {
		slim.Labels = map[string]string{v1.LabelOSStable: os}
	}
	return slim, nil
}
