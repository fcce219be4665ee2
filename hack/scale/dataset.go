package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	// datasetNamespace holds the bulk Services; the sentinel has a namespace of its own
	// that sorts after it, so that a proxy programming Services in name order reaches the
	// sentinel last.
	datasetNamespace  = "scale"
	sentinelNamespace = "zz-scale-sentinel"
	sentinelName      = "sentinel"
	// servicePort is every Service's port; echoPort the echo servers' (the targetPort).
	servicePort = 80
	echoPort    = 8080
)

// fakeEndpointBase is the first address of the bulk Services' endpoints (100.64.0.0/10,
// shared address space): routed nowhere, overlapping no pod or Service range.
var fakeEndpointBase = netip.MustParseAddr("100.64.0.1")

// clusterIPs hands out the benchmark's ClusterIPs (see service) in the Service range
// base: the sentinel and the probe Services near its start, above the kubernetes
// Service's, and the bulk Services from bulkOffset on.
type clusterIPs struct {
	base netip.Prefix
}

const (
	sentinelOffset = 100
	probeOffset    = 200
	maxProbes      = 100
	bulkOffset     = 1024
)

func (c clusterIPs) sentinel() netip.Addr   { return addrAdd(c.base.Addr(), sentinelOffset) }
func (c clusterIPs) probe(k int) netip.Addr { return addrAdd(c.base.Addr(), probeOffset+int64(k)) }
func (c clusterIPs) bulk(i int) netip.Addr  { return addrAdd(c.base.Addr(), bulkOffset+int64(i)) }
func (c clusterIPs) maxBulk() int           { return 1<<(32-c.base.Bits()) - bulkOffset - 1 }

// dataset writes the Services and EndpointSlices every proxy in the run reads.
type dataset struct {
	kube       kubernetes.Interface
	clusterIPs clusterIPs
	endpoints  int
	workers    int
	logf       func(string, ...any)

	// bulk is the number of bulk Services written so far.
	bulk     int
	sentinel *corev1.Service
	// probes are the churn runs' probe Services, while they exist.
	probes []*corev1.Service

	// The last progress report (progress).
	progressMu  sync.Mutex
	lastWritten int
	lastAt      time.Time
	lastCPU     float64
}

// setup creates the namespaces and the sentinel Service (its EndpointSlice comes with the
// first pointSentinel).
func (d *dataset) setup(ctx context.Context) error {
	for _, ns := range []string{datasetNamespace, sentinelNamespace} {
		_, err := d.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	svc, err := d.kube.CoreV1().Services(sentinelNamespace).Create(ctx, service(sentinelNamespace, sentinelName, d.clusterIPs.sentinel()), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the sentinel Service: %w", err)
	}
	d.sentinel = svc
	return nil
}

// SentinelAddr is the sentinel's ClusterIP and port.
func (d *dataset) SentinelAddr() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(d.sentinel.Spec.ClusterIP), servicePort)
}

// service is a ClusterIP Service of one TCP port with the given ClusterIP.
//
// Every Service of the benchmark gets its ClusterIP from the benchmark (clusterIPs)
// rather than from kube-apiserver: 1.37 allocates a dynamic ClusterIP under one lock for
// the whole range, holding it across the IPAddress object's creation and two lists of every
// IPAddress (its allocation metrics), so dynamic allocations happen one at a time and each
// costs O(Services). A requested ClusterIP takes that lock only to find its range: the
// creates then run in parallel (the lists remain: writing N Services still costs O(N²) CPU).
func service(ns, name string, clusterIP netip.Addr) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: clusterIP.String(),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(echoPort),
			}},
		},
	}
}

func slice(ns, svcName string, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svcName + "-scale",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svcName,
				discoveryv1.LabelManagedBy:   "scale.sluice.local",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](echoPort),
		}},
	}
}

func readyEndpoint(ip netip.Addr, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To(node),
	}
}

// fakeEndpoint is the address of endpoint j of bulk Service i.
func fakeEndpoint(i, j, perService int) netip.Addr {
	return addrAdd(fakeEndpointBase, int64(i*perService+j))
}

// addrAdd is the IPv4 address delta after a (before it for a negative delta).
func addrAdd(a netip.Addr, delta int64) netip.Addr {
	b := a.As4()
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], uint32(int64(binary.BigEndian.Uint32(b[:]))+delta))
	return netip.AddrFrom4(out)
}

// bulkEndpoints are the endpoints bulk Service i is written with.
func (d *dataset) bulkEndpoints(i int) []discoveryv1.Endpoint {
	eps := make([]discoveryv1.Endpoint, d.endpoints)
	for j := range eps {
		eps[j] = readyEndpoint(fakeEndpoint(i, j, d.endpoints), fmt.Sprintf("fake-node-%d", (i+j)%100))
	}
	return eps
}

// extraEndpointBase is the first address of the endpoints churn adds (100.96.0.0/12, in
// the upper half of 100.64.0.0/10 that the dataset never reaches, below the moved ones).
var extraEndpointBase = netip.MustParseAddr("100.96.0.1")

// extraEndpoint is the address churn adds to bulk Service i.
func extraEndpoint(i int) netip.Addr { return addrAdd(extraEndpointBase, int64(i)) }

// movedEndpoint is the address endpoint move seq gives: from the top of 100.64.0.0/10
// down, a half the dataset never reaches.
func movedEndpoint(seq int) netip.Addr { return addrAdd(movedEndpointTop, -int64(seq)) }

// movedEndpointTop is the first address moves give.
var movedEndpointTop = netip.MustParseAddr("100.127.255.254")

