package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
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
	sysctl hostnet.Sysctls

	tcpLiberal bool
	nfacct     bool
	maxChains  int

	// applied mirrors, per Service, what the kernel holds; valid only while known.
	applied map[types.NamespacedName]*appliedService
	// appliedNAT and appliedFilter total the rules of applied (see setApplied).
	appliedNAT, appliedFilter int
	known                     bool
	// static is the fingerprint of the static rules in the kernel.
	static   string
	lastFull time.Time
	// synced is set after the first successful full sync (read by Monitor).
	synced atomic.Bool
	// leftoversPending is set until the first successful full sync has removed the other
	// modes' leftovers.
	leftoversPending bool
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
		leftoversPending: !o.skipLeftovers}

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
		logger.V(2).Info("nfacct is not available, its metrics are not exported", "err", nfacctErr)
	}

	return b, nil
}

var nfacctRegistered atomic.Bool

// registerNFAcct registers the collector once per process (both families share the
// counters, as upstream's do).
func registerNFAcct(c *nfacctCollector, logger klog.Logger) {
	if !nfacctRegistered.CompareAndSwap(false, true) {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			logger.Error(fmt.Errorf("%v", r), "Could not register the nfacct metrics")
		}
	}()
	metrics.MustRegisterCollector(c)
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
	rc := newRenderConfig(b.cfg, desired.Node, localAddrs, b.tcpLiberal, b.nfacct, endpoints)
	rc.faulty = b.opts.faulty
	b.rc = rc
	static := renderStatic(rc)

	reason := b.fullReason(changes, static, endpoints)
	// What a full sync finds different from what the backend wrote is drift, when it
	// knows what it wrote (not before its first sync, not after one failed as a whole).
	var drift *dataplane.Drift
	if b.known && !b.lastFull.IsZero() {
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
			b.known = false
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
		b.known = false
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
	if res.Err == nil && res.Full && b.leftoversPending {
		b.leftoversPending = false
		leftovers.RemoveOtherModes(ctx, b.logger, dataplane.ModeIPTables, b.cfg.Family, b.tools)
	}

	b.stats.Full, b.stats.Reason, b.stats.Failed = res.Full, reason, len(res.Failed)
	b.stats.Duration = b.opts.now().Sub(start)
	b.recordRuleMetrics(static)
	return res
}

// fullReason returns why this sync must be full, or "".
func (b *Backend) fullReason(changes model.Changes, static *staticRules, endpoints int) string {
	switch {
	case !b.known && b.lastFull.IsZero():
		return "first sync"
	case !b.known:
		return "previous sync failed"
	case changes.Full:
		return "requested"
	case static.fingerprint() != b.static:
		return "node-wide rules changed"
	}
	period := b.opts.fullSyncPeriod
	if endpoints > largeClusterEndpoints {
		period = b.opts.largeFullSyncPeriod
	}
	if period > 0 && b.opts.now().Sub(b.lastFull) >= period {
		return "periodic"
	}
	if ok, err := b.canaryPresent(); err != nil {
		b.logger.Error(err, "Could not check the iptables canary")
	} else if !ok {
		b.logger.Info("iptables canary chain is gone: tables were flushed", "chain", chainCanary)
		return "canary chain missing"
	}
	return ""
}

// restore runs one restore and accounts for it.
func (b *Backend) restore(ctx context.Context, in *restoreInput, full bool) error {
	b.stats.Restores++
	b.stats.Lines += in.lines
	if v := b.logger.V(9); v.Enabled() {
		v.Info("Running iptables-restore", "input", in.String())
	}
	start := time.Now()
	err := b.tools.Restore(ctx, in.buf.Bytes())
	b.logger.V(4).Info("Ran iptables-restore", "lines", in.lines, "elapsed", time.Since(start), "ok", err == nil)
	if err == nil {
		for t, n := range in.rules {
			b.stats.Rules[t] += n
		}
		return nil
	}
	fam := b.cfg.Family.String()
	metrics.IPTablesRestoreFailuresTotal.WithLabelValues(fam).Inc()
	if !full {
		metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(fam).Inc()
	}
	var re *xtables.RestoreError
	if errors.As(err, &re) && len(re.Lines) > 0 {
		b.logger.V(2).Info("iptables-restore rejected its input", "line", re.Lines[0], "text", inputLine(in, re.Lines[0]), "output", re.Output)
	}
	return err
}

