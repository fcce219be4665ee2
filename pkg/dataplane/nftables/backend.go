package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/fullsync"
	"github.com/sluiceproxy/sluice/pkg/dataplane/leftovers"
	"github.com/sluiceproxy/sluice/pkg/hostnet"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// Backend programs the kube-proxy nftables table of one IP family.
type Backend struct {
	cfg    dataplane.Config
	f      *family
	c      *conn
	app    *applier
	logger klog.Logger

	// state is the model of the kernel table; nil until the first (full) Apply.
	state *tableState
	// sync decides full syncs: NeedFull after a failure whose effect on the kernel is not
	// known (or a Service rejected for a missing object, which only a full read repairs).
	sync fullsync.State
	// trusted is set while state is what the backend wrote (the last Apply did not fail
	// as a whole): a full read that differs from it found drift. It is not
	// sync.Trusted(): a Service rejected for a missing object asks for a full sync and
	// leaves the model trusted, so that the full read reports the missing object as drift.
	trusted bool

	// readForeign is the ruleset-generation watch's foreign count at the last full read
	// the kernel took (readMarked: there is one). While the namespace's generation shows
	// no commit but ours since, a periodic resync has nothing to read (generation.go).
	readForeign uint64
	readMarked  bool
	// readAddrs are the node addresses the last full sync planned @nodeport-ips with.
	readAddrs []netip.Addr

	deleteChainsNow bool
	localAddrs      func() ([]netip.Addr, error)
	now             func() time.Time

	// recordPlan keeps the last plan whole, for tests and debugging (it costs the
	// memory streaming saves).
	recordPlan bool
	lastPlan   *Plan
	stats      ApplyStats
	// counters maps the counted Services' path chains to their series; rc is the
	// netlink socket ReadTrafficCounters uses, so that a read never waits for an Apply.
	counters dataplane.CounterIndex
	rc       *conn
	// countingPackets: the last full sync planned the packet counters' fixed part.
	countingPackets bool
	// fault is withFault's function (tests).
	fault func(types.NamespacedName, []*model.ServicePort) faultKind
}

var _ dataplane.Backend = (*Backend)(nil)

// Option changes how New builds a Backend.
type Option func(*options)

type options struct {
	skipLeftovers bool
	limits        batchLimits
	localAddrs    func() ([]netip.Addr, error)
	now           func() time.Time
	fault         func(types.NamespacedName, []*model.ServicePort) faultKind
	recordPlan    bool
}

// WithoutLeftoverCleanup skips removing other modes' leftovers (leftovers.RemoveOtherModes)
// after the first sync (tests that create many backends in a namespace that never had them).
func WithoutLeftoverCleanup() Option { return func(o *options) { o.skipLeftovers = true } }

// WithBatchLimits bounds each transaction to maxBytes and maxMessages (benchmarks and
// tests of chunking).
func WithBatchLimits(maxBytes, maxMessages int) Option {
	return func(o *options) { o.limits = batchLimits{bytes: maxBytes, messages: maxMessages} }
}

// WithLocalAddresses replaces the lookup of the node's addresses (for @nodeport-ips).
func WithLocalAddresses(fn func() ([]netip.Addr, error)) Option {
	return func(o *options) { o.localAddrs = fn }
}

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// withPlanRecording keeps each Apply's plan (tests).
func withPlanRecording() Option { return func(o *options) { o.recordPlan = true } }

// withFault injects a bad message into the groups of the Services fault picks, given the
// version (ports) being programmed (tests of failure isolation: a rejected update in the
// kernel-write path).
func withFault(fault func(types.NamespacedName, []*model.ServicePort) faultKind) Option {
	return func(o *options) { o.fault = fault }
}

