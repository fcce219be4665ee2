package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fullsync"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

const (
	// defaultFullSyncPeriod is how often a full sync repairs drift when nothing else asked
	// for one: upstream's FullSyncPeriod.
	defaultFullSyncPeriod = time.Hour
	// defaultLargeFullSyncPeriod replaces it above largeClusterEndpoints endpoints, where a
	// full sync of the legacy flavour holds the xtables lock for seconds. Upstream never
	// resyncs large clusters periodically; sluice does, rarely, so that drift the canary
	// cannot see (a rule deleted inside a chain) is still repaired.
	defaultLargeFullSyncPeriod = 6 * time.Hour
	// defaultNFTMaxChains bounds the chains one iptables-nft-restore creates. iptables-nft
	// inserts each new chain into a sorted list, and its cost grows with the square of the
	// chains in one run: 11 000 new chains take 2.6 s in one run, 110 000 do not finish in
	// 13 minutes (which is why upstream never completes 10 000 Services there). Batches of
	// this size keep each run well under a second whatever the total.
	defaultNFTMaxChains = 2000
)

// Backend programs Services with iptables for one IP family.
type Backend struct {
	cfg    dataplane.Config
	opts   options
	logger klog.Logger
	tools  *xtables.Tools
	editor ruleEditor
	// counters maps the counted Services' counter chains to their series (for
	// ReadTrafficCounters, from any goroutine).
	counters dataplane.CounterIndex
	// packetsWanted says some port of the Apply in progress is counted; packetsWritten
	// that the kernel holds the packet counters' jumps (after the last full sync).
	// They differ when the first port is counted or the last one no longer is: a full
	// sync then adds or removes the jumps (packets.go).
	packetsWanted, packetsWritten bool
	sysctl                        hostnet.Sysctls

	tcpLiberal bool
	nfacct     bool
	maxChains  int

	// sync decides whether the next sync is full (and removes leftovers once).
	sync fullsync.State
	// applied mirrors, per Service, what the kernel holds; valid only while
	// !sync.NeedFull.
	applied map[types.NamespacedName]*appliedService
	// appliedNAT and appliedFilter total the rules of applied (see setApplied).
	appliedNAT, appliedFilter int
	// static is the fingerprint of the static rules in the kernel.
	static string
	// synced is set after the first successful full sync (read by Monitor).
	synced atomic.Bool
	// splitLogged is set once the reason for splitting restores has been logged.
	splitLogged bool

	stats ApplyStats
	// rc is the render configuration of the Apply in progress.
	rc *renderConfig
}

var _ dataplane.Backend = (*Backend)(nil)

// Option changes how New builds a Backend.
type Option func(*options)

type options struct {
	flavour             Flavour
	fullSyncPeriod      time.Duration
	largeFullSyncPeriod time.Duration
	maxChains           int
	skipLeftovers       bool
	waitSeconds         int
	localAddrs          func() ([]netip.Addr, error)
	now                 func() time.Time

	// Seams for tests.
	cmd        xtables.Commander
	probe      xtables.Probe
	editor     ruleEditor
	sysctl     hostnet.Sysctls
	nfacct     nfacctClient
	listChains bool // read chains with iptables-save even in the nft flavour
	faulty     func(types.NamespacedName, []*model.ServicePort) bool
}

// WithFlavour forces the iptables flavour instead of detecting it.
func WithFlavour(f Flavour) Option { return func(o *options) { o.flavour = f } }

// WithFullSyncPeriod sets how often a full sync repairs drift (default 1h), and above 1000
// endpoints (default 6h).
func WithFullSyncPeriod(small, large time.Duration) Option {
	return func(o *options) { o.fullSyncPeriod, o.largeFullSyncPeriod = small, large }
}

// WithMaxChainsPerRestore bounds how many chains one iptables-restore run declares (the
// nft flavour splits large syncs; 0 keeps the flavour's default, -1 never splits).
func WithMaxChainsPerRestore(n int) Option { return func(o *options) { o.maxChains = n } }

// WithoutLeftoverCleanup skips removing other modes' leftovers (leftovers.RemoveOtherModes)
// after the first sync.
func WithoutLeftoverCleanup() Option { return func(o *options) { o.skipLeftovers = true } }