// inputLine returns line n of in, for logs.
func inputLine(in *restoreInput, n int) string {
	lines := strings.SplitN(in.buf.String(), "\n", n+1)
	if n < 1 || n > len(lines) {
		return ""
	}
	return lines[n-1]
}

// blame returns the owner of the first line a restore error points at, and the table
// whose section it is in ("" when the error names no line).
func blame(in *restoreInput, err error) (lineOwner, string, bool) {
	var re *xtables.RestoreError
	if !errors.As(err, &re) || len(re.Lines) == 0 {
		return lineOwner{}, "", false
	}
	return in.ownerOf(re.Lines[0]), in.tableOf(re.Lines[0]), true
}

// isolation bounds the failed restores one sync accepts while finding the Services to
// blame (restores that succeed are progress and cost nothing): a few
// bisection rounds, plus a few more for each Service found guilty (each culprit needs its
// own restores to be found). Every step makes progress, so this only guards against
// spending minutes of a legacy lock on a failure that is not the Services' fault.
type isolation struct{ left, perCulprit int }

func newIsolation(n int) *isolation {
	log := 0
	for ; n > 0; n >>= 1 {
		log++
	}
	return &isolation{left: 12 + 2*log, perCulprit: log + 2}
}

var errIsolationExhausted = errors.New("giving up isolating failing Services after too many iptables-restore runs")

func (i *isolation) spend() error {
	if i.left <= 0 {
		return errIsolationExhausted
	}
	i.left--
	return nil
}

func (i *isolation) blamed() { i.left += i.perCulprit }

// An error that names no line (the xtables lock held too long, a program missing) is not
// about the input, and never starts a search for a Service to blame.
//
// structural reports whether iptables-restore complained about one of sluice's shared
// chains: then the shared state is wrong (a chain missing, someone else's change), not a
// Service, and blaming Services one by one would only take them all down.
func structural(err error) bool {
	var re *xtables.RestoreError
	if !errors.As(err, &re) {
		return false
	}
	for _, c := range append(append([]string{chainMarkMasq, chainCanary, chainKubeletFirewall}, natTopChains...), filterTopChains...) {
		if strings.Contains(re.Output, "`"+c+"'") || strings.Contains(re.Output, "'"+c+"'") {
			return true
		}
	}
	return false
}

// ---- partial sync ----

// syncPartial applies the changed Services as independent units. drift reports that the
// kernel does not hold what sluice believes, which needs a full sync.
func (b *Backend) syncPartial(ctx context.Context, desired *model.NodeState, changes model.Changes, rc *renderConfig, failed map[types.NamespacedName]error) (drift bool, err error) {
	names := changes.Services.UnsortedList()
	slices.SortFunc(names, compareNames)
	var units []unit
	for _, name := range names {
		u := unit{name: name, old: b.applied[name]}
		if ports := desired.PortsOf(name); len(ports) > 0 {
			u.new = renderService(rc, name, ports)
		}
		if u.old == nil && u.new == nil {
			continue
		}
		units = append(units, u)
	}
	return b.applyUnits(ctx, units, failed)
}

