package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Reading the table back: the periodic full resync and the start of a process. Chains,
// named sets and their elements, and rules are dumped once each for the whole table. The
// rules are compared as they come, never held: a chain whose handles are those of the
// previous read cannot have changed, and the others are parsed and hashed rule by rule
// (the anonymous sets of their rules are dumped after the rule dump; they are constant:
// same handles, same content).

// readStats describes one read.
type readStats struct {
	chains, rules, sets, elements int
	parsedChains                  int // chains whose rules were parsed (handles changed)
	anonReads                     int // anonymous sets dumped
}

type rawRule struct {
	handle uint64
	exprs  []byte
	udata  []byte
}

type rawChain struct {
	base    *baseSpec
	comment string
}

// readState reads the family's kube-proxy table. prev is the model of the previous read
// (it lets unchanged chains skip parsing); it is not modified.
func readState(c *conn, f *family, prev *tableState) (*tableState, readStats, error) {
	var stats readStats
	for attempt := 0; ; attempt++ {
		st, err := readStateOnce(c, f, prev, &stats)
		if errors.Is(err, errDumpInterrupted) && attempt < 5 {
			stats = readStats{}
			continue
		}
		return st, stats, err
	}
}

func readStateOnce(c *conn, f *family, prev *tableState, stats *readStats) (*tableState, error) {
	r := &tableReader{c: c, f: f, fam: byte(f.nf), prev: prev, stats: stats, st: newTableState(),
		chains: map[string]*rawChain{}, anonSets: map[string]*setDef{}}
	if prev != nil {
		for k, v := range prev.staleChains {
			r.st.staleChains[k] = v
		}
	}
	exists, err := r.readTable()
	if err != nil {
		return nil, err
	}
	if !exists {
		return r.st, nil
	}
	if err := r.readChains(); err != nil {
		return nil, err
	}
	if err := r.readSets(); err != nil {
		return nil, err
	}
	if err := r.readRules(); err != nil {
		return nil, err
	}
	if err := r.readElements(); err != nil {
		return nil, err
	}
	blocks, err := r.finishChains()
	if err != nil {
		return nil, err
	}
	r.st.slots = rebuildSlots(blocks)
	return r.st, nil
}

// tableReader holds one read of the table, phase by phase: the table, its chains, its
// sets, the rules of every chain (hashed as they come), the sets' elements, and last the
// chains whose rules changed.
type tableReader struct {
	c     *conn
	f     *family
	fam   byte
	prev  *tableState
	stats *readStats
	st    *tableState

	chains   map[string]*rawChain
	order    []string // chain names, in the kernel's order
	anonSets map[string]*setDef
	reads    map[string]*chainRead
}

// readTable reads the table's flags; false if there is no table.
func (r *tableReader) readTable() (bool, error) {
	tbl, err := r.c.request(unix.NFT_MSG_GETTABLE, r.fam, func(b *msgBuilder) {
		b.str(unix.NFTA_TABLE_NAME, kubeProxyTable)
	})
	if err != nil {
		return false, fmt.Errorf("get table: %w", err)
	}
	if tbl == nil {
		return false, nil
	}
	r.st.exists = true
	for it := newAttrIter(tbl.data[nfgenHdrLen:]); it.next(); {
		if it.typ == unix.NFTA_TABLE_FLAGS {
			r.st.flags = it.u32()
		}
	}
	return true, nil
}

