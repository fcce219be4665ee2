package nftables

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// opKind is one kind of change to the table; each becomes one netlink message (element
// operations: one message per set, split when very long).
type opKind uint8

const (
	opAddTable opKind = iota
	opDeleteTable
	opAddChain
	opFlushChain
	opDeleteChain
	opAddRule
	opAddSet
	opDeleteSet
	opAddElements
	opDeleteElements
)

// op is one planned change.
type op struct {
	kind    opKind
	name    string    // table, chain or set
	base    *baseSpec // opAddChain of a base chain
	comment string    // opAddTable, opAddChain
	set     *setDef   // opAddSet
	rule    *plannedRule
	elems   []elemDef // opAddElements, opDeleteElements; all of set `name`
}

// plannedRule is a rule to add, compiled once: the planner fingerprints the same bytes
// the encoder sends.
type plannedRule struct {
	r     rule
	c     *compiled
	exprs [][]byte // expr.Marshal of each expression
	// anonLookup is the index in exprs of the lookup into the rule's anonymous set.
	anonLookup int
}

// group is a unit of atomicity and of failure: the changes of one Service, or of the
// table's fixed part. A batch holds whole groups; when the kernel rejects a batch, the
// groups at fault are left out and the rest is applied.
type group struct {
	// service is the Service the group programs, or "" for the fixed part and the
	// cleanup of leftovers (a failure there fails the whole sync).
	service types.NamespacedName
	// cleanup marks the group that removes leftovers and stale chains (its failure is a
	// cleanup failure).
	cleanup bool
	// applied is set by the applier when the kernel took the group.
	applied bool
	ops     []op
	fx      *groupEffects
}

func (g *group) isService() bool { return g.service.Name != "" }

// len counts the group's operations (an element counts as one).
func (g *group) len() int {
	n := 0
	for i := range g.ops {
		if o := &g.ops[i]; o.kind == opAddElements || o.kind == opDeleteElements {
			n += len(o.elems)
		} else {
			n++
		}
	}
	return n
}

// Plan is the ordered list of changes that makes the kernel match the desired state.
type Plan struct {
	fam *family
	// replace means the table is rebuilt from scratch in one transaction (delete and
	// recreate): its layout cannot be converged in place. Such a plan is never chunked.
	replace bool
	groups  []*group // only when collected (plan); streamPlan hands them out
	// invalid lists Services that failed validation; they are not in the plan.
	invalid map[types.NamespacedName]error
	// full tells whether the plan covered every Service.
	full bool
	// staleChains is the deferred-deletion list after this plan.
	staleChains map[string]time.Time
	// base is the model the plan started from (a fresh one for a replacement): the
	// model after the plan, once the groups the kernel took are committed to it.
	base *tableState
}

// Len returns the number of operations in the plan (an element counts as one operation,
// as an nft command line would).
func (p *Plan) Len() int {
	n := 0
	for _, g := range p.groups {
		n += g.len()
	}
	return n
}

// Empty reports whether the plan changes nothing.
func (p *Plan) Empty() bool {
	for _, g := range p.groups {
		if len(g.ops) > 0 {
			return false
		}
	}
	return true
}

// String renders the plan in nft syntax, one command per line, with a "# <service>" line
// before each Service's group: the golden form reviewed in tests.
func (p *Plan) String() string {
	var b strings.Builder
	for _, g := range p.groups {
		if len(g.ops) == 0 {
			continue
		}
		if g.isService() {
			b.WriteString("# " + g.service.String() + "\n")
		}
		for _, o := range g.ops {
			o.render(p.fam, &b)
		}
	}
	return b.String()
}