func compareNames(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// applyUnits commits units in batches (the nft flavour bounds the chains per restore),
// isolating the Services whose rules are rejected.
func (b *Backend) applyUnits(ctx context.Context, units []unit, failed map[types.NamespacedName]error) (drift bool, err error) {
	iso := newIsolation(len(units))
	for _, batch := range b.batchUnits(units) {
		drift, err = b.isolateUnits(ctx, batch, failed, iso)
		if drift || err != nil {
			return drift, err
		}
	}
	return false, nil
}

func (b *Backend) batchUnits(units []unit) [][]unit {
	if b.maxChains <= 0 {
		return [][]unit{units}
	}
	var out [][]unit
	var cur []unit
	chains := 0
	for _, u := range units {
		n := 0
		if u.new != nil {
			n += len(u.new.natChains)
		}
		if u.old != nil {
			n += len(u.old.natChains)
		}
		if len(cur) > 0 && chains+n > b.maxChains {
			out = append(out, cur)
			cur, chains = nil, 0
		}
		cur = append(cur, u)
		chains += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// isolateUnits commits units; when iptables-restore rejects them it finds the Service to
// blame, from the line it names or, when it names none (a legacy table refused at COMMIT),
// by committing halves. Every restore that succeeds is kept: units are independent, so
// nothing committed ever waits for the failing Service.
func (b *Backend) isolateUnits(ctx context.Context, units []unit, failed map[types.NamespacedName]error, iso *isolation) (drift bool, err error) {
	queue := [][]unit{units}
	for len(queue) > 0 {
		us := queue[0]
		queue = queue[1:]
		if len(us) == 0 {
			continue
		}
		in := renderUnits(us)
		if in.empty() {
			b.commitUnits(us, true, true)
			continue
		}
		rerr := b.restore(ctx, in, false)
		if rerr == nil {
			b.commitUnits(us, true, true)
			continue
		}
		var re *xtables.RestoreError
		if !errors.As(rerr, &re) || len(re.Lines) == 0 {
			// Not about the input (the xtables lock, a missing program): nobody's fault.
			return false, rerr
		}
		if err := iso.spend(); err != nil {
			return false, err
		}
		if structural(rerr) {
			return true, nil
		}
		owner, table, named := blame(in, rerr)
		// What the kernel held before this restore, for the Services it concerned.
		before := make(map[types.NamespacedName]*appliedService, len(us))
		for _, u := range us {
			before[u.name] = u.old
		}
		natCommitted := table == tableFilter
		if natCommitted {
			// nat was committed before filter failed.
			b.commitUnits(us, true, false)
			for i := range us {
				us[i].old = b.applied[us[i].name]
			}
		}
		var blamed *unit
		switch {
		case named && (owner.kind == lineDelete || owner.kind == lineStale):
			return true, nil
		case named && owner.kind == lineService:
			rest := make([]unit, 0, len(us))
			for i := range us {
				if us[i].name == owner.service {
					blamed = &us[i]
					continue
				}
				rest = append(rest, us[i])
			}
			queue = append([][]unit{rest}, queue...)
		case len(us) == 1:
			blamed = &us[0]
		default:
			// A global line or no line at all: split.
			half := len(us) / 2
			queue = append([][]unit{us[:half], us[half:]}, queue...)
		}
		if blamed == nil {
			continue
		}
		if !blamed.restoring {
			failed[blamed.name] = rerr
			iso.blamed()
		}
		next, ok := b.lastGoodUnit(*blamed, before[blamed.name], natCommitted)
		if !ok {
			// Not even its removal was taken: only a full sync can tell what the kernel holds.
			return true, nil
		}
		if next != nil {
			queue = append(queue, []unit{*next})
		}
	}
	return false, nil
}

// lastGoodUnit decides what follows the kernel's refusal of u, a Service's change from
// prev: the Service must keep its last good version (dataplane.Backend's failure rule).
// Nothing follows when nothing of u was committed: the kernel still holds prev. When nat
// was committed and filter refused, the unit returned writes prev's version back (or
// removes the Service if it is new). When that is refused too, the unit returned removes
// the Service, so that no half of two versions stays; ok is false when even that was
// refused.
func (b *Backend) lastGoodUnit(u unit, prev *appliedService, natCommitted bool) (next *unit, ok bool) {
	switch {
	case !u.restoring && !natCommitted:
		return nil, true
	case !u.restoring:
		back := &unit{name: u.name, old: b.applied[u.name], restoring: true}
		if prev != nil && len(prev.ports) > 0 {
			back.new = renderService(b.rc, u.name, prev.ports)
		}
		b.logger.Info("Writing back the last good rules of a Service whose update was half taken", "service", klog.KRef(u.name.Namespace, u.name.Name))
		return back, true
	case u.new != nil:
		b.logger.Info("Its last good rules were refused too; removing the Service's rules", "service", klog.KRef(u.name.Namespace, u.name.Name))
		return &unit{name: u.name, old: b.applied[u.name], restoring: true}, true
	}
	return nil, false
}

// commitUnits records that the kernel now holds the units' new state, for the tables that
// were committed.
func (b *Backend) commitUnits(us []unit, nat, filter bool) {
	for _, u := range us {
		if u.new == nil {
			if nat && filter {
				b.setApplied(u.name, nil)
				continue
			}
			a := &appliedService{}
			if old := b.applied[u.name]; old != nil && !filter {
				a.filterTop = old.filterTop
			}
			b.setApplied(u.name, a)
			continue
		}
		a := appliedFrom(u.new)
		if !filter {
			// nat holds the new version, filter the old one: the last good version is
			// still the old one.
			a.ports = nil
			if old := b.applied[u.name]; old != nil {
				a.filterTop, a.ports = old.filterTop, old.ports
			}
		}
		b.setApplied(u.name, a)
	}
}

// setApplied records what the kernel now holds for one Service (nil: nothing), keeping
// the rule totals up to date: a partial sync must cost what its Services cost, not a
// walk over every Service.
func (b *Backend) setApplied(name types.NamespacedName, a *appliedService) {
	if old := b.applied[name]; old != nil {
		b.appliedNAT -= old.natRules
		b.appliedFilter -= len(old.filterTop)
	}
	if a == nil {
		delete(b.applied, name)
		return
	}
	b.applied[name] = a
	b.appliedNAT += a.natRules
	b.appliedFilter += len(a.filterTop)
}

// ---- full sync ----

// syncFull rewrites everything: jumps from built-in chains are checked, every chain is
// flushed and refilled, and chains nobody uses are deleted.
func (b *Backend) syncFull(ctx context.Context, desired *model.NodeState, rc *renderConfig, static *staticRules, failed map[types.NamespacedName]error, drift *dataplane.Drift) error {
	kv, err := b.readKernel(ctx)
	if err != nil {
		return err
	}
	if drift != nil {
		b.driftOf(kv, static, drift)
	}
	inserted, err := b.ensureJumps(kv)
	if drift != nil {
		for _, j := range inserted {
			drift.Add("rule", "jump "+j+" missing")
		}
	}
	if err != nil {
		return err
	}

	names := desired.ServiceNames().UnsortedList()
	slices.SortFunc(names, compareNames)
	rendered := make(map[types.NamespacedName]*serviceRules, len(names))
	chains := 0
	for _, name := range names {
		s := renderService(rc, name, desired.PortsOf(name))
		rendered[name] = s
		chains += len(s.natChains)
	}
	iso := newIsolation(len(names))

	// A large sync in the nft flavour first writes the Services' chains in batches; the
	// final restore then only rewrites the shared chains to point at them.
	split := b.maxChains > 0 && chains > b.maxChains
	if split && !b.splitLogged {
		b.splitLogged = true
		b.logger.Info("Writing the ruleset in several iptables-nft restores: one restore would take minutes, as its cost grows with the square of the chains it creates (upstream kube-proxy never finishes such a ruleset); sluice's nftables mode avoids iptables-nft altogether",
			"chains", chains, "chainsPerRestore", b.maxChains)
	}
	prestaged := map[types.NamespacedName]bool{}
	extraChains := map[string]bool{}
	if split {
		// The Services' chains jump to KUBE-MARK-MASQ before the final restore fills it;
		// create it empty if it does not exist (never flush it: it may be in use).
		if !kv.chains[tableNAT][chainMarkMasq] {
			if err := b.editor.NewChain(tableNAT, chainMarkMasq); err != nil && !isExistsError(err) {
				return fmt.Errorf("creating chain %s: %w", chainMarkMasq, err)
			}
		}
		var list []*serviceRules
		for _, name := range names {
			list = append(list, rendered[name])
		}
		if err := b.prestage(ctx, list, failed, prestaged, iso); err != nil {
			return err
		}
		for name := range prestaged {
			for _, c := range rendered[name].natChains {
				extraChains[c.name] = true
			}
		}
	}

	existing := map[string]bool{}
	for c := range kv.chains[tableNAT] {
		if xtables.IsServiceChain(c) {
			existing[c] = true
		}
	}
	for c := range extraChains {
		existing[c] = true
	}

	cands := make([]types.NamespacedName, 0, len(names))
	for _, name := range names {
		if failed[name] == nil {
			cands = append(cands, name)
		}
	}
	var held []types.NamespacedName
	undeletable := map[string]bool{}
	// kept are the held Services and those the kernel refused: left as the kernel has
	// them (their last good version), when that is known. A refused Service whose chains
	// a first restore already rewrote (prestaged) cannot be kept as it was: it is removed.
	kept := func() []types.NamespacedName {
		if !b.known {
			return nil
		}
		out := slices.Clone(held)
		for name := range failed {
			if b.applied[name] != nil && !prestaged[name] && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
		return out
	}
	for {
		p := &fullPlan{static: static, prestaged: prestaged, undeletable: undeletable, canary: true}
		active := map[string]bool{}
		for _, name := range cands {
			s := rendered[name]
			p.write = append(p.write, s)
			for _, c := range s.natChains {
				active[c.name] = true
			}
		}
		keep := kept()
		slices.SortFunc(keep, compareNames)
		for _, name := range keep {
			if a := b.applied[name]; a != nil {
				p.keep = append(p.keep, a)
				for _, c := range a.chainNames() {
					active[c] = true
				}
			}
		}
		for c := range existing {
			if !active[c] {
				p.stale = append(p.stale, c)
			}
		}
		slices.Sort(p.stale)
		staleLater := split && len(p.stale) > 0
		var stale []string
		if staleLater {
			stale, p.stale = p.stale, nil
		}
		in := renderFull(p)
		rerr := b.restore(ctx, in, true)
		if rerr == nil {
			applied := map[types.NamespacedName]*appliedService{}
			for _, s := range p.write {
				applied[s.name] = appliedFrom(s)
			}
			for _, name := range keep {
				if a := b.applied[name]; a != nil {
					applied[name] = a
				}
			}
			b.applied, b.known, b.static, b.lastFull = applied, true, static.fingerprint(), b.opts.now()
			b.appliedNAT, b.appliedFilter = 0, 0
			for _, a := range applied {
				b.appliedNAT += a.natRules
				b.appliedFilter += len(a.filterTop)
			}
			if staleLater {
				if err := b.deleteStale(ctx, stale, undeletable); err != nil {
					return err
				}
			}
			break
		}
		var re *xtables.RestoreError
		if !errors.As(rerr, &re) || len(re.Lines) == 0 || structural(rerr) {
			return rerr
		}
		if err := iso.spend(); err != nil {
			return err
		}
		owner, _, named := blame(in, rerr)
		switch {
		case named && owner.kind == lineStale:
			if undeletable[owner.chain] {
				return rerr
			}
			b.logger.Info("Could not delete an unused chain, keeping it empty", "chain", owner.chain, "err", rerr)
			undeletable[owner.chain] = true
		case named && owner.kind == lineService:
			failed[owner.service] = rerr
			iso.blamed()
			cands = slices.DeleteFunc(cands, func(n types.NamespacedName) bool { return n == owner.service })
		case len(cands) == 1:
			failed[cands[0]] = rerr
			iso.blamed()
			cands = nil
		case len(cands) == 0:
			return rerr
		default:
			// Nothing to blame: hold half the Services back (as the kernel has them,
			// when that is known) and try again with the rest.
			half := len(cands) / 2
			held = append(append([]types.NamespacedName(nil), cands[half:]...), held...)
			cands = cands[:half]
		}
	}
	if len(held) == 0 {
		return nil
	}
	// The Services held back go in now, one partial sync on top of the committed state.
	var units []unit
	for _, name := range held {
		units = append(units, unit{name: name, old: b.applied[name], new: rendered[name]})
	}
	changedBehind, err := b.applyUnits(ctx, units, failed)
	if changedBehind {
		return fmt.Errorf("iptables rules changed during a full sync")
	}
	return err
}

// prestage writes Services' chains in batches of at most maxChains chains.
func (b *Backend) prestage(ctx context.Context, list []*serviceRules, failed map[types.NamespacedName]error, done map[types.NamespacedName]bool, iso *isolation) error {
	var batches [][]*serviceRules
	var cur []*serviceRules
	n := 0
	for _, s := range list {
		if len(cur) > 0 && n+len(s.natChains) > b.maxChains {
			batches = append(batches, cur)
			cur, n = nil, 0
		}
		cur = append(cur, s)
		n += len(s.natChains)
	}
	if len(cur) > 0 {
		batches = append(batches, cur)
	}
	for len(batches) > 0 {
		batch := batches[0]
		batches = batches[1:]
		if len(batch) == 0 {
			continue
		}
		in := renderChainsOnly(batch)
		rerr := b.restore(ctx, in, true)
		if rerr == nil {
			for _, s := range batch {
				done[s.name] = true
			}
			continue
		}
		var re *xtables.RestoreError
		if !errors.As(rerr, &re) || len(re.Lines) == 0 || structural(rerr) {
			return rerr
		}
		if err := iso.spend(); err != nil {
			return err
		}
		owner, _, named := blame(in, rerr)
		switch {
		case named && owner.kind == lineService:
			failed[owner.service] = rerr
			iso.blamed()
			batches = append([][]*serviceRules{slices.DeleteFunc(batch, func(s *serviceRules) bool { return s.name == owner.service })}, batches...)
		case len(batch) == 1:
			failed[batch[0].name] = rerr
			iso.blamed()
		default:
			half := len(batch) / 2
			batches = append([][]*serviceRules{batch[:half], batch[half:]}, batches...)
		}
	}
	return nil
}

// deleteStale flushes, then deletes, unused chains in bounded batches.
func (b *Backend) deleteStale(ctx context.Context, stale []string, undeletable map[string]bool) error {
	for _, batch := range chunkStrings(stale, b.maxChains) {
		if err := b.restore(ctx, renderStaleFlush(batch), true); err != nil {
			return fmt.Errorf("flushing unused chains: %w", err)
		}
	}
	var todo []string
	for _, c := range stale {
		if !undeletable[c] {
			todo = append(todo, c)
		}
	}
	for _, batch := range chunkStrings(todo, b.maxChains) {
		for len(batch) > 0 {
			in := renderStaleDelete(batch)
			rerr := b.restore(ctx, in, true)
			if rerr == nil {
				break
			}
			owner, _, named := blame(in, rerr)
			if !named || owner.kind != lineStale {
				return fmt.Errorf("deleting unused chains: %w", rerr)
			}
			b.logger.Info("Could not delete an unused chain, keeping it empty", "chain", owner.chain, "err", rerr)
			batch = slices.DeleteFunc(batch, func(c string) bool { return c == owner.chain })
		}
	}
	return nil
}

func chunkStrings(s []string, n int) [][]string {
	if n <= 0 || len(s) <= n {
		if len(s) == 0 {
			return nil
		}
		return [][]string{s}
	}
	var out [][]string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// recordRuleMetrics sets the rule-count gauges from what the kernel holds.
func (b *Backend) recordRuleMetrics(static *staticRules) {
	fam := b.cfg.Family.String()
	for _, table := range []string{tableFilter, tableNAT} {
		metrics.IPTablesRulesLastSync.WithLabelValues(table, fam).Set(float64(b.stats.Rules[table]))
	}
	if !b.known {
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
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// select picks at random when the tick and the cancellation are both ready: a
		// cancelled Monitor must not check (and ask for a resync) once more.
		if ctx.Err() != nil {
			return
		}
		if !b.synced.Load() {
			continue
		}
		ok, err := b.canaryPresent()
		if err != nil {
			b.logger.V(2).Info("Could not check the iptables canary", "err", err)
			continue
		}
		if !ok {
			b.logger.Info("iptables canary chain is gone, asking for a full sync", "chain", chainCanary)
			resync()
		}
	}
}