// readChains lists the table's chains.
func (r *tableReader) readChains() error {
	err := r.c.dump(unix.NFT_MSG_GETCHAIN, r.fam, func(b *msgBuilder) { b.str(unix.NFTA_CHAIN_TABLE, kubeProxyTable) },
		func(m nlMsg) error {
			var name, table, typ, comment string
			var hook *baseSpec
			for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
				switch it.typ {
				case unix.NFTA_CHAIN_TABLE:
					table = it.str()
				case unix.NFTA_CHAIN_NAME:
					name = it.str()
				case unix.NFTA_CHAIN_TYPE:
					typ = it.str()
				case unix.NFTA_CHAIN_HOOK:
					hook = &baseSpec{}
					for h := newAttrIter(it.val); h.next(); {
						switch h.typ {
						case unix.NFTA_HOOK_HOOKNUM:
							hook.hook = h.u32()
						case unix.NFTA_HOOK_PRIORITY:
							hook.priority = int32(h.u32())
						}
					}
				case nftaChainUserdata:
					comment = udataString(it.val, udataChainComment)
				}
			}
			if table != kubeProxyTable {
				return nil
			}
			if hook != nil {
				hook.typ = typ
			}
			r.chains[name] = &rawChain{base: hook, comment: comment}
			r.order = append(r.order, name)
			return nil
		})
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	r.stats.chains = len(r.chains)
	return nil
}

// readSets lists the table's named sets and remembers the anonymous ones.
func (r *tableReader) readSets() error {
	err := r.c.dump(unix.NFT_MSG_GETSET, r.fam, func(b *msgBuilder) { b.str(unix.NFTA_SET_TABLE, kubeProxyTable) },
		func(m nlMsg) error {
			var d setDef
			var table string
			for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
				switch it.typ {
				case unix.NFTA_SET_TABLE:
					table = it.str()
				case unix.NFTA_SET_NAME:
					d.name = it.str()
				case unix.NFTA_SET_FLAGS:
					d.flags = it.u32()
				case unix.NFTA_SET_KEY_TYPE:
					d.keyType = it.u32()
				case unix.NFTA_SET_KEY_LEN:
					d.keyLen = it.u32()
				case unix.NFTA_SET_DATA_TYPE:
					d.dataType = it.u32()
				case unix.NFTA_SET_DATA_LEN:
					d.dataLen = it.u32()
				case unix.NFTA_SET_TIMEOUT:
					d.timeout = time.Duration(it.u64()) * time.Millisecond
				case unix.NFTA_SET_USERDATA:
					d.comment = udataString(it.val, udataSetComment)
				}
			}
			if table != kubeProxyTable {
				return nil
			}
			if d.dataType == dataTypeVerdict {
				d.dataLen = 0 // the kernel reports sizeof(struct nft_verdict); nft sends 0
			}
			if d.flags&unix.NFT_SET_ANONYMOUS != 0 {
				r.anonSets[d.name] = &d
				return nil
			}
			// The kernel reports flags it manages itself (a set with a timeout and an
			// update statement gets "dynamic"); keep only the ones we compare.
			d.flags &= unix.NFT_SET_MAP | unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL | unix.NFT_SET_INTERVAL | unix.NFT_SET_CONSTANT
			r.st.sets[d.name] = &setState{def: d}
			return nil
		})
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	r.stats.sets = len(r.st.sets)
	return nil
}

// readRules dumps the whole table's rules once.
func (r *tableReader) readRules() error {
	// The rules are hashed as the dump brings them: a full read never holds the table's
	// rules. Only a rule using an anonymous set waits for the end of the dump (its set is
	// dumped then), with the rules of its chain after it.
	r.reads = make(map[string]*chainRead, len(r.chains))
	for name, ch := range r.chains {
		r.reads[name] = newChainRead(ch, prevChain(r.prev, name))
	}
	err := dumpRules(r.c, r.fam, "", func(chain string, raw rawRule) {
		r.stats.rules++
		if cr := r.reads[chain]; cr != nil {
			cr.add(r.fam, raw, r.anonSets)
		}
	})
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	return nil
}

