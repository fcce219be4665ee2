package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fullsync"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// DefaultScheduler is the scheduler of Services that ask for none when the configuration
// names none either: round robin, as upstream.
const DefaultScheduler = "rr"

// Settings are the ipvs section of KubeProxyConfiguration, resolved for one family.
type Settings struct {
	// Scheduler is the default IPVS scheduler ("" means rr). A Service's
	// ipvs.sluice.dev/scheduler annotation overrides it.
	Scheduler string
	// ExcludeCIDRs are the family's ipvs.excludeCIDRs: virtual servers there are never
	// deleted, whoever made them.
	ExcludeCIDRs []netip.Prefix
	// StrictARP sets arp_ignore=1 and arp_announce=2.
	StrictARP bool
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's connection timeouts; 0 leaves the
	// kernel's alone.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}

// Backend programs Services with IPVS for one IP family.
type Backend struct {
	cfg      dataplane.Config
	settings Settings
	logger   klog.Logger
	now      func() time.Time

	ipvs  ipvsKernel
	links linkKernel
	sets  ipsetKernel
	ipt   xtables.Runner
	// tools are ipt's programs (nil when a test gives ipt), for leftover removal.
	tools   *xtables.Tools
	flavour Flavour
	opts    options

	// view is what the kernel holds, as far as the backend knows (nil before the first
	// full sync); idx is what the Services need, and draining the virtual servers (with
	// their owners) that hold a real server at weight 0.
	view     *kernelView
	env      *planEnv
	idx      *desiredIndex
	draining map[vsKey]types.NamespacedName
	// rules is the text of the ruleset last written, ruleCounts its rules per "table
	// chain".
	rules      string
	ruleCounts map[string]int
	// drift collects, during a full sync that trusts the index, what the kernel holds
	// differently from what the backend wrote.
	drift *dataplane.Drift
	// sync decides whether the next sync is full (and removes leftovers once). While
	// !sync.NeedFull (after a sync that did not fail as a whole) idx's records are what
	// the kernel holds for each Service (the last good versions).
	sync fullsync.State

	stats ApplyStats
}

var _ dataplane.Backend = (*Backend)(nil)

// Option changes how New builds a Backend.
type Option func(*options)

type options struct {
	skipLeftovers bool
	flavour       Flavour
	now           func() time.Time

	// Seams for tests.
	supported func() (bool, error)
	kernel    func() (hostnet.KernelVersion, error)
	ipvs      ipvsKernel
	links     linkKernel
	sets      ipsetKernel
	ipt       xtables.Runner
	sysctl    hostnet.Sysctls
	// fault picks operations to write in a form the kernel rejects (rejectedByKernel):
	// tests of a rejected update against the real kernel.
	fault func(op) bool
}

// WithoutLeftoverCleanup keeps other modes' leftovers (leftovers.RemoveOtherModes) after
// the first sync.
func WithoutLeftoverCleanup() Option { return func(o *options) { o.skipLeftovers = true } }

// WithFlavour forces the iptables flavour instead of detecting it.
func WithFlavour(f Flavour) Option { return func(o *options) { o.flavour = f } }

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithSysctls sets and reads sysctls through s instead of /proc/sys: the daemon passes one
// that turns a write the container cannot make into a warning (hostnet.Tolerant).
func WithSysctls(s hostnet.Sysctls) Option { return func(o *options) { o.sysctl = s } }

// ErrNoIPVS is returned by New on a kernel without IPVS.
var ErrNoIPVS = errors.New("kernel has no IPVS")

// checkInputs checks the configuration New and Render share and returns settings
// completed (default scheduler) and narrowed to cfg's family (ExcludeCIDRs).
func checkInputs(cfg dataplane.Config, settings Settings) (Settings, error) {
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		return settings, fmt.Errorf("unknown IP family %v", cfg.Family)
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return settings, fmt.Errorf("masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	if settings.Scheduler == "" {
		settings.Scheduler = DefaultScheduler
	}
	if !model.ValidIPVSScheduler(settings.Scheduler) {
		return settings, fmt.Errorf("ipvs.scheduler %q is not an IPVS scheduler (want one of rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, fo, ovf, twos)", settings.Scheduler)
	}
	settings.ExcludeCIDRs = slices.DeleteFunc(slices.Clone(settings.ExcludeCIDRs), func(p netip.Prefix) bool {
		return model.FamilyOf(p.Addr()) != cfg.Family
	})
	return settings, nil
}

// New checks that this kernel can run the ipvs mode, sets the sysctls it needs and returns
// the Backend of cfg.Family. It fails, rather than programming nothing, when the kernel has
// no IPVS or lacks the configured scheduler.
//
// It does not touch existing virtual servers, ipsets or rules (sluice's or upstream
// kube-proxy's): the first Apply reads them and converges them, so traffic keeps flowing
// across a restart or a switch from kube-proxy's ipvs mode.
func New(ctx context.Context, cfg dataplane.Config, settings Settings, opts ...Option) (*Backend, error) {
	o := options{now: time.Now, supported: KernelSupportsIPVS, kernel: hostnet.RunningKernel}
	for _, opt := range opts {
		opt(&o)
	}
	settings, err := checkInputs(cfg, settings)
	if err != nil {
		return nil, fmt.Errorf("ipvs backend: %w", err)
	}
	if err := requireIPVS(o.supported, settings.Scheduler); err != nil {
		return nil, err
	}
	kv, err := o.kernel()
	if err != nil {
		return nil, fmt.Errorf("check kernel version: %w", err)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", cfg.Family.String())
	b := &Backend{
		cfg: cfg, settings: settings, logger: logger, now: o.now, opts: o,
		idx:      newDesiredIndex(),
		draining: map[vsKey]types.NamespacedName{},
		sync:     fullsync.New(!o.skipLeftovers),
	}

	b.ipvs, b.links, b.sets = o.ipvs, o.links, o.sets
	if b.ipvs == nil {
		h, err := newMobyIPVS()
		if err != nil {
			return nil, err
		}
		b.ipvs = h
	}
	if b.links == nil {
		h, err := newNetlinkLinks()
		if err != nil {
			return nil, err
		}
		b.links = h
	}
	if b.sets == nil {
		h, err := newNetlinkIPSets()
		if err != nil {
			return nil, err
		}
		b.sets = h
	}

	s := o.sysctl
	if s == nil {
		s = hostnet.ProcSys{}
	}
	if err := applyKernelSettings(s, kv, b.ipvs, settings, logger); err != nil {
		return nil, err
	}
	if err := b.checkScheduler(settings.Scheduler); err != nil {
		return nil, err
	}

	if o.ipt != nil {
		b.ipt, b.flavour = o.ipt, o.flavour
	} else {
		tools, choice, err := xtables.Choose(ctx, xtables.Exec{}, xtables.SystemProbe{}, cfg.Family, o.flavour)
		if err != nil {
			return nil, fmt.Errorf("ipvs backend needs iptables for its masquerade and filter rules: %w", err)
		}
		b.ipt, b.tools, b.flavour = tools, tools, choice.Flavour
		logger.Info("Using iptables for the rules around IPVS", "flavour", choice.Flavour, "reason", choice.Reason)
	}
	logger.V(2).Info("Using IPVS", "kernel", kv.String(), "scheduler", settings.Scheduler, "connReuseMode", connReuseMode(kv), "excludeCIDRs", settings.ExcludeCIDRs)
	return b, nil
}

// checkScheduler makes sure the kernel has the scheduler, by creating a virtual server with
// it on a documentation address (never bound, so no traffic reaches it) and deleting it.
// IPVS loads the scheduler's module on demand; a kernel without it refuses the virtual
// server. Skipped when an existing virtual server already uses the scheduler.
func (b *Backend) checkScheduler(scheduler string) error {
	existing, err := b.ipvs.Services()
	if err != nil {
		return fmt.Errorf("read IPVS services: %w", err)
	}
	for _, p := range existing {
		if p.Scheduler == scheduler {
			return nil
		}
	}
	probe := vsKey{Proto: model.TCP, Addr: netip.MustParseAddr("198.51.100.0"), Port: 20000}
	if b.cfg.Family == model.IPv6 {
		probe.Addr = netip.MustParseAddr("2001:db8::ffff")
	}
	if err := b.ipvs.AddService(probe, vsParams{Scheduler: scheduler}); err != nil && !errors.Is(err, errExist) {
		if errors.Is(err, errNoScheduler) {
			return fmt.Errorf("IPVS scheduler %q is not available in this kernel: load ip_vs_%s (modprobe ip_vs_%s) or choose another ipvs.scheduler", scheduler, scheduler, scheduler)
		}
		return fmt.Errorf("probe IPVS scheduler %q: %w", scheduler, err)
	}
	after, err := b.ipvs.Services()
	if err != nil {
		return fmt.Errorf("read IPVS services: %w", err)
	}
	if _, ok := after[probe]; !ok {
		// moby/ipvs reports success when the kernel has no IPVS at all; KernelSupportsIPVS
		// said it has, so something else is wrong.
		return fmt.Errorf("%w: a probe virtual server was accepted but not kept", ErrNoIPVS)
	}
	if err := b.ipvs.DeleteService(probe); err != nil && !errors.Is(err, errNotExist) {
		return fmt.Errorf("delete the IPVS probe virtual server %s: %w", probe, err)
	}
	return nil
}

// Close releases the netlink sockets. What the backend programmed stays.
func (b *Backend) Close() error {
	for _, c := range []any{b.ipvs, b.links, b.sets} {
		if c, ok := c.(interface{ close() }); ok {
			c.close()
		}
	}
	return nil
}

// Mode implements dataplane.Backend.
func (b *Backend) Mode() dataplane.Mode { return dataplane.ModeIPVS }

// Family implements dataplane.Backend.
func (b *Backend) Family() model.IPFamily { return b.cfg.Family }

// Flavour returns the iptables flavour of the rules around IPVS.
func (b *Backend) Flavour() Flavour { return b.flavour }

// ApplyStats describes the last Apply, for tests, benchmarks and diagnostics.
type ApplyStats struct {
	Full bool
	// Reason says why the sync was full ("" for partial).
	Reason string
	// Operations counts the kernel operations run, by kind ("add-vs", "delete-rs" ...).
	Operations map[string]int
	// DestinationReads counts the real-server listings (one netlink dump each).
	DestinationReads int
	// Restores counts iptables-restore runs.
	Restores int
	// Draining is the number of virtual servers with a real server draining after the sync.
	Draining int
	Duration time.Duration
}

// TotalOperations sums Operations.
func (s ApplyStats) TotalOperations() int {
	n := 0
	for _, v := range s.Operations {
		n += v
	}
	return n
}

// LastStats returns the statistics of the last Apply.
func (b *Backend) LastStats() ApplyStats { return b.stats }

// Apply implements dataplane.Backend.
//
// A full sync (asked for, the first, after a failure, and whenever cfg.SyncPeriod passed
// since the last, like upstream's ipvs runner) reads every virtual server, real server,
// address and ipset of the family and converges all of it, which repairs any drift. A
// partial sync converges only the changed Services, and those with real servers draining,
// reading only their real servers. A Service that cannot be programmed is reported in
// Result.Failed; the others are programmed regardless.
func (b *Backend) Apply(ctx context.Context, desired *model.NodeState, changes model.Changes) dataplane.Result {
	start := b.now()
	reason := b.sync.ReasonWithModel(b.view != nil, changes.Full, start, b.cfg.SyncPeriod)
	full := reason != ""
	b.stats = ApplyStats{Full: full, Reason: reason, Operations: map[string]int{}}
	defer func() { b.stats.Duration = b.now().Sub(start) }()

	// good remembers the Services' records before this sync, to put a rejected one back.
	good := &lastGood{records: b.idx.records, known: !b.sync.NeedFull}
	b.drift = nil
	var sc syncScope
	var err error
	if full {
		sc, err = b.scopeFull(ctx, desired)
	} else {
		sc, err = b.scopePartial(desired, changes, good)
	}
	if err != nil {
		b.sync.Failed()
		return dataplane.Result{Err: err, Full: full}
	}
	scope, records, previousOwners := sc.services, sc.records, sc.previousOwners

	p := makePlan(&planInput{
		family:         b.cfg.Family,
		full:           full,
		records:        records,
		scope:          scope,
		kernel:         b.view,
		exclude:        b.settings.ExcludeCIDRs,
		previousOwners: previousOwners,
	}, b.idx)
	for key, owner := range b.draining {
		if scope.Has(owner) {
			delete(b.draining, key)
		}
	}
	for key, owner := range p.draining {
		b.draining[key] = owner
	}
	res := b.execute(ctx, p, full, good)
	res.Full = full
	if b.drift != nil {
		b.drift.Report(b.logger, dataplane.ModeIPVS, b.cfg.Family)
		b.drift = nil
	}
	if res.Err != nil {
		b.sync.Failed()
	} else if full {
		b.sync.FullSynced(start)
		if b.sync.LeftoversDue() {
			leftovers.RemoveOtherModes(ctx, b.logger, dataplane.ModeIPVS, b.cfg.Family, b.tools)
		}
	}
	b.stats.Draining = len(b.draining)
	b.logger.V(2).Info("Synced IPVS", "full", full, "reason", reason, "servicesInScope", scope.Len(), "operations", b.stats.TotalOperations(),
		"destinationReads", b.stats.DestinationReads, "failedServices", len(res.Failed), "draining", len(b.draining), "elapsed", b.now().Sub(start).Seconds())
	return res
}

// syncScope is what one sync converges: the Services in scope, their records, and on a
// full sync who held which frontend before it.
type syncScope struct {
	services       sets.Set[types.NamespacedName]
	records        map[types.NamespacedName]*serviceRecord
	previousOwners map[vsKey]types.NamespacedName
}

// scopeFull reads the whole kernel and recomputes every record from scratch, remembering
// only who held which frontend.
func (b *Backend) scopeFull(ctx context.Context, desired *model.NodeState) (syncScope, error) {
	hadLink := b.view != nil && b.view.linkExists
	if err := b.readKernel(ctx, desired); err != nil {
		return syncScope{}, err
	}
	if b.sync.Trusted() {
		b.drift = b.driftOf(b.view, hadLink)
	}
	sc := syncScope{records: map[types.NamespacedName]*serviceRecord{}, previousOwners: b.idx.owners}
	b.idx = newDesiredIndex()
	sc.services = desired.ServiceNames()
	for _, owner := range sc.previousOwners {
		sc.services.Insert(owner)
	}
	for name := range sc.services {
		if ports := desired.PortsOf(name); len(ports) > 0 {
			sc.records[name] = buildRecord(ports, b.env)
		}
	}
	return sc, nil
}

// scopePartial recomputes the changed Services' records, adds the Services draining a real
// server (unchanged) and reads only their real servers. good gets the records before this
// sync of every Service in scope: makePlan replaces them in the index.
func (b *Backend) scopePartial(desired *model.NodeState, changes model.Changes, good *lastGood) (syncScope, error) {
	sc := syncScope{services: changes.Services.Clone(), records: map[types.NamespacedName]*serviceRecord{}}
	if sc.services == nil {
		sc.services = sets.New[types.NamespacedName]()
	}
	good.records = make(map[types.NamespacedName]*serviceRecord, sc.services.Len())
	for name := range changes.Services {
		if ports := desired.PortsOf(name); len(ports) > 0 {
			sc.records[name] = buildRecord(ports, b.env)
		}
	}
	for _, owner := range b.draining {
		if !sc.services.Has(owner) {
			sc.services.Insert(owner)
			if r := b.idx.records[owner]; r != nil {
				sc.records[owner] = r
			}
		}
	}
	for name := range sc.services {
		good.records[name] = b.idx.records[name]
	}
	if err := b.readDestinations(sc.services, sc.records); err != nil {
		return syncScope{}, err
	}
	return sc, nil
}

func (r *serviceRecord) vssOrNil() []desiredVS {
	if r == nil {
		return nil
	}
	return r.vss
}

// describeFailures joins errors of one Service into one.
func describeFailures(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}