// bulkName is the name of bulk Service i.
func bulkName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// grow writes bulk Services (and one EndpointSlice each) until there are n, with d.workers
// requests in flight. It returns how long that took. An object that exists already (a
// retried request that had succeeded) counts as written.
func (d *dataset) grow(ctx context.Context, n int) (time.Duration, error) {
	if n <= d.bulk {
		return 0, nil
	}
	start := time.Now()
	d.progressMu.Lock()
	d.lastWritten, d.lastAt = d.bulk, start
	d.lastCPU, _ = d.apiserverCPU()
	d.progressMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int)
	var (
		wg       sync.WaitGroup
		done     atomic.Int64
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	for range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := d.writeBulk(ctx, i); err != nil {
					fail(err)
					return
				}
				if c := done.Add(1); c%2000 == 0 {
					d.progress(d.bulk+int(c), n, start)
				}
			}
		}()
	}
feed:
	for i := d.bulk; i < n; i++ {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return time.Since(start), firstErr
	}
	if err := ctx.Err(); err != nil {
		return time.Since(start), err
	}
	d.bulk = n
	return time.Since(start), nil
}

// progress logs the writing rate, overall and since the last call, and kube-apiserver's
// CPU time per Service since then (its process_cpu_seconds_total): a ClusterIP allocation
// costs more the more Services exist.
func (d *dataset) progress(written, target int, start time.Time) {
	d.progressMu.Lock()
	defer d.progressMu.Unlock()
	now := time.Now()
	cpu, _ := d.apiserverCPU()
	line := fmt.Sprintf("dataset: %d/%d Services written (%.0f/s overall", written, target, float64(written-d.bulk)/now.Sub(start).Seconds())
	if written > d.lastWritten {
		n := float64(written - d.lastWritten)
		line += fmt.Sprintf(", %.0f/s lately, kube-apiserver %.1fms CPU per Service", n/now.Sub(d.lastAt).Seconds(), (cpu-d.lastCPU)/n*1000)
	}
	d.logf("%s)", line)
	d.lastWritten, d.lastAt, d.lastCPU = written, now, cpu
}

// apiserverCPU reads kube-apiserver's process_cpu_seconds_total.
func (d *dataset) apiserverCPU() (float64, error) {
	body, err := d.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").Do(context.Background()).Raw()
	if err != nil {
		return 0, err
	}
	v, ok := parseMetrics(string(body)).sum("process_cpu_seconds_total", nil)
	if !ok {
		return 0, fmt.Errorf("no process_cpu_seconds_total")
	}
	return v, nil
}

func (d *dataset) writeBulk(ctx context.Context, i int) error {
	name := bulkName(i)
	err := retry(ctx, func() error {
		ip := d.clusterIPs.bulk(i)
		_, err := d.kube.CoreV1().Services(datasetNamespace).Create(ctx, service(datasetNamespace, name, ip), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		if apierrors.IsInvalid(err) {
			// A busy apiserver may answer an earlier attempt with a timeout after it
			// stored the Service; the retry then fails on the ClusterIP (allocated before
			// the name is checked). The Service being there is success; otherwise the
			// address is held by an attempt still in flight or being rolled back.
			got, gerr := d.kube.CoreV1().Services(datasetNamespace).Get(ctx, name, metav1.GetOptions{})
			if gerr == nil && got.Spec.ClusterIP == ip.String() {
				return nil
			}
			return fmt.Errorf("%w: %w", errTransient, err)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating Service %s: %w", name, err)
	}
	eps := d.bulkEndpoints(i)
	err = retry(ctx, func() error {
		_, err := d.kube.DiscoveryV1().EndpointSlices(datasetNamespace).Create(ctx, slice(datasetNamespace, name, eps), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating EndpointSlice of %s: %w", name, err)
	}
	return nil
}

// errTransient marks an error of f that retry should retry although the API's status
// alone would not say so.
var errTransient = errors.New("transient")

// retry retries f on errors a busy apiserver returns (throttling, timeouts, conflicts),
// with a growing pause, a few times.
func retry(ctx context.Context, f func() error) error {
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		transient := errors.Is(err, errTransient) || apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsConflict(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
		if !transient || attempt == 8 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// pointSentinel makes pod (on node) the sentinel's only endpoint, creating its
// EndpointSlice the first time and patching it afterwards (a merge patch replaces the
// endpoint list in one request).
func (d *dataset) pointSentinel(ctx context.Context, pod netip.Addr, node string) error {
	eps := []discoveryv1.Endpoint{readyEndpoint(pod, node)}
	slices := d.kube.DiscoveryV1().EndpointSlices(sentinelNamespace)
	name := sentinelName + "-scale"
	patch, err := json.Marshal(map[string]any{"endpoints": eps})
	if err != nil {
		return err
	}
	_, err = slices.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		_, err = slices.Create(ctx, slice(sentinelNamespace, sentinelName, eps), metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("pointing the sentinel at %s: %w", pod, err)
	}
	return nil
}

// moveBulkEndpoint replaces the first endpoint of bulk Service i with an address no other
// endpoint has (seq numbers the moves of a benchmark; addresses past the dataset's are
// used), keeping its other endpoints: one endpoint of a Service of d.endpoints moves.
func (d *dataset) moveBulkEndpoint(ctx context.Context, i, seq int) error {
	eps := d.bulkEndpoints(i)
	eps[0] = readyEndpoint(movedEndpoint(seq), "fake-node-moved")
	patch, err := json.Marshal(map[string]any{"endpoints": eps})
	if err != nil {
		return err
	}
	name := bulkName(i)
	_, err = d.kube.DiscoveryV1().EndpointSlices(datasetNamespace).Patch(ctx, name+"-scale", types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("moving an endpoint of %s: %w", name, err)
	}
	return nil
}
