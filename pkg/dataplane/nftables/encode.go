package nftables

import (
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The encoder turns planned ops into netlink messages. Rule expressions come from
// google/nftables (expr.Marshal, done by the planner); the messages around them are
// built here.

const (
	// maxNestLen keeps a nested attribute (a list of set elements) under the 64 KiB an
	// attribute length can express.
	maxNestLen = 60000

	nftaTableUserdata  = 6 // NFTA_TABLE_USERDATA
	nftaChainUserdata  = 12
	nftaSetDescSize    = 1 // NFTA_SET_DESC_SIZE
	udataTableComment  = 0 // NFTNL_UDATA_TABLE_COMMENT
	udataChainComment  = 0 // NFTNL_UDATA_CHAIN_COMMENT
	udataSetKeyOrder   = 0 // NFTNL_UDATA_SET_KEYBYTEORDER
	udataSetComment    = 7 // NFTNL_UDATA_SET_COMMENT
	byteorderHost      = 1
	byteorderBigEndian = 2
)

func msgType(t int) uint16 { return uint16(nfnlSubsysNFTables<<8 | t) }

// encoder accumulates the messages of one batch.
type encoder struct {
	f     *family
	b     msgBuilder
	count int
	// owner[i] is the group of message i.
	owner []int
	setID uint32
}

func newEncoder(f *family) *encoder { return &encoder{f: f} }

func (e *encoder) size() int { return len(e.b.buf) }

func (e *encoder) begin(t int, flags uint16, group int) {
	e.b.begin(msgType(t), unix.NLM_F_REQUEST|flags, byte(e.f.nf))
	e.owner = append(e.owner, group)
	e.count++
}

func (e *encoder) end() { e.b.end() }

// encodeOp appends the messages of one op, owned by group.
func (e *encoder) encodeOp(o *op, group int) {
	b := &e.b
	switch o.kind {
	case opAddTable:
		e.begin(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, group)
		b.str(unix.NFTA_TABLE_NAME, o.name)
		b.u32(unix.NFTA_TABLE_FLAGS, 0)
		if o.comment != "" {
			b.attr(nftaTableUserdata, userdata.AppendString(nil, udataTableComment, o.comment))
		}
		e.end()
	case opDeleteTable:
		e.begin(unix.NFT_MSG_DELTABLE, 0, group)
		b.str(unix.NFTA_TABLE_NAME, o.name)
		e.end()
	case opAddChain:
		e.begin(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, group)
		b.str(unix.NFTA_CHAIN_TABLE, kubeProxyTable)
		b.str(unix.NFTA_CHAIN_NAME, o.name)
		if o.base != nil {
			b.nest(unix.NFTA_CHAIN_HOOK)
			b.u32(unix.NFTA_HOOK_HOOKNUM, o.base.hook)
			b.u32(unix.NFTA_HOOK_PRIORITY, uint32(o.base.priority))
			b.endNest()
			b.str(unix.NFTA_CHAIN_TYPE, o.base.typ)
		}
		if o.comment != "" {
			b.attr(nftaChainUserdata, userdata.AppendString(nil, udataChainComment, truncateComment(o.comment)))
		}
		e.end()
	case opFlushChain:
		e.begin(unix.NFT_MSG_DELRULE, 0, group)
		b.str(unix.NFTA_RULE_TABLE, kubeProxyTable)
		b.str(unix.NFTA_RULE_CHAIN, o.name)
		e.end()
	case opDeleteChain:
		e.begin(unix.NFT_MSG_DELCHAIN, 0, group)
		b.str(unix.NFTA_CHAIN_TABLE, kubeProxyTable)
		b.str(unix.NFTA_CHAIN_NAME, o.name)
		e.end()
	case opAddRule:
		e.encodeRule(o.name, o.rule, group)
	case opAddSet:
		e.encodeSet(o.set, "", 0, group)
	case opDeleteSet:
		e.begin(unix.NFT_MSG_DELSET, 0, group)
		b.str(unix.NFTA_SET_TABLE, kubeProxyTable)
		b.str(unix.NFTA_SET_NAME, o.name)
		e.end()
	case opAddElements, opDeleteElements:
		e.encodeElements(o, group)
	}
}

func (e *encoder) encodeRule(chain string, pr *plannedRule, group int) {
	exprs := pr.exprs
	if pr.c.anon != nil {
		// The rule's anonymous set goes first, in the same transaction, and the lookup
		// names it by the ID we give it.
		e.setID++
		name := "__set%d"
		if pr.c.anon.flags&unix.NFT_SET_MAP != 0 {
			name = "__map%d"
		}
		e.encodeAnonSet(pr.c.anon, name, e.setID, group)
		if pr.anonLookup >= 0 {
			l := *pr.c.exprs[pr.anonLookup].(*expr.Lookup)
			l.SetName, l.SetID = name, e.setID
			bl, err := expr.Marshal(byte(e.f.nf), &l)
			if err != nil {
				panic(fmt.Sprintf("nftables: marshal lookup: %v", err))
			}
			exprs = append([][]byte(nil), exprs...)
			exprs[pr.anonLookup] = bl
		}
	}
	b := &e.b
	e.begin(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, group)
	b.str(unix.NFTA_RULE_TABLE, kubeProxyTable)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, x := range exprs {
		b.attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, x)
	}
	b.endNest()
	if len(pr.c.udata) > 0 {
		b.attr(unix.NFTA_RULE_USERDATA, pr.c.udata)
	}
	e.end()
}