func (o *op) render(f *family, b *strings.Builder) {
	prefix := f.name + " " + kubeProxyTable
	switch o.kind {
	case opAddTable:
		b.WriteString("add table " + prefix)
		if o.comment != "" {
			b.WriteString(" { comment " + strconv.Quote(o.comment) + " ; }")
		}
	case opDeleteTable:
		b.WriteString("delete table " + prefix)
	case opAddChain:
		b.WriteString("add chain " + prefix + " " + o.name)
		switch {
		case o.base != nil:
			fmt.Fprintf(b, " { type %s hook %s priority %d ; }", o.base.typ, hookName(o.base.hook), o.base.priority)
		case o.comment != "":
			b.WriteString(" { comment " + strconv.Quote(o.comment) + " ; }")
		}
	case opFlushChain:
		b.WriteString("flush chain " + prefix + " " + o.name)
	case opDeleteChain:
		b.WriteString("delete chain " + prefix + " " + o.name)
	case opAddRule:
		b.WriteString("add rule " + prefix + " " + o.name + " " + o.rule.r.String(f))
	case opAddSet:
		s := o.set
		kind := "set"
		if s.flags&unix.NFT_SET_MAP != 0 {
			kind = "map"
		}
		if isEndpointMap(s.name) {
			addr := "ip daddr"
			if s.dataLen > 8 {
				addr = "ip6 daddr"
			}
			b.WriteString("add map " + prefix + " " + s.name + " { typeof numgen random mod " + strconv.Itoa(endpointBlockSize) +
				" : " + addr + " . th dport ;")
		} else {
			b.WriteString("add " + kind + " " + prefix + " " + s.name + " { type " + typeName(s.keyType))
			if s.flags&unix.NFT_SET_MAP != 0 {
				b.WriteString(" : " + typeName(s.dataType))
			}
			b.WriteString(" ;")
		}
		var flags []string
		if s.flags&unix.NFT_SET_INTERVAL != 0 {
			flags = append(flags, "interval")
		}
		if s.flags&unix.NFT_SET_EVAL != 0 {
			flags = append(flags, "dynamic")
		}
		if s.flags&unix.NFT_SET_TIMEOUT != 0 {
			flags = append(flags, "timeout")
		}
		if len(flags) > 0 {
			b.WriteString(" flags " + strings.Join(flags, ",") + " ;")
		}
		if s.timeout != 0 {
			fmt.Fprintf(b, " timeout %ds ;", int(s.timeout/time.Second))
		}
		if s.comment != "" {
			b.WriteString(" comment " + strconv.Quote(s.comment) + " ;")
		}
		b.WriteString(" }")
	case opDeleteSet:
		b.WriteString("delete set " + prefix + " " + o.name)
	case opAddElements, opDeleteElements:
		verb := "add"
		if o.kind == opDeleteElements {
			verb = "delete"
		}
		for i, e := range o.elems {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(verb + " element " + prefix + " " + o.name + " { " + renderKey(f, o.name, e.key))
			if o.kind == opAddElements {
				if e.comment != "" {
					b.WriteString(" comment " + strconv.Quote(e.comment))
				}
				if e.value != "" {
					b.WriteString(" : " + renderValue(f, e.value))
				}
			}
			b.WriteString(" }")
		}
	}
	b.WriteByte('\n')
}

func hookName(h uint32) string {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return "prerouting"
	case unix.NF_INET_LOCAL_IN:
		return "input"
	case unix.NF_INET_FORWARD:
		return "forward"
	case unix.NF_INET_LOCAL_OUT:
		return "output"
	case unix.NF_INET_POST_ROUTING:
		return "postrouting"
	}
	return "hook" + strconv.Itoa(int(h))
}

// typeName spells a (possibly concatenated) data type as nft does.
func typeName(t uint32) string {
	if t == dataTypeVerdict {
		return "verdict"
	}
	var parts []string
	for t != 0 {
		var name string
		switch t & 0x3f {
		case typeVerdict:
			name = "verdict"
		case typeInteger:
			name = "integer"
		case typeIPv4Addr:
			name = "ipv4_addr"
		case typeIPv6Addr:
			name = "ipv6_addr"
		case typeInetProto:
			name = "inet_proto"
		case typeInetService:
			name = "inet_service"
		default:
			name = "type" + strconv.Itoa(int(t&0x3f))
		}
		parts = append([]string{name}, parts...)
		t >>= 6
	}
	return strings.Join(parts, " . ")
}