// readElements dumps the named sets' elements (the endpoint maps as intervals).
func (r *tableReader) readElements() error {
	// An endpoint map's elements are gathered in one array reused from map to map and
	// kept at their exact size: 200 000 of them at 10 000 x 10, which append's growth
	// left a fifth larger.
	var scratch intervalElems
	for name, s := range r.st.sets {
		if s.def.flags&unix.NFT_SET_EVAL != 0 {
			continue // the datapath owns its content (affinity)
		}
		if isEndpointMap(name) {
			scratch.reset()
			err := dumpElements(r.c, r.fam, name, func(el anonElem) {
				if len(el.key) != 4 || len(el.data) > 20 {
					return // not one of ours: the map's type is checked before it is used
				}
				scratch.add(binary.BigEndian.Uint32(el.key), el.intervalEnd, el.data)
			})
			if err != nil {
				return fmt.Errorf("list elements of %s: %w", name, err)
			}
			scratch.sort()
			s.intervals = scratch.clone()
			r.stats.elements += len(s.intervals.elems)
			continue
		}
		s.elems = map[string]string{}
		err := dumpElements(r.c, r.fam, name, func(el anonElem) {
			if el.intervalEnd {
				return
			}
			v := el.verdict
			if el.data != nil {
				v = "=" + string(el.data)
			}
			s.elems[string(el.key)] = v
		})
		if err != nil {
			return fmt.Errorf("list elements of %s: %w", name, err)
		}
		r.stats.elements += len(s.elems)
	}
	return nil
}

// finishChains fills each chain's state: an unchanged chain keeps the previous read's
// fingerprint and endpoint block, a chain read part way is read again on its own, the
// others are fingerprinted from their parsed rules. It returns the endpoint blocks found.
func (r *tableReader) finishChains() (map[string]slotBlock, error) {
	blocks := map[string]slotBlock{}
	for _, name := range r.order {
		cr := r.reads[name]
		cs := &chainState{base: r.chains[name].base, handles: cr.handles}
		r.st.chains[name] = cs
		switch {
		case cr.unchanged():
			cs.fp = cr.prev.fp
			if b, ok := r.prev.slots.blocks[name]; ok {
				blocks[name] = b
			}
			continue
		case !cr.parse:
			// The handles left the previous read's part way: the rules before were
			// not kept, so the chain is read again on its own.
			cr = newChainRead(r.chains[name], nil)
			err := dumpRules(r.c, r.fam, name, func(chain string, raw rawRule) {
				if chain == name {
					cr.add(r.fam, raw, r.anonSets)
				}
			})
			if err != nil {
				return nil, fmt.Errorf("list rules of chain %s: %w", name, err)
			}
			cs.handles = cr.handles
		}
		r.stats.parsedChains++
		if cr.finish(r.c, r.f, r.anonSets, r.stats) {
			cs.fp = cr.fp.sum()
		}
		if cr.block != nil {
			blocks[name] = *cr.block
		}
	}
	return blocks, nil
}

// rebuildSlots turns the blocks the chains use into allocator state: below the highest
// block of each map, the blocks no chain uses are free. A block used by two chains is
// given to the first (by name); the other gets a new one and is rewritten.
func rebuildSlots(blocks map[string]slotBlock) slotState {
	out := newSlotState()
	used := map[slotBlock]bool{}
	for _, n := range sortedKeys(blocks) {
		b := blocks[n]
		if used[b] {
			continue
		}
		used[b] = true
		out.blocks[n] = b
		out.next[b.set] = max(out.next[b.set], uint64(b.base)+endpointBlockSize)
	}
	for m := range out.next {
		for base := uint64(0); base < out.next[m]; base += endpointBlockSize {
			if !used[slotBlock{base: uint32(base), set: uint8(m)}] {
				out.free[m] = append(out.free[m], uint32(base))
			}
		}
	}
	return out
}

// prevChain returns the previous read's state of a chain when it can stand for the
// chain's rules (its handles are known and its content was parsed), nil otherwise.
func prevChain(prev *tableState, name string) *chainState {
	if prev == nil {
		return nil
	}
	if p := prev.chains[name]; p != nil && p.handles != nil && !p.fp.isZero() {
		return p
	}
	return nil
}

