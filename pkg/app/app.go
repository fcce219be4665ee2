// Package app runs the sluice daemon: it wires the API watch, the model's change tracker,
// the sync loop, a backend per IP family, and the health, metrics and debug servers,
// from completed options.
package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/conntrack"
	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/events"
	"github.com/sluiceproxy/sluice/pkg/health"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
	"github.com/sluiceproxy/sluice/pkg/syncloop"
	"github.com/sluiceproxy/sluice/pkg/watch"
)

// nodeWaitTimeout bounds the wait for this node's Node object (and its IPs) at start, as
// upstream's 30 s.
const nodeWaitTimeout = 30 * time.Second

// Run runs sluice until ctx is cancelled or a fatal error occurs.
//
// o has been through config.Options.Complete: o.Config is the defaulted, validated
// KubeProxyConfiguration (what /configz serves), o.Effective its typed view, o.FeatureGates
// the evaluated gates, o.ConfigWarnings the fields of the file only a lenient decode
// accepted (cmd/sluice has logged them; Run counts them and reports them in an Event).
// Logging is already configured; --write-config-to is handled before Run is called.
//
// The order is what keeps a fleet rollout safe: /livez and /healthz listen before anything
// that can wait (the Node, the backends), and nothing the node's environment can make
// impossible (a read-only /proc/sys, a Node without pod CIDRs) stops sluice from starting:
// each is a warning with a log line, a metric and an Event.
func Run(ctx context.Context, o *config.Options) error {
	logger := klog.FromContext(ctx)
	e := o.Effective
	if o.Cleanup {
		return cleanupAll(ctx)
	}
	mode := e.Mode
	if o.Backend != "" {
		mode = dataplane.Mode(o.Backend)
	}
	// The recording backend programs nothing, so it changes no sysctl either (tests run it
	// in namespaces they do not own).
	programs := o.Backend != string(dataplane.ModeRecording)
	if o.InitOnly {
		return initOnly(ctx, mode, e, programs)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	client, err := newClient(o)
	if err != nil {
		return err
	}
	metrics.Register(string(e.Mode))
	conntrackHealth := registerConntrackHealth(logger)

	broadcaster := events.NewBroadcaster(client)
	if err := broadcaster.Start(ctx); err != nil {
		return fmt.Errorf("starting the event broadcaster: %w", err)
	}
	defer broadcaster.Shutdown()
	reporter := events.NewReporter(broadcaster.Recorder(), e.NodeName, 0)
	if err := electEventReporters(ctx, o, reporter); err != nil {
		return err
	}
	warnings := newStartupWarnings(logger)
	warnings.configFields(o.ConfigWarnings)

	// Alive before ready: the health server answers from the start. Until the Node is
	// read, /healthz says 503 with nodeEligible false and /livez 200, as upstream's server
	// does without a Node; neither waits for the first sync (see pkg/health).
	proxyHealth := health.NewProxyHealthServer(e.HealthzBindAddress, 2*e.SyncPeriod)
	servers := &servers{options: o, mode: mode, reporter: reporter}
	go servers.runHealthz(ctx, proxyHealth, cancel)

	// The privileged init container (--init-only) wrote the sysctls; this container may
	// not be able to, so a value that has changed since is a warning, not a failed start.
	sysctls := warnings.tolerantSysctls()
	if programs {
		setOOMScore(e.OOMScoreAdj, warnings)
		if err := setConntrackSysctls(ctx, e, conntrack.Kernel{Sysctls: sysctls, ModuleParameters: warnings.tolerantModuleParameters()}); err != nil {
			return err
		}
	}

	w, err := watch.New(client, e.NodeName, e.ConfigSyncPeriod)
	if err != nil {
		return err
	}

	// The node comes first: its IPs decide the families' primary addresses and
	// nodePortAddresses "primary", its pod CIDRs the NodeCIDR local detector.
	nodes := newNodeWatcher(e, cancel)
	nodes.onNode = proxyHealth.SyncNode
	node, err := nodes.waitForNode(ctx, client.CoreV1().Nodes(), nodeWaitTimeout)
	if err != nil {
		return err
	}
	families := supportedFamilies(ctx, e.Mode)
	logger.Info("Starting sluice", "mode", e.Mode, "backend", mode, "node", klog.KRef("", e.NodeName), "families", familyNames(families), "nodeIPs", node.IPs)
	reportLocalDetection(logger, e, node, families, reporter)

	backends, err := newBackends(ctx, mode, e, node, families, sysctls)
	if err != nil {
		return err
	}
	warnings.report(reporter)

	tracker, loop, err := newSyncLoop(ctx, o, w, nodes, node, families, backends, proxyHealth, reporter)
	if err != nil {
		return err
	}
	registerTrafficCounters(logger, o.TrafficCounters, backends)
	startMonitors(ctx, backends, e.SyncPeriod, loop.Request)

	servers.tracker, servers.loop, servers.families, servers.conntrack = tracker, loop, families, conntrackHealth
	go servers.runMetrics(ctx, cancel)
	if o.ConfigFile != "" {
		go watchConfigFile(ctx, o.ConfigFile, cancel)
	}

	reportStarting(logger, e, reporter)

	return runSyncs(ctx, w, tracker, loop)
}

// runSyncs starts the watch, lets the tracker and the loop program once the Services and
// EndpointSlices are received, and runs the sync loop until ctx ends. A cause other than a
// plain cancel (a changed config file, a Node that changed its IPs) is what Run returns.
func runSyncs(ctx context.Context, w *watch.Watcher, tracker *model.Tracker, loop *syncloop.Loop) error {
	logger := klog.FromContext(ctx)
	w.Start(ctx)
	defer w.Shutdown()
	go func() {
		if !w.WaitForServicesAndEndpoints(ctx) {
			return
		}
		logger.Info("Services and EndpointSlices received; programming")
		tracker.OnServicesSynced()
		tracker.OnEndpointSlicesSynced()
		loop.Request()
	}()

	err := loop.Run(ctx)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// newSyncLoop builds the change tracker fed by the watch, a Service health server per
// backend's family, and the one sync loop that drives the backends.
func newSyncLoop(ctx context.Context, o *config.Options, w *watch.Watcher, nodes *nodeWatcher, node model.NodeInfo, families []model.IPFamily,
	backends []dataplane.Backend, proxyHealth *health.ProxyHealthServer, reporter *events.Reporter) (*model.Tracker, *syncloop.Loop, error) {
	e := o.Effective
	var loop *syncloop.Loop
	tracker := model.NewTracker(model.TrackerConfig{
		Source: w,
		Node:   node,
		Options: model.Options{
			IgnoreExternalIPs: !o.FeatureGates.Enabled(config.AllowServiceExternalIPs),
			Families:          families,
			TrafficCounters:   o.TrafficCounters,
		},
		StartTime: time.Now(),
		Notify:    func() { loop.Request() },
	})
	nodes.tracker = tracker
	if err := w.AddHandlers(tracker, nodes.observe); err != nil {
		return nil, nil, err
	}

	serviceHealth := map[model.IPFamily]syncloop.ServiceHealth{}
	for _, b := range backends {
		f := b.Family()
		serviceHealth[f] = health.NewServiceHealthServer(ctx, health.ServiceHealthConfig{
			Family:            f,
			NodePortAddresses: e.NodePortAddressesFor(f, node),
			ProxyHealthy:      proxyHealth.IsHealthy,
			OnListenError:     reporter.ServiceHealthCheckFailed,
		})
	}
	loop, err := syncloop.New(syncloop.Config{
		Tracker:               tracker,
		Backends:              backends,
		MinSyncPeriod:         e.MinSyncPeriod,
		SyncPeriod:            e.SyncPeriod,
		MaxSyncInterval:       e.MaxSyncInterval,
		Health:                proxyHealth,
		ServiceHealth:         serviceHealth,
		Reporter:              reporter,
		Conntrack:             newConntrack(families),
		LocalHealthyEndpoints: health.LocalReadyEndpoints,
		HealthCheckNodePorts:  health.HealthCheckNodePorts,
		Clock:                 clock.RealClock{},
	})
	if err != nil {
		return nil, nil, err
	}
	return tracker, loop, nil
}

// registerTrafficCounters exports the per-Service traffic counters of the backends that
// keep them. They are read on scrape, through each backend's own kernel handle, never
// through the sync loop (issue 13). With --traffic-counters=off nothing is counted.
func registerTrafficCounters(logger klog.Logger, mode model.TrafficCounters, backends []dataplane.Backend) {
	if mode == model.TrafficCountersOff {
		return
	}
	var readers []dataplane.TrafficCounterReader
	for _, b := range backends {
		if r, ok := b.(dataplane.TrafficCounterReader); ok {
			readers = append(readers, r)
		}
	}
	if len(readers) > 0 {
		metrics.MustRegisterCollector(dataplane.NewTrafficCounterCollector(logger, readers...))
	}
}

// startMonitors starts the backends' watches for their rules vanishing.
func startMonitors(ctx context.Context, backends []dataplane.Backend, interval time.Duration, resync func()) {
	// A backend that can notice its rules vanishing (iptables: the canary chain flushed by a
	// firewall reload) watches for it every syncPeriod and asks for a sync, which repairs them.
	for _, b := range backends {
		if m, ok := b.(interface {
			Monitor(ctx context.Context, interval time.Duration, resync func())
		}); ok {
			go m.Monitor(ctx, interval, resync)
		}
	}
}

// reportStarting says sluice starts, and warns about a defaulted mode and the deprecated
// ipvs mode.
func reportStarting(logger klog.Logger, e *config.Effective, reporter *events.Reporter) {
	reporter.Starting("Starting sluice (" + string(e.Mode) + " mode)")
	if e.ModeDefaulted {
		logger.Error(nil, "No mode configured; using iptables. Upstream will switch the default to nftables: set mode explicitly")
		reporter.NodeWarning("KubeProxyDefaultMode", "No proxy mode configured; using iptables. In Kubernetes 1.40 the default mode will switch to 'nftables'; set mode explicitly.")
	}
	if e.Mode == dataplane.ModeIPVS {
		reporter.NodeWarning("IPVSDeprecation", "The ipvs mode is deprecated upstream (disabled by default in 1.40, removed in 1.43); sluice keeps it working. Please plan a move to 'nftables'.")
	}
}

// initOnly does what --init-only is for, in the privileged init container: the conntrack
// sysctls and the configured mode's node setup, where every failed write is an error (that
// container's job is to make them). The OOM score is left alone, as upstream does under
// --init-only: the process exits at once.
func initOnly(ctx context.Context, mode dataplane.Mode, e *config.Effective, programs bool) error {
	if programs {
		if err := setConntrackSysctls(ctx, e, conntrack.Kernel{}); err != nil {
			return err
		}
		if err := modeSetup(ctx, mode, e, supportedFamilies(ctx, mode), kernelModeSetup); err != nil {
			return err
		}
	}
	klog.FromContext(ctx).Info("Initialization done (--init-only); exiting", "mode", mode)
	return nil
}