// New checks that this kernel can run the nftables mode and returns a Backend for
// cfg.Family. It does not touch the kube-proxy table: the first Apply reads it (whoever
// wrote it, sluice or upstream kube-proxy) and converges it, without flushing. The other
// modes' leftovers are removed after the first successful sync.
func New(ctx context.Context, cfg dataplane.Config, opts ...Option) (*Backend, error) {
	o := options{limits: defaultBatchLimits, localAddrs: hostnet.InterfaceAddrs, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		return nil, fmt.Errorf("unknown IP family %v", cfg.Family)
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	kv, err := hostnet.RunningKernel()
	if err != nil {
		return nil, fmt.Errorf("check kernel version: %w", err)
	}
	if err := checkKernel(kv); err != nil {
		return nil, err
	}
	c, err := openConn()
	if err != nil {
		return nil, err
	}
	if err := checkNFTables(c); err != nil {
		_ = c.close() // the check's error is the one to report
		return nil, err
	}
	rc, err := openConn()
	if err != nil {
		_ = c.close() // opening the counters' socket failed: that is the error to report
		return nil, err
	}
	f := familyOf(cfg.Family)
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "ipFamily", cfg.Family.String())
	b := &Backend{
		cfg: cfg, f: f, c: c, rc: rc, logger: logger,
		app:             &applier{c: c, f: f, limits: o.limits},
		fault:           o.fault,
		deleteChainsNow: kv.AtLeast(6, 2),
		localAddrs:      o.localAddrs,
		now:             o.now,
		recordPlan:      o.recordPlan,
	}
	// The other modes' rules keep forwarding until this table carries the Services:
	// they are removed after the first successful sync, not here (no gap when a node
	// moves from iptables or ipvs mode to nftables).
	b.sync = fullsync.New(!o.skipLeftovers)
	logger.V(2).Info("Using nftables", "kernel", kv.String(), "mark", markString(b.mark()))
	return b, nil
}

// Close releases the netlink sockets. The table stays.
func (b *Backend) Close() error {
	err := b.c.close()
	if b.rc != nil {
		err = errors.Join(err, b.rc.close())
	}
	return err
}

// Mode implements dataplane.Backend.
func (b *Backend) Mode() dataplane.Mode { return dataplane.ModeNFTables }

// Family implements dataplane.Backend.
func (b *Backend) Family() model.IPFamily { return b.cfg.Family }

func (b *Backend) mark() uint32 { return 1 << uint(b.cfg.MasqueradeBit) }

// ApplyStats describes the last Apply, for tests, benchmarks and `sluice status`.
type ApplyStats struct {
	Full   bool
	Reason string // why the sync was full (fullsync.Reason*); "" for a partial one
	// Verified: a periodic full resync that found the ruleset generation unchanged
	// since the last full read, and so read nothing and planned only the changes.
	Verified   bool
	Replaced   bool
	Operations int // planned operations (an element counts as one)
	Groups     int
	Batches    int // transactions committed
	Messages   int // netlink messages sent in batches (retries included)
	Bytes      int // bytes sent in batches
	Dumps      int // dump requests (full resyncs only)
	Read       readStats
	PlanTime   time.Duration
	ApplyTime  time.Duration
	ReadTime   time.Duration
}

// LastStats returns the statistics of the last Apply.
func (b *Backend) LastStats() ApplyStats { return b.stats }

