package nftables

import (
	"fmt"
	"sync"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"k8s.io/apimachinery/pkg/util/sets"
)

// The fixed part of the table.

func (p *planner) planStatic() {
	cfg := p.in.cfg
	if !p.tableExists() {
		p.emit(op{kind: opAddTable, name: kubeProxyTable, comment: tableComment})
		p.setTableExists(true)
	}
	wantSets := staticSets(cfg)
	for i := range wantSets {
		d := &wantSets[i]
		p.desiredSets.Insert(d.name)
		if p.set(d.name) == nil {
			p.emit(op{kind: opAddSet, name: d.name, set: d})
			p.putSet(d.name, d)
		}
	}

	// Base chains whose hook or priority differs are deleted and added again in the same
	// transaction; their rules are then rewritten below.
	wantChains := staticChains(cfg)
	var addRules []op
	for i := range wantChains {
		d := &wantChains[i]
		p.desiredChains.Insert(d.name)
		p.unmarkStale(d.name)
		planned, fp := p.planChainRules(d)
		cur := p.chain(d.name)
		switch {
		case cur == nil:
			p.emit(op{kind: opAddChain, name: d.name, base: d.base, comment: d.comment})
		case d.base != nil && (cur.base == nil || *cur.base != *d.base):
			p.emit(op{kind: opDeleteChain, name: d.name})
			p.emit(op{kind: opAddChain, name: d.name, base: d.base, comment: d.comment})
		case cur.fp != fp:
			p.emit(op{kind: opFlushChain, name: d.name})
		default:
			continue
		}
		p.putChain(d.name, &chainState{base: d.base, fp: fp})
		for _, r := range planned {
			addRules = append(addRules, op{kind: opAddRule, name: d.name, rule: r})
		}
	}
	p.cur.ops = append(p.cur.ops, addRules...)

	// @nodeport-ips holds the node addresses NodePorts answer on.
	if !cfg.nodePortMatchAll {
		var want []elemDef
		for _, a := range nodePortAddrs(p.f, cfg.nodePortCIDRs, p.in.localAddrs) {
			want = append(want, elemDef{set: nodePortIPsSet, key: keyAddr(p.f, a)})
		}
		p.syncStaticElements(nodePortIPsSet, want)
	}
	// A fixed set we no longer use (nodeport-ips after nodePortAddresses became "all").
	for _, name := range []string{nodePortIPsSet} {
		if !p.desiredSets.Has(name) && p.set(name) != nil {
			p.emit(op{kind: opDeleteSet, name: name})
			p.putSet(name, nil)
		}
	}
}

// syncStaticElements makes a set owned by the fixed part hold exactly want.
func (p *planner) syncStaticElements(set string, want []elemDef) {
	wantKeys := sets.New[string]()
	var add []elemDef
	for _, e := range want {
		wantKeys.Insert(e.key)
		if _, ok := p.elem(elemRef{set, e.key}); !ok {
			add = append(add, e)
			p.putElem(elemRef{set, e.key}, e.value, true)
		}
	}
	var del []elemDef
	if s := p.base.sets[set]; s != nil {
		for _, k := range sortedKeys(s.elems) {
			if !wantKeys.Has(k) {
				del = append(del, elemDef{set: set, key: k})
				p.putElem(elemRef{set, k}, "", false)
			}
		}
	}
	if len(del) > 0 {
		p.emit(op{kind: opDeleteElements, name: set, elems: del})
	}
	if len(add) > 0 {
		p.emit(op{kind: opAddElements, name: set, elems: add})
	}
}

// planChainRules compiles a chain's rules and fingerprints them.
func (p *planner) planChainRules(d *chainDef) ([]*plannedRule, fingerprint) {
	p.fp.reset()
	p.fp.addChainComment(d.comment)
	out := make([]*plannedRule, 0, len(d.rules))
	for i := range d.rules {
		pr := compileRule(p.f, d.rules[i])
		p.fp.addRule(pr.exprs, pr.c.anon, pr.c.udata)
		out = append(out, pr)
	}
	return out, p.fp.sum()
}

// compileRule compiles r and marshals its expressions once, for both the fingerprint
// and the netlink message.
func compileRule(f *family, r rule) *plannedRule {
	pr := &plannedRule{r: r, c: &compiled{}, anonLookup: -1}
	n := 4 * len(r.terms)
	pr.c.exprs = make([]expr.Any, 0, n)
	pr.exprs = make([][]byte, 0, n)
	for _, t := range r.terms {
		if ct, ok := t.(constantTerm); ok {
			ce := cachedTerm(f, ct)
			if ce.anonLookup >= 0 {
				pr.anonLookup = len(pr.exprs) + ce.anonLookup
			}
			pr.c.exprs = append(pr.c.exprs, ce.exprs...)
			pr.exprs = append(pr.exprs, ce.bytes...)
			if at, ok := t.(anonTerm); ok {
				pr.c.anon = at.anon(f)
			}
			continue
		}
		start := len(pr.c.exprs)
		t.compile(f, pr.c)
		for _, e := range pr.c.exprs[start:] {
			if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
				pr.anonLookup = len(pr.exprs)
			}
			pr.exprs = append(pr.exprs, marshalExpr(f, e))
		}
	}
	if r.comment != "" {
		pr.c.udata = userdata.AppendString(nil, userdata.TypeComment, truncateComment(r.comment))
	}
	return pr
}

func marshalExpr(f *family, e expr.Any) []byte {
	b, err := expr.Marshal(byte(f.nf), e)
	if err != nil {
		// Our own expressions always marshal; a failure is a programming error.
		panic(fmt.Sprintf("nftables: marshal %T: %v", e, err))
	}
	return b
}

// constantTerm is a term whose expressions depend only on the family and its key; they
// are compiled and marshalled once per process (most rules of a large table share them).
type constantTerm interface {
	term
	constKey() string
}

// anonTerm is a term with an anonymous set whose expressions are constant but whose set
// content is not.
type anonTerm interface {
	anon(f *family) *anonSet
}

type cachedExprs struct {
	exprs      []expr.Any
	bytes      [][]byte
	anonLookup int
}

var exprCache sync.Map // family name + "/" + constKey -> *cachedExprs

func cachedTerm(f *family, t constantTerm) *cachedExprs {
	key := f.name + "/" + t.constKey()
	if v, ok := exprCache.Load(key); ok {
		return v.(*cachedExprs)
	}
	c := &compiled{}
	t.compile(f, c)
	ce := &cachedExprs{exprs: c.exprs, anonLookup: -1}
	for i, e := range c.exprs {
		if l, ok := e.(*expr.Lookup); ok && l.SetName == "" {
			ce.anonLookup = i
		}
		ce.bytes = append(ce.bytes, marshalExpr(f, e))
	}
	v, _ := exprCache.LoadOrStore(key, ce)
	return v.(*cachedExprs)
}
