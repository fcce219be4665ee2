package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	goiptables "github.com/coreos/go-iptables/iptables"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/dataplane"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/isolate"
	"github.com/sluiceproxy/sluice/pkg/dataplane/internal/xtables"
	"github.com/sluiceproxy/sluice/pkg/metrics"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// ruleEditor is the small imperative part: chains and single rules in built-in chains,
// which iptables-restore cannot add conditionally. *goiptables.IPTables implements it.
type ruleEditor interface {
	ChainExists(table, chain string) (bool, error)
	NewChain(table, chain string) error
	Exists(table, chain string, rulespec ...string) (bool, error)
	Insert(table, chain string, pos int, rulespec ...string) error
	List(table, chain string) ([]string, error)
}

// newGoIPTables returns go-iptables bound to the flavour's iptables program.
func newGoIPTables(t *xtables.Tools) (ruleEditor, error) {
	proto := goiptables.ProtocolIPv4
	if t.Family == model.IPv6 {
		proto = goiptables.ProtocolIPv6
	}
	ipt, err := goiptables.New(goiptables.IPFamily(proto), goiptables.Path(t.IPTables), goiptables.Timeout(t.WaitSeconds))
	if err != nil {
		return nil, fmt.Errorf("go-iptables for %s: %w", t.IPTables, err)
	}
	return ipt, nil
}