// WithLocalAddresses replaces the lookup of this node's addresses (the NodePort
// destinations when nodePortAddresses is not match-all).
func WithLocalAddresses(fn func() ([]netip.Addr, error)) Option {
	return func(o *options) { o.localAddrs = fn }
}

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithSysctls sets and reads sysctls (route_localnet, nf_conntrack_tcp_be_liberal) through
// s instead of /proc/sys: the daemon passes one that turns a write the container cannot make
// into a warning (hostnet.Tolerant); tests pass a fake.
func WithSysctls(s hostnet.Sysctls) Option { return func(o *options) { o.sysctl = s } }

func withCommander(c xtables.Commander) Option { return func(o *options) { o.cmd = c } }
func withEditor(e ruleEditor) Option           { return func(o *options) { o.editor = e } }
func withNFAcct(n nfacctClient) Option         { return func(o *options) { o.nfacct = n } }
func withProbe(p xtables.Probe) Option         { return func(o *options) { o.probe = p } }
func withSaveListing() Option                  { return func(o *options) { o.listChains = true } }
func withFaultyServices(names ...types.NamespacedName) Option {
	return withFault(func(n types.NamespacedName, _ []*model.ServicePort) bool { return slices.Contains(names, n) })
}

// withFault gives the Services (in the versions) fault picks one rule the kernel rejects,
// in the rules written to the kernel: a rejected update without a fake kernel.
func withFault(fault func(types.NamespacedName, []*model.ServicePort) bool) Option {
	return func(o *options) { o.faulty = fault }
}

