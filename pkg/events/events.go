// Package events reports to the Kubernetes API, as events.k8s.io/v1 Events, what an
// operator of a node or a Service owner needs to see without reading sluice's logs: that
// sluice started on a node, that a Service could not be programmed or has invalid fields,
// that a health check port could not be opened.
//
// Events are written by client-go's events broadcaster (tools/events) with reporting
// controller "sluice". Reporter bounds the Warnings about Services, because sluice runs on
// every node and the sync loop retries a failing Service on every sync: at most one per
// Service and reason per interval; per node, a budget for the node's own failures and one
// for bad input, each with a summary Event on the Node for what it held back; and the
// invalid fields of a Service, which every node sees alike, reported by one node per
// Service (elected by rendezvous hashing over the cluster's Nodes). Every node still logs
// and counts in metrics everything it finds; Events are the short version for kubectl.
package events

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
)

// ReportingController is the reportingController of every Event sluice writes.
const ReportingController = "sluice"

// Reasons of the Events sluice writes. The ones upstream kube-proxy also writes keep
// upstream's spelling.
const (
	// ReasonStarting (Normal, on the Node): sluice started.
	ReasonStarting = "Starting"
	// ReasonFailedToProgramService (Warning, on the Service): the kernel rejected the
	// Service's update; it keeps its last good programming and the sync loop retries it on
	// its own backoff (see pkg/syncloop). Rate-limited per Service and overall (budget.go).
	ReasonFailedToProgramService = "FailedToProgramService"
	// ReasonInvalidService (Warning, on the Service): some fields of the Service or its
	// EndpointSlices are invalid and were left out; the rest is programmed.
	ReasonInvalidService = "InvalidService"
	// ReasonFailedToStartServiceHealthcheck (Warning, on the Service): its
	// healthCheckNodePort could not be opened.
	ReasonFailedToStartServiceHealthcheck = "FailedToStartServiceHealthcheck"
	// ReasonFailedToStartProxierHealthcheck (Warning, on the Node): the /healthz server
	// could not start.
	ReasonFailedToStartProxierHealthcheck = "FailedToStartProxierHealthcheck"
	// ReasonFailedToStartMetricServer (Warning, on the Node): the metrics server could not
	// start.
	ReasonFailedToStartMetricServer = "FailedToStartMetricServer"
	// ReasonConfigurationWarning (Warning, on the Node): the configuration file has fields
	// that only a lenient decode accepts (unknown, duplicated); sluice started with it.
	ReasonConfigurationWarning = "ConfigurationWarning"
	// ReasonNodeSetupWarning (Warning, on the Node): kernel settings sluice could not write
	// at start (read-only /proc/sys in an unprivileged container); it runs with the
	// current values.
	ReasonNodeSetupWarning = "NodeSetupWarning"
	// ReasonNoLocalTrafficDetection (Warning, on the Node): detectLocalMode has no CIDR
	// for the node's primary family (NodeCIDR and a Node without pod CIDRs, ClusterCIDR
	// without clusterCIDR); Services are programmed without local-traffic detection.
	ReasonNoLocalTrafficDetection = "NoLocalTrafficDetection"
)

// Broadcaster owns the client-go events broadcaster that writes Events to the API.
type Broadcaster struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorderLogger
}

// NewBroadcaster returns a broadcaster that writes events.k8s.io/v1 Events through
// client. Its recorder's reporting instance is "sluice-<hostname>", as client-go builds it
// (upstream kube-proxy's is "kube-proxy-<hostname>"); on a hostNetwork DaemonSet pod the
// hostname is the node's name.
func NewBroadcaster(client kubernetes.Interface) *Broadcaster {
	return newBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
}

// newBroadcaster is NewBroadcaster writing to any sink, for tests.
func newBroadcaster(sink events.EventSink) *Broadcaster {
	b := events.NewBroadcaster(sink)
	return &Broadcaster{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, ReportingController)}
}

// Recorder returns the recorder to hand to NewReporter. Events recorded before Start are
// buffered by client-go.
func (b *Broadcaster) Recorder() events.EventRecorder { return b.recorder }

// Start begins writing recorded Events to the API until ctx ends.
func (b *Broadcaster) Start(ctx context.Context) error {
	if err := b.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("start writing events: %w", err)
	}
	return nil
}

// Shutdown stops the broadcaster; Events not yet written are dropped.
func (b *Broadcaster) Shutdown() { b.broadcaster.Shutdown() }
