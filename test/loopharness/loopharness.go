// Package loopharness runs the real sync loop (pkg/syncloop over a model.Tracker) around
// real backends, fed with Services and EndpointSlices kept in memory instead of an API
// server. Backend kernel tests use it to show what the daemon does over time, on the real
// clock: a rejected update retried on its backoff, drift repaired by the periodic full
// sync.
//
//	h := loopharness.New(t, loopharness.Config{Backends: []dataplane.Backend{b}, SyncPeriod: time.Second})
//	h.Set(loopharness.Service("ns", "web", "172.30.0.10", 80), loopharness.EndpointSlice("ns", "web", 80, "10.0.1.2"))
//	h.Start(t)
//	h.WaitFor(t, "web programmed", 10*time.Second, func(st syncloop.FamilyStatus) bool { return !st.LastSuccess.IsZero() })
package loopharness

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/model/modeltest"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
)

// Config describes the loop. Zero intervals get short defaults fit for tests: syncPeriod
// 1 s, minSyncPeriod 100 ms, maxInterval syncPeriod (as in the nftables and ipvs modes).
type Config struct {
	Backends                                   []dataplane.Backend
	SyncPeriod, MinSyncPeriod, MaxSyncInterval time.Duration
	// Node is this node; its name defaults to "node1".
	Node model.NodeInfo
}

// Harness is a running sync loop and its in-memory API objects.
type Harness struct {
	Tracker *model.Tracker
	Loop    *syncloop.Loop
	// Reports counts the Events the loop asked for.
	Reports *Reports
	src     *modeltest.Source // the tracker's view of the API: what Set stored
	cancel  context.CancelFunc
	done    chan error
}

// New builds the tracker and the loop; Set the initial objects, then Start.
func New(t testing.TB, cfg Config) *Harness {
	t.Helper()
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = time.Second
	}
	if cfg.MinSyncPeriod == 0 {
		cfg.MinSyncPeriod = 100 * time.Millisecond
	}
	if cfg.MaxSyncInterval == 0 {
		cfg.MaxSyncInterval = cfg.SyncPeriod
	}
	if cfg.Node.Name == "" {
		cfg.Node.Name = "node1"
	}
	var families []model.IPFamily
	for _, b := range cfg.Backends {
		families = append(families, b.Family())
	}
	h := &Harness{Reports: &Reports{failed: map[types.NamespacedName]int{}}, src: modeltest.NewSource()}
	h.Tracker = model.NewTracker(model.TrackerConfig{
		Source: h.src, Node: cfg.Node, Options: model.Options{Families: families},
		Notify: func() {
			if h.Loop != nil {
				h.Loop.Request()
			}
		},
	})
	loop, err := syncloop.New(syncloop.Config{
		Tracker: h.Tracker, Backends: cfg.Backends, Reporter: h.Reports,
		MinSyncPeriod: cfg.MinSyncPeriod, SyncPeriod: cfg.SyncPeriod, MaxSyncInterval: cfg.MaxSyncInterval,
	})
	if err != nil {
		t.Fatalf("syncloop.New: %v", err)
	}
	h.Loop = loop
	return h
}

// Start marks the caches synced and runs the loop until the test ends.
func (h *Harness) Start(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.Loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("sync loop: %v", err)
		}
	})
	h.Tracker.OnServicesSynced()
	h.Tracker.OnEndpointSlicesSynced()
	h.Loop.Request()
}

// Set adds or replaces Services and EndpointSlices, as the informers would report them.
func (h *Harness) Set(objs ...any) {
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			if old := h.src.PutService(o); old != nil {
				h.Tracker.OnServiceUpdate(old, o)
			} else {
				h.Tracker.OnServiceAdd(o)
			}
		case *discoveryv1.EndpointSlice:
			if old := h.src.PutSlice(o); old != nil {
				h.Tracker.OnEndpointSliceUpdate(old, o)
			} else {
				h.Tracker.OnEndpointSliceAdd(o)
			}
		default:
			panic("loopharness: Set takes *v1.Service and *discoveryv1.EndpointSlice")
		}
	}
}

// Status returns the status of the family's syncs.
func (h *Harness) Status(family model.IPFamily) syncloop.FamilyStatus {
	for _, st := range h.Loop.Status() {
		if st.Family == family.String() {
			return st
		}
	}
	return syncloop.FamilyStatus{}
}

// WaitFor polls cond on the status of the first backend's family until it holds, failing
// the test after timeout.
func (h *Harness) WaitFor(t testing.TB, what string, timeout time.Duration, cond func(syncloop.FamilyStatus) bool) syncloop.FamilyStatus {
	t.Helper()
	family := familyOf(h.Loop.Status()[0].Family)
	deadline := time.Now().Add(timeout)
	for {
		st := h.Status(family)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; status %+v", what, timeout, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func familyOf(s string) model.IPFamily {
	if s == model.IPv6.String() {
		return model.IPv6
	}
	return model.IPv4
}

// Service returns a ClusterIP Service with one TCP port named "p" (its single-family
// address's family).
func Service(namespace, name, clusterIP string, port int32) *v1.Service {
	fam := v1.IPv4Protocol
	if netip.MustParseAddr(clusterIP).Is6() {
		fam = v1.IPv6Protocol
	}
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}, IPFamilies: []v1.IPFamily{fam},
			Ports: []v1.ServicePort{{Name: "p", Port: port, Protocol: v1.ProtocolTCP}},
		},
	}
}

// EndpointSlice returns the one EndpointSlice of a Service made by Service: ready
// endpoints at ips on port (on node "node1").
func EndpointSlice(namespace, service string, port int32, ips ...string) *discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	var eps []discoveryv1.Endpoint
	for _, ip := range ips {
		if netip.MustParseAddr(ip).Is6() {
			at = discoveryv1.AddressTypeIPv6
		}
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node1"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: namespace, Name: service + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: at,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

// Reports is the loop's Reporter: it counts what would become Events.
type Reports struct {
	mu     sync.Mutex
	failed map[types.NamespacedName]int
}

// Failed returns how many times the loop reported that name could not be programmed.
func (r *Reports) Failed(name types.NamespacedName) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed[name]
}

// ServiceFailed implements syncloop.Reporter.
func (r *Reports) ServiceFailed(name types.NamespacedName, _ model.IPFamily, _ error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed[name]++
	return true
}

// ServiceProblems implements syncloop.Reporter.
func (r *Reports) ServiceProblems(types.NamespacedName, []model.Problem) bool { return true }

// Forget implements syncloop.Reporter.
func (r *Reports) Forget(types.NamespacedName) {}

// Eventually polls cond every 50 ms until it returns "" (done) or timeout passes, then
// fails the test with cond's last answer.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