// beginSet starts a NEWSET message in sluice's table with the attributes every set has:
// name, flags, key type and length, and, for a map, the data type and length.
func (e *encoder) beginSet(name string, flags, keyType, keyLen, dataType, dataLen uint32, group int) {
	b := &e.b
	e.begin(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, group)
	b.str(unix.NFTA_SET_TABLE, kubeProxyTable)
	b.str(unix.NFTA_SET_NAME, name)
	b.u32(unix.NFTA_SET_FLAGS, flags)
	b.u32(unix.NFTA_SET_KEY_TYPE, keyType)
	b.u32(unix.NFTA_SET_KEY_LEN, keyLen)
	if flags&unix.NFT_SET_MAP != 0 {
		b.u32(unix.NFTA_SET_DATA_TYPE, dataType)
		b.u32(unix.NFTA_SET_DATA_LEN, dataLen)
	}
}

func (e *encoder) encodeSet(s *setDef, name string, id uint32, group int) {
	b := &e.b
	if name == "" {
		name = s.name
	}
	e.beginSet(name, s.flags, s.keyType, s.keyLen, s.dataType, s.dataLen, group)
	if s.timeout != 0 {
		b.u64(unix.NFTA_SET_TIMEOUT, uint64(s.timeout.Milliseconds()))
	}
	b.u32(unix.NFTA_SET_ID, id)
	// nft reads the key byte order from the userdata to print integer keys; everything
	// else it prints from the types.
	ud := s.udata
	if ud == nil {
		order := uint32(byteorderBigEndian)
		if s.keyType == typeInteger {
			order = byteorderHost
		}
		ud = userdata.AppendUint32(nil, udataSetKeyOrder, order)
		if s.comment != "" {
			ud = userdata.AppendString(ud, udataSetComment, truncateComment(s.comment))
		}
	}
	b.attr(unix.NFTA_SET_USERDATA, ud)
	e.end()
}

func (e *encoder) encodeAnonSet(a *anonSet, name string, id uint32, group int) {
	b := &e.b
	e.beginSet(name, a.flags, a.keyType, a.keyLen, a.dataType, a.dataLen, group)
	b.u32(unix.NFTA_SET_ID, id)
	b.nest(unix.NFTA_SET_DESC)
	b.u32(nftaSetDescSize, uint32(len(a.elems)))
	b.endNest()
	order := uint32(byteorderBigEndian)
	if a.keyType == typeInteger {
		order = byteorderHost
	}
	b.attr(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, udataSetKeyOrder, order))
	e.end()

	for start := 0; start < len(a.elems); {
		e.begin(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, group)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, kubeProxyTable)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, name)
		b.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
		b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		i := start
		for ; i < len(a.elems) && b.nestLen() < maxNestLen; i++ {
			el := &a.elems[i]
			b.nest(unix.NFTA_LIST_ELEM)
			b.nest(unix.NFTA_SET_ELEM_KEY)
			b.attr(unix.NFTA_DATA_VALUE, el.key)
			b.endNest()
			if el.intervalEnd {
				b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
			}
			switch {
			case el.verdict != "":
				e.encodeVerdictData(el.verdict)
			case el.data != nil:
				b.nest(unix.NFTA_SET_ELEM_DATA)
				b.attr(unix.NFTA_DATA_VALUE, el.data)
				b.endNest()
			}
			b.endNest()
		}
		b.endNest()
		e.end()
		start = i
	}
}