// New sets the node up for the iptables mode and returns the backend of one family. It
// picks the iptables flavour, sets sysctls (route_localnet when localhost NodePorts are on)
// and probes nfacct. It does not touch existing rules, its own or upstream's: the first
// Apply rewrites them in place, one transaction per table, so traffic keeps flowing across
// a restart or a switch from kube-proxy; the leftovers of upstream's other modes (nftables
// table, IPVS) are removed once that first sync succeeded. Nothing is undone when sluice
// stops.
func New(ctx context.Context, cfg dataplane.Config, opts ...Option) (*Backend, error) {
	o := options{
		fullSyncPeriod:      defaultFullSyncPeriod,
		largeFullSyncPeriod: defaultLargeFullSyncPeriod,
		waitSeconds:         xtables.DefaultWaitSeconds,
		localAddrs:          hostnet.InterfaceAddrs,
		now:                 time.Now,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.cmd == nil {
		o.cmd = xtables.Exec{}
	}
	if o.probe == nil {
		o.probe = xtables.SystemProbe{}
	}
	if o.sysctl == nil {
		o.sysctl = hostnet.ProcSys{}
	}
	if o.nfacct == nil {
		o.nfacct = netlinkNFAcct{}
	}
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		return nil, fmt.Errorf("iptables backend: unknown IP family %v", cfg.Family)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", cfg.Family)
	b := &Backend{cfg: cfg, opts: o, logger: logger, sysctl: o.sysctl, applied: map[types.NamespacedName]*appliedService{},
		sync: fullsync.New(!o.skipLeftovers)}

	// Flavour.
	tools, choice, err := xtables.Choose(ctx, o.cmd, o.probe, cfg.Family, o.flavour)
	if err != nil {
		return nil, err
	}
	tools.WaitSeconds = o.waitSeconds
	b.tools = tools
	logger.Info("Using iptables", "flavour", choice.Flavour, "reason", choice.Reason, "restore", tools.RestoreProgram)

	b.maxChains = o.maxChains
	if b.maxChains == 0 && choice.Flavour == FlavourNFT {
		b.maxChains = defaultNFTMaxChains
	}
	if b.maxChains < 0 {
		b.maxChains = 0
	}
	if o.editor != nil {
		b.editor = o.editor
	} else {
		e, err := newGoIPTables(b.tools)
		if err != nil {
			return nil, err
		}
		b.editor = e
	}

	// Sysctls.
	if err := applySysctls(b.sysctl, cfg, logger); err != nil {
		return nil, err
	}
	if v, err := b.sysctl.Get(sysctlTCPBeLiberal); err == nil && v != 0 {
		b.tcpLiberal = true
		logger.Info("nf_conntrack_tcp_be_liberal is set, not dropping ctstate INVALID packets")
	}

	// nfacct counters: only when the kernel can hold them.
	nfacctErr := o.nfacct.Ensure(nfacctInvalidDropped)
	if nfacctErr == nil && localhostNodePortsActive(cfg) {
		nfacctErr = o.nfacct.Ensure(nfacctLocalhostAccept)
	}
	if nfacctErr == nil {
		b.nfacct = true
		registerNFAcct(&nfacctCollector{client: o.nfacct, localhostNodePorts: localhostNodePortsActive(cfg)}, logger)
	} else {
		logger.Error(nfacctErr, "nfacct is not available, its metrics are not exported")
	}

	return b, nil
}

// Mode implements dataplane.Backend.
func (b *Backend) Mode() dataplane.Mode { return dataplane.ModeIPTables }

// Family implements dataplane.Backend.
func (b *Backend) Family() model.IPFamily { return b.cfg.Family }

// Flavour returns the iptables flavour in use.
func (b *Backend) Flavour() Flavour { return b.tools.Flavour }

// ApplyStats describes the last Apply, for tests, benchmarks and diagnostics.
type ApplyStats struct {
	Full bool
	// Reason says why the sync was full ("" for partial).
	Reason string
	// Restores is the number of iptables-restore runs, Lines the lines fed to them.
	Restores, Lines int
	// Rules counts the rules written, per table.
	Rules    map[string]int
	Failed   int
	Duration time.Duration
}

// LastStats returns the statistics of the last Apply.
func (b *Backend) LastStats() ApplyStats { return b.stats }

// Apply implements dataplane.Backend. A partial sync writes only the changed Services'
// chains and their rules in the shared chains; a full sync (first sync, after a failure,
// when the canary chain is gone, when node-wide inputs changed, and every hour) rewrites
// everything. A Service whose rules iptables-restore rejects keeps the rules the kernel
// held for it (none if it is new) and is reported in Result.Failed; every other Service
// is programmed.
func (b *Backend) Apply(ctx context.Context, desired *model.NodeState, changes model.Changes) dataplane.Result {
	start := b.opts.now()
	b.stats = ApplyStats{Rules: map[string]int{}}
	res := dataplane.Result{Failed: map[types.NamespacedName]error{}}

	var localAddrs []netip.Addr
	if !b.cfg.NodePortAddresses.MatchAll {
		addrs, err := b.opts.localAddrs()
		if err != nil {
			b.logger.Error(err, "Could not list local addresses; NodePorts answer on none of them")
		}
		localAddrs = addrs
	}
	endpoints := 0
	for _, sp := range desired.Services {
		endpoints += len(sp.AllEndpoints)
	}
	b.packetsWanted = counting(desired)
	rc := newRenderConfig(b.cfg, desired.Node, localAddrs, b.tcpLiberal, b.nfacct, endpoints)
	rc.faulty = b.opts.faulty
	b.rc = rc
	static := renderStatic(rc)

	reason := b.fullReason(changes, static, endpoints)
	// What a full sync finds different from what the backend wrote is drift, when it
	// knows what it wrote (not before its first sync, not after one failed as a whole).
	var drift *dataplane.Drift
	if b.sync.Trusted() {
		drift = &dataplane.Drift{}
	}
	var err error
	if reason != "" {
		b.logger.V(2).Info("Syncing iptables rules", "fullSync", true, "reason", reason)
		err = b.syncFull(ctx, desired, rc, static, res.Failed, drift)
	} else {
		b.logger.V(2).Info("Syncing iptables rules", "fullSync", false, "services", changes.Services.Len())
		var changedBehind bool
		changedBehind, err = b.syncPartial(ctx, desired, changes, rc, res.Failed)
		if changedBehind && err == nil {
			reason = "kernel rules differ from what sluice wrote"
			b.logger.Info("Rules changed behind sluice's back, doing a full sync")
			b.sync.Failed()
			err = b.syncFull(ctx, desired, rc, static, res.Failed, drift)
			if drift != nil && drift.Count("rule") == 0 {
				drift.Add("rule", "written by sluice was gone (a partial sync could not delete it)")
			}
		}
	}
	if drift != nil && err == nil {
		drift.Report(b.logger, dataplane.ModeIPTables, b.cfg.Family)
	}
	res.Full = reason != ""
	res.Err = err
	if err != nil {
		// The kernel may hold anything now: rewrite everything next time.
		b.sync.Failed()
		if len(res.Failed) > 0 {
			err = fmt.Errorf("%w (and %d Services failed on their own)", err, len(res.Failed))
			res.Err = err
		}
		b.logger.Error(err, "iptables sync failed")
	}
	if len(res.Failed) > 0 {
		for name, ferr := range res.Failed {
			b.logger.Error(ferr, "Service left out of the iptables rules", "service", klog.KRef(name.Namespace, name.Name))
		}
	}
	if res.Err == nil && !b.synced.Load() && res.Full {
		b.synced.Store(true)
	}
	if res.Err == nil && res.Full && b.sync.LeftoversDue() {
		leftovers.RemoveOtherModes(ctx, b.logger, dataplane.ModeIPTables, b.cfg.Family, b.tools)
	}

	b.counters.Update(desired, changes, res.Full, indexedChains)
	b.stats.Full, b.stats.Reason, b.stats.Failed = res.Full, reason, len(res.Failed)
	b.stats.Duration = b.opts.now().Sub(start)
	b.recordRuleMetrics(static)
	return res
}

// fullReason returns why this sync must be full, or "": fullsync's reasons (with the
// large-cluster period), then the node-wide rules changed or the canary chain gone.
func (b *Backend) fullReason(changes model.Changes, static *staticRules, endpoints int) string {
	period := b.opts.fullSyncPeriod
	if endpoints > largeClusterEndpoints {
		period = b.opts.largeFullSyncPeriod
	}
	if reason := b.sync.Reason(changes.Full, b.opts.now(), period); reason != "" {
		return reason
	}
	if static.fingerprint() != b.static {
		return "node-wide rules changed"
	}
	if b.packetsWanted != b.packetsWritten {
		return "packet counters switched"
	}
	if ok, err := b.canaryPresent(); err != nil {
		b.logger.Error(err, "Could not check the iptables canary")
	} else if !ok {
		b.logger.Info("iptables canary chain is gone: tables were flushed", "chain", chainCanary)
		return "canary chain missing"
	}
	return ""
}

// recordRuleMetrics sets the rule-count gauges from what the kernel holds.
func (b *Backend) recordRuleMetrics(static *staticRules) {
	fam := b.cfg.Family.String()
	for _, table := range []string{tableFilter, tableNAT} {
		metrics.IPTablesRulesLastSync.WithLabelValues(table, fam).Set(float64(b.stats.Rules[table]))
	}
	if b.sync.NeedFull {
		return
	}
	nat := static.ruleCount(tableNAT) + b.appliedNAT
	filter := static.ruleCount(tableFilter) + b.appliedFilter
	metrics.IPTablesRulesTotal.WithLabelValues(tableNAT, fam).Set(float64(nat))
	metrics.IPTablesRulesTotal.WithLabelValues(tableFilter, fam).Set(float64(filter))
}

// Monitor watches the canary chain every interval and calls resync when it disappears
// (a firewall reload or someone flushing the tables), as upstream's iptables monitor does.
// Apply notices the missing canary too, but only when it runs; Monitor makes it run. It
// returns when ctx ends. Run it in its own goroutine.
func (b *Backend) Monitor(ctx context.Context, interval time.Duration, resync func()) {
	// The poll never checks (and asks for a resync) once more after ctx ends, even when a
	// tick and the cancellation are ready together; it only ends with ctx.
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(context.Context) (bool, error) {
		if !b.synced.Load() {
			return false, nil
		}
		ok, err := b.canaryPresent()
		if err != nil {
			b.logger.Error(err, "Could not check the iptables canary")
			return false, nil
		}
		if !ok {
			b.logger.Info("iptables canary chain is gone, asking for a full sync", "chain", chainCanary)
			resync()
		}
		return false, nil
	})
}
