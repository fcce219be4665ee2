// Package watch connects sluice to the API server: shared informers for Services,
// EndpointSlices, ServiceCIDRs and this Node, with the same selectors upstream kube-proxy
// uses. Event handlers only record changes in a Sink (the model's change tracker); nothing
// here computes rules or touches the kernel.
//
// The informer caches are the only copy of API objects sluice keeps. Objects are slimmed on
// the way in (managedFields and annotations sluice does not read are dropped; an
// EndpointSlice and a Service are kept in compact forms of their own, cachedSlice and
// cachedService) and the tracker reads
// the current objects back through Source at sync time.
package watch

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Label and annotation keys sluice reads.
const (
	// LabelServiceProxyName marks Services handled by another proxy; sluice skips them.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks EndpointSlices of headless Services; sluice skips them.
	LabelHeadless = "service.kubernetes.io/headless"
	// AnnotationTriggerTime is the EndpointSlice annotation feeding the network programming
	// latency metric.
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	// AnnotationScheduler selects the IPVS scheduler of one Service.
	AnnotationScheduler = "ipvs.sluice.dev/scheduler"
	// AnnotationTrafficCounters asks the backends to count one Service's traffic.
	AnnotationTrafficCounters = "sluice.dev/traffic-counters"
)

// Sink receives changes. The model's change tracker implements it; every method must be
// cheap and goroutine-safe (informer handlers call it).
type Sink interface {
	OnServiceAdd(svc *v1.Service)
	OnServiceUpdate(old, cur *v1.Service)
	OnServiceDelete(svc *v1.Service)
	OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice)
	OnEndpointSliceUpdate(old, cur *discoveryv1.EndpointSlice)
	OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice)
	OnServiceCIDRsChange(cidrs []netip.Prefix)
}

// NodeSink receives this node's Node object whenever it changes (nil when deleted).
type NodeSink func(node *v1.Node)

// Watcher owns the informers.
type Watcher struct {
	factories []informers.SharedInformerFactory

	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	cidrs    cache.SharedIndexInformer
	node     cache.SharedIndexInformer

	// logger is the contextual logger of Start's ctx (klog's background one before Start);
	// the informers' handlers log through it.
	logger klog.Logger

	// byService finds a Service's EndpointSlices; the slice handler keeps it.
	byService sliceIndex
	// handlersSynced say whether the Service and EndpointSlice handlers have been handed
	// every object of the first list (nil before AddHandlers).
	handlersSynced []cache.InformerSynced
}

// New creates the informers; AddHandlers connects them to a Sink and Start runs them.
// resync is configSyncPeriod.
func New(client kubernetes.Interface, nodeName string, resync time.Duration) (*Watcher, error) {
	noProxyName, err := labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("building service-proxy-name selector: %w", err)
	}
	noHeadless, err := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("building headless selector: %w", err)
	}
	// One factory per selector: a factory applies its list options to every informer it makes.
	newFactory := func(tweak func(*metav1.ListOptions)) informers.SharedInformerFactory {
		opts := []informers.SharedInformerOption{informers.WithTransform(slim)}
		if tweak != nil {
			opts = append(opts, informers.WithTweakListOptions(tweak))
		}
		return informers.NewSharedInformerFactoryWithOptions(client, resync, opts...)
	}
	svcFactory := newFactory(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
	})
	sliceFactory := newFactory(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noHeadless).String()
	})
	nodeFactory := newFactory(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	})
	cidrFactory := newFactory(nil)

	w := &Watcher{
		factories: []informers.SharedInformerFactory{svcFactory, sliceFactory, nodeFactory, cidrFactory},
		services:  svcFactory.Core().V1().Services().Informer(),
		slices:    sliceFactory.Discovery().V1().EndpointSlices().Informer(),
		node:      nodeFactory.Core().V1().Nodes().Informer(),
		cidrs:     cidrFactory.Networking().V1().ServiceCIDRs().Informer(),
		logger:    klog.Background(),
	}
	w.byService.init()
	return w, nil
}