// encodeVerdictData appends NFTA_SET_ELEM_DATA holding a verdict ("goto X", "drop").
func (e *encoder) encodeVerdictData(v string) {
	b := &e.b
	kind, chain := parseVerdict(v)
	b.nest(unix.NFTA_SET_ELEM_DATA)
	b.nest(unix.NFTA_DATA_VERDICT)
	b.u32(unix.NFTA_VERDICT_CODE, uint32(int32(kind)))
	if chain != "" {
		b.str(unix.NFTA_VERDICT_CHAIN, chain)
	}
	b.endNest()
	b.endNest()
}

func parseVerdict(v string) (expr.VerdictKind, string) {
	word, chain, _ := strings.Cut(v, " ")
	switch word {
	case "goto":
		return expr.VerdictGoto, chain
	case "jump":
		return expr.VerdictJump, chain
	case "drop":
		return expr.VerdictDrop, ""
	case "accept":
		return expr.VerdictAccept, ""
	case "return":
		return expr.VerdictReturn, ""
	}
	panic("nftables: unknown verdict " + v)
}

func (e *encoder) encodeElements(o *op, group int) {
	b := &e.b
	t, flags := unix.NFT_MSG_NEWSETELEM, uint16(unix.NLM_F_CREATE)
	if o.kind == opDeleteElements {
		t, flags = unix.NFT_MSG_DELSETELEM, 0
	}
	intervals := isEndpointMap(o.name)
	for start := 0; start < len(o.elems); {
		e.begin(t, flags, group)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, kubeProxyTable)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, o.name)
		b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		i := start
		for ; i < len(o.elems) && b.nestLen() < maxNestLen; i++ {
			el := &o.elems[i]
			if intervals {
				e.encodeIntervalElement(o.kind, el)
				continue
			}
			b.nest(unix.NFTA_LIST_ELEM)
			b.nest(unix.NFTA_SET_ELEM_KEY)
			b.attr(unix.NFTA_DATA_VALUE, []byte(el.key))
			b.endNest()
			if o.kind == opAddElements {
				switch {
				case strings.HasPrefix(el.value, "="):
					b.nest(unix.NFTA_SET_ELEM_DATA)
					b.attr(unix.NFTA_DATA_VALUE, []byte(el.value[1:]))
					b.endNest()
				case el.value != "":
					e.encodeVerdictData(el.value)
				}
				if el.comment != "" {
					b.attr(unix.NFTA_SET_ELEM_USERDATA,
						userdata.AppendString(nil, userdata.NFTNL_UDATA_SET_ELEM_COMMENT, truncateComment(el.comment)))
				}
			}
			b.endNest()
		}
		b.endNest()
		e.end()
		start = i
	}
}

// encodeIntervalElement appends an element of an endpoint map (an interval map): a range
// (8-byte key, see rangeKey) is its start element, with the endpoint when added, and its
// interval end, in that order, as nft sends them; a 4-byte key is a lone start, a 5-byte
// one (endKey) a lone end.
func (e *encoder) encodeIntervalElement(kind opKind, el *elemDef) {
	b := &e.b
	start, end := el.key, ""
	switch len(el.key) {
	case 8:
		start, end = el.key[:4], el.key[4:]
	case 5:
		start, end = "", el.key[:4]
	}
	if start != "" {
		b.nest(unix.NFTA_LIST_ELEM)
		b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, []byte(start))
		b.endNest()
		if kind == opAddElements && strings.HasPrefix(el.value, "=") {
			b.nest(unix.NFTA_SET_ELEM_DATA)
			b.attr(unix.NFTA_DATA_VALUE, []byte(el.value[1:]))
			b.endNest()
		}
		b.endNest()
	}
	if end != "" {
		b.nest(unix.NFTA_LIST_ELEM)
		b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, []byte(end))
		b.endNest()
		b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
		b.endNest()
	}
}