// chainRead is one chain's rules as a dump brings them. While the handles are those of
// the previous read (prev), nothing else is kept: the chain cannot have changed. Otherwise
// (parse) each rule is parsed and hashed as it comes, except that from the first rule
// using an anonymous set on, the rules are kept for finish, which dumps the set (no other
// request can be made during a dump).
type chainRead struct {
	prev     *chainState
	parse    bool
	handles  []uint64
	fp       fingerprinter
	failed   bool // a rule could not be parsed: the content is unknown
	block    *slotBlock
	deferred []rawRule
}

func newChainRead(ch *rawChain, prev *chainState) *chainRead {
	cr := &chainRead{prev: prev, parse: prev == nil}
	if cr.parse {
		cr.startParse(ch.comment)
	}
	return cr
}

func (cr *chainRead) startParse(comment string) {
	cr.parse = true
	cr.fp.reset()
	cr.fp.addChainComment(comment)
}

// add takes one rule of the chain; r's bytes are only valid during the call.
func (cr *chainRead) add(fam byte, r rawRule, anonSets map[string]*setDef) {
	cr.handles = append(cr.handles, r.handle)
	if !cr.parse || cr.failed {
		return // unchanged tells whether the handles are still the previous read's
	}
	if len(cr.deferred) > 0 {
		cr.deferred = append(cr.deferred, r.clone())
		return
	}
	exprs, anon, block, err := parseKernelRule(fam, r, anonSets)
	switch {
	case err != nil:
		cr.failed = true
	case anon != nil:
		cr.deferred = append(cr.deferred, r.clone())
	default:
		if block != nil {
			cr.block = block
		}
		cr.fp.addRule(exprs, nil, r.udata)
	}
}

// unchanged says whether the chain's rules are the previous read's (same handles).
func (cr *chainRead) unchanged() bool {
	return !cr.parse && slices.Equal(cr.handles, cr.prev.handles)
}

// finish parses the deferred rules, dumping their anonymous sets; false when the chain's
// content is unknown (a rule could not be parsed).
func (cr *chainRead) finish(c *conn, f *family, anonSets map[string]*setDef, stats *readStats) bool {
	fam := byte(f.nf)
	for _, r := range cr.deferred {
		if cr.failed {
			break
		}
		exprs, anon, block, err := parseKernelRule(fam, r, anonSets)
		if err == nil && anon != nil {
			stats.anonReads++
			err = dumpElements(c, fam, anon.name, func(el anonElem) { anon.set.elems = append(anon.set.elems, el) })
			if err != nil {
				return false
			}
		}
		if err != nil {
			cr.failed = true
			break
		}
		if block != nil {
			cr.block = block
		}
		var set *anonSet
		if anon != nil {
			set = anon.set
		}
		cr.fp.addRule(exprs, set, r.udata)
	}
	cr.deferred = nil
	return !cr.failed
}

func (r rawRule) clone() rawRule {
	return rawRule{handle: r.handle, exprs: slices.Clone(r.exprs), udata: slices.Clone(r.udata)}
}

// dumpRules lists the rules of the table, or of one chain of it when chain is not "". fn
// gets each rule with bytes valid only during the call.
func dumpRules(c *conn, fam byte, chain string, fn func(chain string, r rawRule)) error {
	return c.dump(unix.NFT_MSG_GETRULE, fam, func(b *msgBuilder) {
		b.str(unix.NFTA_RULE_TABLE, kubeProxyTable)
		if chain != "" {
			b.str(unix.NFTA_RULE_CHAIN, chain)
		}
	}, func(m nlMsg) error {
		var table, chain string
		var r rawRule
		for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
			switch it.typ {
			case unix.NFTA_RULE_TABLE:
				table = it.str()
			case unix.NFTA_RULE_CHAIN:
				chain = it.str()
			case unix.NFTA_RULE_HANDLE:
				r.handle = it.u64()
			case unix.NFTA_RULE_EXPRESSIONS:
				r.exprs = it.val
			case unix.NFTA_RULE_USERDATA:
				r.udata = it.val
			}
		}
		if table == kubeProxyTable {
			fn(chain, r)
		}
		return nil
	})
}