// AddHandlers makes the informers report every change to sink, and this node's Node
// object to nodeSink (which may be nil). Call it before Start.
func (w *Watcher) AddHandlers(sink Sink, nodeSink NodeSink) error {
	svcReg, err := w.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if svc, ok := asService(obj); ok {
				sink.OnServiceAdd(svc)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			old, ok1 := asService(oldObj)
			cur, ok2 := asService(newObj)
			if ok1 && ok2 {
				sink.OnServiceUpdate(old, cur)
			}
		},
		DeleteFunc: func(obj any) {
			if svc, ok := asService(obj); ok {
				sink.OnServiceDelete(svc)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("adding Service handler: %w", err)
	}
	// The index is updated before the sink hears of a change, so that the tracker, which
	// reads the index when it drains, never misses a slice it was told of.
	sliceReg, err := w.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			w.byService.update(nil, obj)
			if s, ok := asEndpointSlice(obj); ok {
				sink.OnEndpointSliceAdd(s)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			w.byService.update(oldObj, newObj)
			old, ok1 := asEndpointSlice(oldObj)
			cur, ok2 := asEndpointSlice(newObj)
			if ok1 && ok2 {
				sink.OnEndpointSliceUpdate(old, cur)
			}
		},
		DeleteFunc: func(obj any) {
			w.byService.update(obj, nil)
			if s, ok := asEndpointSlice(obj); ok {
				sink.OnEndpointSliceDelete(s)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("adding EndpointSlice handler: %w", err)
	}
	w.handlersSynced = []cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced}
	cidrsChanged := func() { sink.OnServiceCIDRsChange(w.ServiceCIDRs()) }
	if _, err := w.cidrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { cidrsChanged() },
		UpdateFunc: func(_, _ any) { cidrsChanged() },
		DeleteFunc: func(any) { cidrsChanged() },
	}); err != nil {
		return fmt.Errorf("adding ServiceCIDR handler: %w", err)
	}
	if nodeSink != nil {
		if _, err := w.node.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { nodeSink(asNode(obj)) },
			UpdateFunc: func(_, cur any) { nodeSink(asNode(cur)) },
			DeleteFunc: func(any) { nodeSink(nil) },
		}); err != nil {
			return fmt.Errorf("adding Node handler: %w", err)
		}
	}
	return nil
}

// Start runs the informers until ctx is done; they log through ctx's logger.
func (w *Watcher) Start(ctx context.Context) {
	w.logger = klog.FromContext(ctx)
	for _, f := range w.factories {
		f.Start(ctx.Done())
	}
}

// WaitForServicesAndEndpoints blocks until the Service and EndpointSlice caches have
// synced and their handlers have been handed the first list (nothing may be programmed
// before: EndpointSlices reads what the slice handler indexed), or ctx ends.
func (w *Watcher) WaitForServicesAndEndpoints(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), append([]cache.InformerSynced{w.services.HasSynced, w.slices.HasSynced}, w.handlersSynced...)...)
}

// WaitForNode blocks until the Node cache has synced, or ctx ends.
func (w *Watcher) WaitForNode(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), w.node.HasSynced)
}

// Shutdown stops the informers and waits for their goroutines.
func (w *Watcher) Shutdown() {
	for _, f := range w.factories {
		f.Shutdown()
	}
}

// Service returns the current Service named name from the cache.
func (w *Watcher) Service(name types.NamespacedName) (*v1.Service, bool) {
	obj, exists, err := w.services.GetStore().GetByKey(name.String())
	if err != nil || !exists {
		return nil, false
	}
	return asService(obj)
}

// EndpointSlices returns the current EndpointSlices of the Service named name (as far as
// the slice handler has been told), built afresh from the cache's compact form
// (cachedSlice).
func (w *Watcher) EndpointSlices(name types.NamespacedName) []*discoveryv1.EndpointSlice {
	return w.byService.slicesOf(name)
}

// Services returns every cached Service (for full recomputes and diagnostics).
func (w *Watcher) Services() []*v1.Service {
	objs := w.services.GetStore().List()
	return convertAll(objs, asService)
}

// AllEndpointSlices returns every cached EndpointSlice, built afresh like EndpointSlices'.
func (w *Watcher) AllEndpointSlices() []*discoveryv1.EndpointSlice {
	objs := w.slices.GetStore().List()
	return convertAll(objs, asEndpointSlice)
}

// convertAll converts cache objects with as, leaving out those it rejects.
func convertAll[T any](objs []any, as func(any) (T, bool)) []T {
	out := make([]T, 0, len(objs))
	for _, obj := range objs {
		if t, ok := as(obj); ok {
			out = append(out, t)
		}
	}
	return out
}

// Node returns this node's cached Node object.
func (w *Watcher) Node() (*v1.Node, bool) {
	objs := w.node.GetStore().List()
	if len(objs) == 0 {
		return nil, false
	}
	n, ok := objs[0].(*v1.Node)
	return n, ok
}

// ServiceCIDRs returns the ranges of every ServiceCIDR object, both families. Objects
// being deleted still count: their addresses may still be allocated.
func (w *Watcher) ServiceCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, obj := range w.cidrs.GetStore().List() {
		sc, ok := obj.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			} else {
				w.logger.V(2).Info("Ignoring invalid ServiceCIDR range", "serviceCIDR", klog.KObj(sc), "cidr", c)
			}
		}
	}
	return out
}

// deletedObject unwraps the tombstone an informer hands out when it missed a delete.
func deletedObject[T any](obj any) (T, bool) {
	if t, ok := obj.(T); ok {
		return t, true
	}
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		t, ok := tomb.Obj.(T)
		return t, ok
	}
	var zero T
	return zero, false
}

func asNode(obj any) *v1.Node {
	n, _ := deletedObject[*v1.Node](obj)
	return n
}