// saveForm returns a jump rule as iptables-save prints it, to find it in a listing without
// running `iptables -C` for each (on a large legacy table each run copies the whole table).
func (j jumpRule) saveForm() string {
	parts := []string{"-A", j.from}
	for _, a := range j.spec() {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// ensureJumps creates the chains jump rules point at and inserts missing jump rules at the
// top of their built-in chains, as upstream does on every full sync. A rule present
// anywhere in the chain is left where it is.
func (b *Backend) ensureJumps(kv *kernelView) (inserted []string, err error) {
	var errs []error
	for _, j := range append(append([]jumpRule(nil), jumpRules...), kubeletJumpRules...) {
		if !kv.chains[j.table][j.to] {
			if err := b.editor.NewChain(j.table, j.to); err != nil && !isExistsError(err) {
				errs = append(errs, fmt.Errorf("creating chain %s in %s: %w", j.to, j.table, err))
				continue
			}
			if kv.chains[j.table] == nil {
				kv.chains[j.table] = map[string]bool{}
			}
			kv.chains[j.table][j.to] = true
		}
		found := false
		want := j.saveForm()
		for _, r := range kv.builtin[j.table] {
			if r == want {
				found = true
				break
			}
		}
		if !found {
			// The listing may print the rule differently; ask iptables before adding a
			// duplicate.
			ok, err := b.editor.Exists(j.table, j.from, j.spec()...)
			if err != nil {
				errs = append(errs, fmt.Errorf("checking jump %s -> %s in %s: %w", j.from, j.to, j.table, err))
				continue
			}
			found = ok
		}
		if found {
			continue
		}
		if err := b.editor.Insert(j.table, j.from, 1, j.spec()...); err != nil {
			errs = append(errs, fmt.Errorf("inserting jump %s -> %s in %s: %w", j.from, j.to, j.table, err))
			continue
		}
		b.logger.V(2).Info("Inserted jump rule", "table", j.table, "chain", j.from, "target", j.to)
		inserted = append(inserted, j.table+" "+j.from+" -> "+j.to)
	}
	return inserted, errors.Join(errs...)
}

// isExistsError reports whether an iptables error says the chain already exists.
func isExistsError(err error) bool {
	var e *goiptables.Error
	if errors.As(err, &e) && e.ExitStatus() == 1 {
		return true
	}
	return strings.Contains(err.Error(), "already exists") || strings.Contains(err.Error(), "File exists")
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
	b.logger.V(4).Info("Ran iptables-restore", "lines", in.lines, "elapsed", time.Since(start).Seconds(), "ok", err == nil)
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

// newIsolation bounds the failed restores one sync accepts while finding the Services to
// blame among n (isolate.Budget): it guards against spending minutes of a legacy lock on a
// failure that is not the Services' fault.
func newIsolation(n int) *isolate.Budget { return isolate.NewBudget(n) }

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
	return batchByChains(units, b.maxChains, func(u unit) int {
		n := 0
		if u.new != nil {
			n += len(u.new.natChains) + len(u.new.mangleChains)
		}
		if u.old != nil {
			n += len(u.old.natChains) + len(u.old.mangleChains)
		}
		return n
	})
}

// batchByChains splits items, in order, into batches that touch at most limit chains each
// (one batch when limit is 0 or less, none when there are no items); an item of more than
// limit chains is a batch of its own.
func batchByChains[T any](items []T, limit int, chains func(T) int) [][]T {
	if len(items) == 0 {
		return nil
	}
	if limit <= 0 {
		return [][]T{items}
	}
	var out [][]T
	var cur []T
	n := 0
	for _, it := range items {
		c := chains(it)
		if len(cur) > 0 && n+c > limit {
			out = append(out, cur)
			cur, n = nil, 0
		}
		cur = append(cur, it)
		n += c
	}
	return append(out, cur)
}

// isolateUnits commits units; when iptables-restore rejects them it finds the Service to
// blame (isolate.Search), from the line it names or, when it names none (a legacy table
// refused at COMMIT), by committing halves. Every restore that succeeds is kept: units are
// independent, so nothing committed ever waits for the failing Service. drift is true when
// a refusal shows that only a full sync can tell what the kernel holds.
func (b *Backend) isolateUnits(ctx context.Context, units []unit, failed map[types.NamespacedName]error, iso *isolate.Budget) (drift bool, err error) {
	// Of the last restore refused: what the kernel held before it, for the Services it
	// concerned, and whether its nat table was committed before filter failed.
	var before map[types.NamespacedName]*appliedService
	var natCommitted bool
	search := isolate.Search[unit]{
		Try: func(us []unit) isolate.Outcome {
			in := renderUnits(us)
			if in.empty() {
				b.commitUnits(us, true, true)
				return isolate.Taken
			}
			rerr := b.restore(ctx, in, false)
			if rerr == nil {
				b.commitUnits(us, true, true)
				return isolate.Taken
			}
			var re *xtables.RestoreError
			if !errors.As(rerr, &re) || len(re.Lines) == 0 {
				// Not about the input (the xtables lock, a missing program): nobody's fault.
				return isolate.Outcome{Err: rerr, Stop: true}
			}
			if structural(rerr) {
				return isolate.Outcome{Err: errNeedFull, Stop: true}
			}
			owner, table, named := blame(in, rerr)
			before = make(map[types.NamespacedName]*appliedService, len(us))
			for _, u := range us {
				before[u.name] = u.old
			}
			natCommitted = table == tableFilter
			if natCommitted {
				b.commitUnits(us, true, false)
				for i := range us {
					us[i].old = b.applied[us[i].name]
				}
			}
			out := isolate.Outcome{Err: rerr}
			switch {
			case named && (owner.kind == lineDelete || owner.kind == lineStale):
				return isolate.Outcome{Err: errNeedFull, Stop: true}
			case named && owner.kind == lineService:
				for i := range us {
					if us[i].name == owner.service {
						out.Blamed = map[int]error{i: rerr}
					}
				}
			}
			// A global line or no line at all: the search splits the batch.
			return out
		},
		Blame: func(u unit, rerr error) ([]unit, error) {
			if !u.restoring {
				failed[u.name] = rerr
			}
			next, ok := b.lastGoodUnit(u, before[u.name], natCommitted)
			switch {
			case !ok:
				// Not even its removal was taken.
				return nil, errNeedFull
			case next != nil:
				return []unit{*next}, nil
			}
			return nil, nil
		},
		Budget: iso,
	}
	err = search.Run([][]unit{units})
	if errors.Is(err, errNeedFull) {
		return true, nil
	}
	return false, err
}

// errNeedFull ends isolateUnits' search when only a full sync can tell what the kernel
// holds: iptables-restore refused a shared chain's line, a deletion or a stale chain's,
// or even the removal of a Service's rules.
var errNeedFull = errors.New("only a full sync can tell what the kernel holds")

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

// syncFull rewrites everything: jumps from built-in chains are checked, every chain is
// flushed and refilled, and chains nobody uses are deleted. Its phases: read the kernel
// and repair the jumps; render every Service; in the nft flavour, write large rulesets'
// Service chains ahead in batches; restore the whole ruleset, leaving out the Services
// the kernel refuses; then add the Services held back while finding them.
func (b *Backend) syncFull(ctx context.Context, desired *model.NodeState, rc *renderConfig, static *staticRules, failed map[types.NamespacedName]error, drift *dataplane.Drift) error {
	kv, err := b.readAndRepairJumps(ctx, static, drift)
	if err != nil {
		return err
	}
	fs := b.renderFullSync(desired, rc, static, failed)
	// The new-connection counter chains the kernel holds are kept, counts and all.
	if fs.intact, err = b.intactCounterChains(kv); err != nil {
		return err
	}
	if b.packetsWanted || b.packetsWritten || !b.sync.Trusted() {
		// What mangle holds of the packet counters: kept, completed or removed.
		if fs.mangle, err = b.readMangle(ctx); err != nil {
			return err
		}
	}
	if fs.split {
		if err := b.prestageServices(ctx, kv, fs); err != nil {
			return err
		}
	}
	fs.existing = existingServiceChains(kv, fs)
	if err := b.restoreFullIsolating(ctx, fs); err != nil {
		return err
	}
	return b.applyHeld(ctx, fs)
}

// fullSync is the working state of one full sync.
type fullSync struct {
	static *staticRules
	// failed collects the Services the kernel refused (the caller's map).
	failed map[types.NamespacedName]error
	// names are every desired Service, sorted; rendered their rules.
	names    []types.NamespacedName
	rendered map[types.NamespacedName]*serviceRules
	// split: the Services' chains are written ahead in batches (prestaged) and stale
	// chains deleted after the final restore.
	split     bool
	prestaged map[types.NamespacedName]bool
	// existing are the per-Service nat chains in the kernel, and those prestaged.
	existing map[string]bool
	// cands are the Services the next restore writes; held those held back while a
	// failure is isolated (kept as the kernel has them, and applied afterwards).
	cands, held []types.NamespacedName
	// undeletable are stale chains the kernel refused to delete.
	undeletable map[string]bool
	iso         *isolate.Budget
	// mangle is what the kernel holds of the packet counters (nil: not read, nothing).
	mangle *mangleView
	// intact are the new-connection counter chains the kernel holds intact: no restore
	// of this sync writes them.
	intact map[string]bool
}

// readAndRepairJumps reads the kernel before a full sync, notes drift, and inserts the
// jumps from built-in chains that are missing.
func (b *Backend) readAndRepairJumps(ctx context.Context, static *staticRules, drift *dataplane.Drift) (*kernelView, error) {
	kv, err := b.readKernel(ctx)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	return kv, nil
}

// renderFullSync renders every desired Service and decides whether the ruleset is
// written in several restores.
func (b *Backend) renderFullSync(desired *model.NodeState, rc *renderConfig, static *staticRules, failed map[types.NamespacedName]error) *fullSync {
	names := desired.ServiceNames().UnsortedList()
	slices.SortFunc(names, compareNames)
	fs := &fullSync{
		static:      static,
		failed:      failed,
		names:       names,
		rendered:    make(map[types.NamespacedName]*serviceRules, len(names)),
		prestaged:   map[types.NamespacedName]bool{},
		undeletable: map[string]bool{},
		iso:         newIsolation(len(names)),
	}
	chains := 0
	for _, name := range names {
		s := renderService(rc, name, desired.PortsOf(name))
		fs.rendered[name] = s
		chains += len(s.natChains)
	}
	// A large sync in the nft flavour first writes the Services' chains in batches; the
	// final restore then only rewrites the shared chains to point at them.
	fs.split = b.maxChains > 0 && chains > b.maxChains
	if fs.split && !b.splitLogged {
		b.splitLogged = true
		b.logger.Info("Writing the ruleset in several iptables-nft restores: one restore would take minutes, as its cost grows with the square of the chains it creates (upstream kube-proxy never finishes such a ruleset); sluice's nftables mode avoids iptables-nft altogether",
			"chains", chains, "chainsPerRestore", b.maxChains)
	}
	return fs
}

// prestageServices writes the Services' chains ahead of the final restore, in batches.
func (b *Backend) prestageServices(ctx context.Context, kv *kernelView, fs *fullSync) error {
	// The Services' chains jump to KUBE-MARK-MASQ before the final restore fills it;
	// create it empty if it does not exist (never flush it: it may be in use).
	if !kv.chains[tableNAT][chainMarkMasq] {
		if err := b.editor.NewChain(tableNAT, chainMarkMasq); err != nil && !isExistsError(err) {
			return fmt.Errorf("creating chain %s: %w", chainMarkMasq, err)
		}
	}
	list := make([]*serviceRules, 0, len(fs.names))
	for _, name := range fs.names {
		list = append(list, fs.rendered[name])
	}
	return b.prestage(ctx, list, fs.intact, fs.failed, fs.prestaged, fs.iso)
}

// existingServiceChains lists the per-Service nat chains the kernel holds (the
// new-connection counter chains included), and those prestaged in this sync.
func existingServiceChains(kv *kernelView, fs *fullSync) map[string]bool {
	existing := map[string]bool{}
	for c := range kv.chains[tableNAT] {
		if xtables.IsServiceChain(c) || isNewConnChain(c) {
			existing[c] = true
		}
	}
	for name := range fs.prestaged {
		for _, c := range fs.rendered[name].natChains {
			existing[c.name] = true
		}
	}
	return existing
}

// restoreFullIsolating runs the full restore until the kernel takes it, leaving out
// the Services it refuses (or holding half of them back when it names none).
func (b *Backend) restoreFullIsolating(ctx context.Context, fs *fullSync) error {
	fs.cands = make([]types.NamespacedName, 0, len(fs.names))
	for _, name := range fs.names {
		if fs.failed[name] == nil {
			fs.cands = append(fs.cands, name)
		}
	}
	for {
		p, keep, staleLater := b.planFullRestore(fs)
		in := renderFull(p)
		rerr := b.restore(ctx, in, true)
		if rerr == nil {
			b.commitFull(p, keep)
			if len(staleLater) > 0 {
				return b.deleteStale(ctx, staleLater, fs.undeletable)
			}
			return nil
		}
		if err := b.blameFull(fs, in, rerr); err != nil {
			return err
		}
	}
}

// keptServices are the held Services and those the kernel refused: left as the kernel
// has them (their last good version), when that is known. A refused Service whose chains
// a first restore already rewrote (prestaged) cannot be kept as it was: it is removed.
func (b *Backend) keptServices(fs *fullSync) []types.NamespacedName {
	if b.sync.NeedFull {
		return nil
	}
	out := slices.Clone(fs.held)
	for name := range fs.failed {
		if b.applied[name] != nil && !fs.prestaged[name] && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, compareNames)
	return out
}

// planFullRestore builds the next full restore: the candidates written, the kept
// Services left as they are, every other per-Service chain stale. In a split sync the
// stale chains are returned to be deleted after the restore instead.
func (b *Backend) planFullRestore(fs *fullSync) (p *fullPlan, keep []types.NamespacedName, staleLater []string) {
	p = &fullPlan{static: fs.static, prestaged: fs.prestaged, undeletable: fs.undeletable, canary: true,
		packets: b.packetsWanted, mangle: fs.mangle, intact: fs.intact}
	active := map[string]bool{}
	for _, name := range fs.cands {
		s := fs.rendered[name]
		p.write = append(p.write, s)
		for _, c := range s.natChains {
			active[c.name] = true
		}
	}
	keep = b.keptServices(fs)
	for _, name := range keep {
		if a := b.applied[name]; a != nil {
			p.keep = append(p.keep, a)
			for _, c := range a.chainNames() {
				active[c] = true
			}
		}
	}
	for c := range fs.existing {
		if !active[c] {
			p.stale = append(p.stale, c)
		}
	}
	slices.Sort(p.stale)
	if fs.split {
		staleLater, p.stale = p.stale, nil
	}
	return p, keep, staleLater
}

// commitFull records what the kernel holds after a full restore was taken.
func (b *Backend) commitFull(p *fullPlan, keep []types.NamespacedName) {
	applied := map[types.NamespacedName]*appliedService{}
	for _, s := range p.write {
		applied[s.name] = appliedFrom(s)
	}
	for _, name := range keep {
		if a := b.applied[name]; a != nil {
			applied[name] = a
		}
	}
	b.applied, b.static = applied, p.static.fingerprint()
	b.packetsWritten = p.packets
	b.sync.FullSynced(b.opts.now())
	b.appliedNAT, b.appliedFilter = 0, 0
	for _, a := range applied {
		b.appliedNAT += a.natRules
		b.appliedFilter += len(a.filterTop)
	}
}

// blameFull decides what the next full restore leaves out after the kernel refused in;
// an error ends the sync.
func (b *Backend) blameFull(fs *fullSync, in *restoreInput, rerr error) error {
	var re *xtables.RestoreError
	if !errors.As(rerr, &re) || len(re.Lines) == 0 || structural(rerr) {
		return rerr
	}
	if err := fs.iso.Spend(); err != nil {
		return err
	}
	owner, _, named := blame(in, rerr)
	switch {
	case named && owner.kind == lineStale:
		if fs.undeletable[owner.chain] {
			return rerr
		}
		b.logger.Error(rerr, "Could not delete an unused chain, keeping it empty", "chain", owner.chain)
		fs.undeletable[owner.chain] = true
	case named && owner.kind == lineService:
		fs.failed[owner.service] = rerr
		fs.iso.Blamed()
		fs.cands = slices.DeleteFunc(fs.cands, func(n types.NamespacedName) bool { return n == owner.service })
	case len(fs.cands) == 1:
		fs.failed[fs.cands[0]] = rerr
		fs.iso.Blamed()
		fs.cands = nil
	case len(fs.cands) == 0:
		return rerr
	default:
		// Nothing to blame: hold half the Services back (as the kernel has them,
		// when that is known) and try again with the rest.
		half := len(fs.cands) / 2
		fs.held = append(append([]types.NamespacedName(nil), fs.cands[half:]...), fs.held...)
		fs.cands = fs.cands[:half]
	}
	return nil
}

// applyHeld adds the Services held back during the full restore: one partial sync on
// top of the committed state.
func (b *Backend) applyHeld(ctx context.Context, fs *fullSync) error {
	if len(fs.held) == 0 {
		return nil
	}
	units := make([]unit, 0, len(fs.held))
	for _, name := range fs.held {
		units = append(units, unit{name: name, old: b.applied[name], new: fs.rendered[name]})
	}
	changedBehind, err := b.applyUnits(ctx, units, fs.failed)
	if changedBehind {
		return fmt.Errorf("iptables rules changed during a full sync")
	}
	return err
}

// prestage writes Services' chains in batches of at most maxChains chains.
func (b *Backend) prestage(ctx context.Context, list []*serviceRules, intact map[string]bool, failed map[types.NamespacedName]error, done map[types.NamespacedName]bool, iso *isolate.Budget) error {
	search := isolate.Search[*serviceRules]{
		Try: func(batch []*serviceRules) isolate.Outcome {
			in := renderChainsOnly(batch, intact)
			rerr := b.restore(ctx, in, true)
			if rerr == nil {
				for _, s := range batch {
					done[s.name] = true
				}
				return isolate.Taken
			}
			var re *xtables.RestoreError
			if !errors.As(rerr, &re) || len(re.Lines) == 0 || structural(rerr) {
				return isolate.Outcome{Err: rerr, Stop: true}
			}
			out := isolate.Outcome{Err: rerr}
			if owner, _, named := blame(in, rerr); named && owner.kind == lineService {
				for i, s := range batch {
					if s.name == owner.service {
						out.Blamed = map[int]error{i: rerr}
					}
				}
			}
			return out
		},
		Blame: func(s *serviceRules, err error) ([]*serviceRules, error) {
			failed[s.name] = err
			return nil, nil
		},
		Budget: iso,
	}
	return search.Run(batchByChains(list, b.maxChains, func(s *serviceRules) int { return len(s.natChains) }))
}

// deleteStale flushes, then deletes, unused chains in bounded batches.
func (b *Backend) deleteStale(ctx context.Context, stale []string, undeletable map[string]bool) error {
	for _, batch := range batchByChains(stale, b.maxChains, oneChain) {
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
	for _, batch := range batchByChains(todo, b.maxChains, oneChain) {
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
			b.logger.Error(rerr, "Could not delete an unused chain, keeping it empty", "chain", owner.chain)
			batch = slices.DeleteFunc(batch, func(c string) bool { return c == owner.chain })
		}
	}
	return nil
}

// oneChain weighs a stale chain's name for batchByChains.
func oneChain(string) int { return 1 }