// ruleAnonSet is the anonymous set a rule uses: its name in the kernel and its
// definition, the elements to be filled by a dump.
type ruleAnonSet struct {
	name string
	set  *anonSet
}

// parseKernelRule parses a rule read from the kernel into the form of compileRule
// (marshalled expressions, anonymous lookups without set name). The anonymous set it
// uses, if any, is returned without its elements (the caller dumps them).
func parseKernelRule(fam byte, r rawRule, anonSets map[string]*setDef) ([][]byte, *ruleAnonSet, *slotBlock, error) {
	var exprBytes [][]byte
	var anon *ruleAnonSet
	var block *slotBlock
	var numgen *expr.Numgen
	for it := newAttrIter(r.exprs); it.next(); {
		if it.typ != unix.NFTA_LIST_ELEM {
			continue
		}
		e, err := parseExpr(fam, it.val)
		if err != nil {
			return nil, nil, nil, err
		}
		switch x := e.(type) {
		case *expr.Counter:
			// A counter's values are traffic, not configuration.
			x.Packets, x.Bytes = 0, 0
		case *expr.Numgen:
			numgen = x
		case *expr.Lookup:
			if numgen != nil && isEndpointMap(x.SetName) && numgen.Modulus == endpointBlockSize &&
				numgen.Offset%endpointBlockSize == 0 {
				block = &slotBlock{base: numgen.Offset, set: uint8(endpointMapIndex(x.SetName))}
			}
		}
		if l, ok := e.(*expr.Lookup); ok && strings.HasPrefix(l.SetName, "__") {
			d := anonSets[l.SetName]
			if d == nil {
				return nil, nil, nil, fmt.Errorf("rule uses unknown anonymous set %s", l.SetName)
			}
			set := &anonSet{flags: d.flags &^ (unix.NFT_SET_ANONYMOUS), keyType: d.keyType, keyLen: d.keyLen,
				dataType: d.dataType, dataLen: d.dataLen}
			set.flags |= unix.NFT_SET_ANONYMOUS
			set.flags &= unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL | unix.NFT_SET_MAP
			if set.flags&unix.NFT_SET_MAP == 0 {
				set.dataType, set.dataLen = 0, 0
			}
			anon = &ruleAnonSet{name: l.SetName, set: set}
			cp := *l
			cp.SetName, cp.SetID = "", 0
			e = &cp
		}
		b, err := expr.Marshal(fam, e)
		if err != nil {
			return nil, nil, nil, err
		}
		exprBytes = append(exprBytes, b)
	}
	return exprBytes, anon, block, nil
}

var errUnknownExpr = errors.New("unknown expression")

// parseExpr parses one NFTA_LIST_ELEM of a rule into a google/nftables expression.
func parseExpr(fam byte, b []byte) (expr.Any, error) {
	var name string
	var data []byte
	for it := newAttrIter(b); it.next(); {
		switch it.typ {
		case unix.NFTA_EXPR_NAME:
			name = it.str()
		case unix.NFTA_EXPR_DATA:
			data = it.val
		}
	}
	if name == "byteorder" {
		return parseByteorder(data), nil
	}
	e := exprByName(name)
	if e == nil {
		return nil, fmt.Errorf("%w %q", errUnknownExpr, name)
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	// An immediate into the verdict register is a verdict.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(fam, data, v); err != nil {
			return nil, fmt.Errorf("parse verdict: %w", err)
		}
		return v, nil
	}
	return e, nil
}