// Apply implements dataplane.Backend: it plans the changes from the model of the kernel
// to desired and sends them. A full Apply (asked for, first, after an unknown outcome, or
// when cfg.SyncPeriod passed since the last one) first reads the table back from the
// kernel, which repairs drift.
func (b *Backend) Apply(ctx context.Context, desired *model.NodeState, changes model.Changes) dataplane.Result {
	start := b.now()
	defer releaseBatchBuffers()
	reason := b.sync.ReasonWithModel(b.state != nil, changes.Full, start, b.cfg.SyncPeriod)
	cfg := b.layout(desired)
	if reason == "" && cfg.countPackets != b.countingPackets {
		// The packet counter maps and rules are part of the fixed table, which only a
		// full sync plans.
		reason = reasonPacketCounters
	}
	verified := reason == fullsync.ReasonPeriodic && b.unchangedSinceRead(cfg)
	if verified {
		// Nothing to repair, so nothing to read: the resync is the partial sync of what
		// changed, and counts as the periodic full one.
		reason = ""
	}
	full := reason != ""
	before := b.c.stats
	b.stats = ApplyStats{Full: full, Reason: reason, Verified: verified}

	if b.fault != nil {
		b.app.fault = func(name types.NamespacedName) faultKind { return b.fault(name, desired.PortsOf(name)) }
	}
	in := b.planInput(cfg, desired, changes, full, start)
	var readForeign uint64
	readMarked := false
	if full {
		readForeign, readMarked = b.c.readMark()
		if err := b.readForFull(in); err != nil {
			metrics.NFTablesSyncFailuresTotal.WithLabelValues(b.cfg.Family.String()).Inc()
			b.sync.Failed()
			return dataplane.Result{Err: err, Full: true}
		}
	}
	p, res := b.planAndSend(in, start)
	b.stats.Batches = res.batches
	b.stats.Messages = b.c.stats.Messages - before.Messages
	b.stats.Bytes = b.c.stats.BytesSent - before.BytesSent
	b.stats.Dumps = b.c.stats.Dumps - before.Dumps

	// The model is what the kernel now holds: the base, to which the batcher committed
	// every group the kernel took. The endpoint map elements a full read brought in are
	// dropped: between full resyncs the Services' records stand for them.
	b.state = p.base
	for name, s := range b.state.sets {
		if isEndpointMap(name) {
			s.elems, s.intervals = nil, intervalElems{}
		}
	}

	out := b.settle(p, res, full || verified, start)
	if full {
		b.countingPackets = cfg.countPackets
		b.readForeign, b.readMarked, b.readAddrs = readForeign, readMarked && out.Err == nil, in.localAddrs
	}
	out.Full = full || verified
	b.counters.Update(desired, changes, full, countedChains)
	if out.Err == nil && b.sync.LeftoversDue() {
		leftovers.RemoveOtherModes(ctx, b.logger, dataplane.ModeNFTables, b.cfg.Family, nil)
	}
	b.logger.V(2).Info("Synced nftables", "full", full, "reason", reason, "verifiedUnchanged", verified, "replaced", p.replace, "services", len(desired.Services),
		"operations", b.stats.Operations, "batches", b.stats.Batches, "messages", b.stats.Messages,
		"failed", len(out.Failed), "elapsed", b.now().Sub(start).Seconds())
	return out
}

// unchangedSinceRead reports whether a periodic resync can skip reading the table: the
// model is what the backend wrote, no one else has committed to nf_tables in this
// network namespace since the last full read (generation.go), and nothing a full sync
// alone plans has moved (the node's addresses behind @nodeport-ips; stale chains
// waiting for their delay on kernels before 6.2).
func (b *Backend) unchangedSinceRead(cfg *layoutConfig) bool {
	if b.state == nil || !b.trusted || !b.readMarked || !b.sync.Trusted() {
		return false
	}
	if !b.deleteChainsNow && len(b.state.staleChains) > 0 {
		return false
	}
	if !cfg.nodePortMatchAll {
		addrs, err := b.localAddrs()
		if err != nil || !slices.Equal(addrs, b.readAddrs) {
			return false
		}
	}
	return b.c.unchangedSince(b.readForeign)
}

// planInput gathers what the planner needs besides the kernel's state.
func (b *Backend) planInput(cfg *layoutConfig, desired *model.NodeState, changes model.Changes, full bool, start time.Time) *planInput {
	in := &planInput{
		cfg:             cfg,
		desired:         desired,
		full:            full,
		changed:         changes.Services,
		deleteChainsNow: b.deleteChainsNow,
		now:             start,
		state:           b.state,
	}
	if ips := desired.Node.IPsOf(b.cfg.Family); len(ips) > 0 {
		in.nodeIP = ips[0]
	}
	return in
}

// readForFull reads the table back (and the node's addresses) for a full sync: the plan's
// base becomes what the kernel holds, and the previous records what the backend wrote.
func (b *Backend) readForFull(in *planInput) error {
	if !in.cfg.nodePortMatchAll {
		addrs, err := b.localAddrs()
		if err != nil {
			b.logger.Error(err, "Failed to list node addresses, NodePorts may not work on all of them")
		}
		in.localAddrs = addrs
	}
	readStart := b.now()
	st, rs, err := readState(b.c, b.f, b.state)
	b.stats.Read, b.stats.ReadTime = rs, b.now().Sub(readStart)
	if err != nil {
		return fmt.Errorf("read the %s table: %w", b.f.name, err)
	}
	// The read happens before anything of this sync is written: it sees only the
	// previous syncs' work, and whatever else changed the table since.
	if b.state != nil && b.trusted {
		driftOf(b.state, st).Report(b.logger, dataplane.ModeNFTables, b.cfg.Family)
	}
	in.prevRecords = map[types.NamespacedName]*serviceRecord{}
	if b.state != nil {
		in.prevRecords = b.state.services
	}
	in.state = st
	// From here the plan needs only the old records: the rest of the old model (its
	// chains, sets, elements and claims) goes now rather than after the plan, which
	// builds a new one beside the read (Apply sets b.state again whatever happens).
	b.state = nil
	return nil
}