func exprByName(name string) expr.Any {
	switch name {
	case "payload":
		return &expr.Payload{}
	case "cmp":
		return &expr.Cmp{}
	case "meta":
		return &expr.Meta{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "bitwise":
		return &expr.Bitwise{}
	case "ct":
		return &expr.Ct{}
	case "fib":
		return &expr.Fib{}
	case "nat":
		return &expr.NAT{}
	case "masq":
		return &expr.Masq{}
	case "numgen":
		return &expr.Numgen{}
	case "dynset":
		return &expr.Dynset{}
	case "reject":
		return &expr.Reject{}
	case "counter":
		return &expr.Counter{}
	case "objref":
		return &expr.Objref{}
	case "range":
		return &expr.Range{}
	case "log":
		return &expr.Log{}
	case "limit":
		return &expr.Limit{}
	case "redir":
		return &expr.Redir{}
	case "hash":
		return &expr.Hash{}
	case "rt":
		return &expr.Rt{}
	case "exthdr":
		return &expr.Exthdr{}
	}
	return nil
}

// parseByteorder parses a byteorder expression (google/nftables marshals it but does not
// unmarshal it).
func parseByteorder(data []byte) *expr.Byteorder {
	e := &expr.Byteorder{}
	for it := newAttrIter(data); it.next(); {
		switch it.typ {
		case unix.NFTA_BYTEORDER_SREG:
			e.SourceRegister = it.u32()
		case unix.NFTA_BYTEORDER_DREG:
			e.DestRegister = it.u32()
		case unix.NFTA_BYTEORDER_OP:
			e.Op = expr.ByteorderOp(it.u32())
		case unix.NFTA_BYTEORDER_LEN:
			e.Len = it.u32()
		case unix.NFTA_BYTEORDER_SIZE:
			e.Size = it.u32()
		}
	}
	return e
}

// dumpElements lists the elements of one set.
func dumpElements(c *conn, fam byte, set string, fn func(anonElem)) error {
	return c.dump(unix.NFT_MSG_GETSETELEM, fam, func(b *msgBuilder) {
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, kubeProxyTable)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
	}, func(m nlMsg) error {
		for it := newAttrIter(m.data[nfgenHdrLen:]); it.next(); {
			if it.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			for el := newAttrIter(it.val); el.next(); {
				fn(parseElement(el.val))
			}
		}
		return nil
	})
}

func parseElement(b []byte) anonElem {
	var out anonElem
	for it := newAttrIter(b); it.next(); {
		switch it.typ {
		case unix.NFTA_SET_ELEM_KEY:
			for d := newAttrIter(it.val); d.next(); {
				if d.typ == unix.NFTA_DATA_VALUE {
					out.key = slices.Clone(d.val)
				}
			}
		case unix.NFTA_SET_ELEM_DATA:
			for d := newAttrIter(it.val); d.next(); {
				switch d.typ {
				case unix.NFTA_DATA_VALUE:
					out.data = slices.Clone(d.val)
				case unix.NFTA_DATA_VERDICT:
					var code int32
					var chain string
					for v := newAttrIter(d.val); v.next(); {
						switch v.typ {
						case unix.NFTA_VERDICT_CODE:
							code = int32(v.u32())
						case unix.NFTA_VERDICT_CHAIN:
							chain = v.str()
						}
					}
					out.verdict = verdictString(expr.VerdictKind(code), chain)
				}
			}
		case unix.NFTA_SET_ELEM_FLAGS:
			out.intervalEnd = it.u32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		}
	}
	return out
}

// udataString returns the string TLV of type typ in nftables userdata.
func udataString(b []byte, typ byte) string {
	for len(b) >= 2 {
		t, l := b[0], int(b[1])
		if 2+l > len(b) {
			break
		}
		if t == typ {
			s := b[2 : 2+l]
			for len(s) > 0 && s[len(s)-1] == 0 {
				s = s[:len(s)-1]
			}
			return string(s)
		}
		b = b[2+l:]
	}
	return ""
}