// planAndSend plans and applies together: each group goes to the batcher as soon as it is
// planned, and a batch is sent as soon as it fills, so that the whole plan of a large
// table never sits in memory. Planning time is what is left of the total once the time
// spent sending is taken out.
func (b *Backend) planAndSend(in *planInput, start time.Time) (*Plan, *applyResult) {
	bt := newBatcher(b.app, b.recordPlan)
	bt.state, bt.now = in.state, start
	var recorded []*group
	var sendTime time.Duration
	ops := 0
	planStart := b.now()
	p := streamPlan(in, bt.begin, func(g *group) {
		ops += g.len()
		b.stats.Groups++
		if b.recordPlan {
			recorded = append(recorded, g)
		}
		sendStart := b.now()
		bt.add(g)
		sendTime += b.now().Sub(sendStart)
	})
	sendStart := b.now()
	res := bt.finish()
	sendTime += b.now().Sub(sendStart)
	b.stats.PlanTime = b.now().Sub(planStart) - sendTime
	b.stats.ApplyTime = sendTime
	b.stats.Replaced = p.replace
	b.stats.Operations = ops
	if b.recordPlan {
		p.groups = recorded
		b.lastPlan = p
	}
	if klogV := b.logger.V(9); klogV.Enabled() && b.recordPlan {
		klogV.Info("Planned nftables changes", "plan", p.String())
	}
	return p, res
}

// settle turns the batcher's outcome into the sync's result and the state for the next:
// whether it must be full, whether the model is trusted, the failure metrics.
func (b *Backend) settle(p *Plan, res *applyResult, full bool, start time.Time) dataplane.Result {
	family := b.cfg.Family.String()
	out := dataplane.Result{Full: full}
	if len(p.invalid)+len(res.failed) > 0 {
		out.Failed = map[types.NamespacedName]error{}
		for svc, err := range p.invalid {
			out.Failed[svc] = err
		}
		for svc, err := range res.failed {
			out.Failed[svc] = err
		}
	}
	if res.err != nil {
		out.Err = res.err
		b.sync.Failed()
		metrics.NFTablesSyncFailuresTotal.WithLabelValues(family).Inc()
		if res.cleanupFailed {
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(family).Inc()
		}
		if errors.Is(res.err, errBatchLost) {
			b.state = nil
		}
		b.trusted = false
		return out
	}
	if full {
		b.sync.FullSynced(start)
	}
	if len(res.failed) > 0 {
		metrics.NFTablesSyncFailuresTotal.WithLabelValues(family).Inc()
		// A missing object (someone deleted our table or a chain) is drift: the model is
		// wrong, and only a full read puts it right. Other rejections are the Service's
		// own; the sync loop retries it.
		for _, err := range res.failed {
			var be batchError
			if errors.As(err, &be) && be.errno == unix.ENOENT {
				b.sync.Failed()
			}
		}
	}
	b.trusted = true
	return out
}

// layout returns the fixed part's inputs for this sync.
func (b *Backend) layout(desired *model.NodeState) *layoutConfig {
	return &layoutConfig{
		f:                b.f,
		mark:             b.mark(),
		masqueradeAll:    b.cfg.MasqueradeAll,
		localDetector:    b.cfg.LocalDetector,
		nodePortMatchAll: b.cfg.NodePortAddresses.MatchAll,
		nodePortCIDRs:    b.cfg.NodePortAddresses.CIDRs,
		serviceCIDRs:     desired.ServiceCIDRs,
		countPackets:     anyCounted(desired),
	}
}

// reasonPacketCounters is the full sync that adds or removes the packet counters' fixed
// part, when the first Service port becomes Counted or the last one stops being so.
const reasonPacketCounters = "packet counters switched"

// anyCounted reports whether some Service port of desired is Counted.
func anyCounted(desired *model.NodeState) bool {
	for _, sp := range desired.Services {
		if sp.Counted {
			return true
		}
	}
	return false
}
