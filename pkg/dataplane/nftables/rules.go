package nftables

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A rule is a typed list of terms that renders as nft syntax (for golden files, logs and
// `sluice render`) and compiles to google/nftables expressions for netlink. Every term
// compiles to exactly the expressions nft(8) 1.0 generates for the same text, so a rule
// read back from a table upstream kube-proxy wrote compares equal to ours.
type rule struct {
	terms   []term
	comment string
}

// term is one match or statement of a rule. The set of terms is closed: these are all
// the shapes kube-proxy's table needs.
type term interface {
	render(f *family, b *strings.Builder)
	compile(f *family, c *compiled)
}

// compiled is a rule in netlink form. Lookups into the rule's anonymous set carry no set
// name or ID here (the encoder fills them in), so that compiled rules are comparable with
// rules read from the kernel, whose anonymous sets have kernel-chosen names.
type compiled struct {
	exprs []expr.Any
	anon  *anonSet
	udata []byte
}

// anonSet is the constant anonymous set or map of a rule ("{ ... }" in nft syntax).
type anonSet struct {
	flags    uint32 // NFT_SET_ANONYMOUS|NFT_SET_CONSTANT plus NFT_SET_INTERVAL or NFT_SET_MAP
	keyType  uint32
	keyLen   uint32
	dataType uint32 // maps only
	dataLen  uint32
	elems    []anonElem
}

type anonElem struct {
	key         []byte
	data        []byte // data maps
	verdict     string // verdict maps: "goto chain", ...
	intervalEnd bool
}

func (r *rule) String(f *family) string {
	var b strings.Builder
	for i, t := range r.terms {
		if i > 0 {
			b.WriteByte(' ')
		}
		t.render(f, &b)
	}
	if r.comment != "" {
		b.WriteString(" comment ")
		b.WriteString(strconv.Quote(r.comment))
	}
	return b.String()
}

// hashInto adds the set's kind and content, in key order, to a fingerprint.
func (s *anonSet) hashInto(p *fingerprinter) {
	var hdr [20]byte
	binary.BigEndian.PutUint32(hdr[0:], s.flags&^unix.NFT_SET_ANONYMOUS)
	binary.BigEndian.PutUint32(hdr[4:], s.keyType)
	binary.BigEndian.PutUint32(hdr[8:], s.keyLen)
	binary.BigEndian.PutUint32(hdr[12:], s.dataType)
	binary.BigEndian.PutUint32(hdr[16:], s.dataLen)
	p.h.Write(hdr[:])
	less := func(a, b *anonElem) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		switch {
		case a.intervalEnd == b.intervalEnd:
			return 0
		case a.intervalEnd:
			return 1
		}
		return -1
	}
	elems := s.elems
	if !slices.IsSortedFunc(elems, func(a, b anonElem) int { return less(&a, &b) }) {
		elems = slices.Clone(elems)
		slices.SortFunc(elems, func(a, b anonElem) int { return less(&a, &b) })
	}
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(elems)))
	p.h.Write(hdr[:4])
	for i := range elems {
		e := &elems[i]
		p.writeLV(e.key)
		p.writeLV(e.data)
		p.writeLV([]byte(e.verdict))
		if e.intervalEnd {
			p.h.Write([]byte{1})
		} else {
			p.h.Write([]byte{0})
		}
	}
}

// Terms.

// addrDir selects the source or destination address of the network header.
type addrDir bool

const (
	saddr addrDir = false
	daddr addrDir = true
)

func (d addrDir) String() string {
	if d == daddr {
		return "daddr"
	}
	return "saddr"
}

func (f *family) offset(d addrDir) uint32 {
	if d == daddr {
		return f.daddrOffset
	}
	return f.saddrOffset
}

func loadAddr(f *family, d addrDir, reg uint32, n uint32) *expr.Payload {
	return &expr.Payload{
		OperationType: expr.PayloadLoad, DestRegister: reg, Base: expr.PayloadBaseNetworkHeader,
		Offset: f.offset(d), Len: n,
	}
}

func loadL4Proto(reg uint32) *expr.Meta {
	return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}
}

func loadDport(reg uint32) *expr.Payload {
	return &expr.Payload{
		OperationType: expr.PayloadLoad, DestRegister: reg, Base: expr.PayloadBaseTransportHeader,
		Offset: 2, Len: 2,
	}
}

func cmpOp(neg bool) expr.CmpOp {
	if neg {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

func writeNeg(b *strings.Builder, neg bool) {
	if neg {
		b.WriteString("!= ")
	}
}

// ctStateNew is "ct state new".
type ctStateNew struct{}

func (ctStateNew) render(_ *family, b *strings.Builder) { b.WriteString("ct state new") }
func (ctStateNew) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	)
}

// ctStatusDNAT is "ct status dnat".
type ctStatusDNAT struct{}

func (ctStatusDNAT) render(_ *family, b *strings.Builder) { b.WriteString("ct status dnat") }
func (ctStatusDNAT) compile(_ *family, c *compiled) {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT
	c.exprs = append(c.exprs,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	)
}

// addrMatch is "ip saddr 10.0.0.0/8", "ip daddr != { a, b }", ... One prefix compiles
// to a compare (of the prefix bytes when the length is a multiple of 8, of the masked
// address otherwise), several to a lookup in an anonymous interval set, as nft does.
type addrMatch struct {
	dir      addrDir
	neg      bool
	prefixes []netip.Prefix
	// braces renders a single prefix as "{ p }" (upstream writes some rules that way);
	// the kernel form is the same either way.
	braces bool
}

func (m addrMatch) render(f *family, b *strings.Builder) {
	b.WriteString(f.name + " " + m.dir.String() + " ")
	writeNeg(b, m.neg)
	if len(m.prefixes) == 1 && !m.braces {
		b.WriteString(prefixString(m.prefixes[0]))
		return
	}
	b.WriteString("{ ")
	for i, p := range m.prefixes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(prefixString(p))
	}
	b.WriteString(" }")
}

func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

func (m addrMatch) compile(f *family, c *compiled) {
	full := uint32(f.addrLn)
	if len(m.prefixes) == 1 {
		p := m.prefixes[0].Masked()
		bits := p.Bits()
		addr := f.addrBytes(p.Addr())
		switch {
		case bits == int(full)*8:
			c.exprs = append(c.exprs, loadAddr(f, m.dir, 1, full),
				&expr.Cmp{Op: cmpOp(m.neg), Register: 1, Data: addr})
		case bits%8 == 0 && bits > 0:
			n := uint32(bits / 8)
			c.exprs = append(c.exprs, loadAddr(f, m.dir, 1, n),
				&expr.Cmp{Op: cmpOp(m.neg), Register: 1, Data: addr[:n]})
		default:
			c.exprs = append(c.exprs, loadAddr(f, m.dir, 1, full),
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: full,
					Mask: prefixMask(bits, int(full)), Xor: make([]byte, full)},
				&expr.Cmp{Op: cmpOp(m.neg), Register: 1, Data: addr})
		}
		return
	}
	c.exprs = append(c.exprs, loadAddr(f, m.dir, 1, full),
		&expr.Lookup{SourceRegister: 1, Invert: m.neg})
	c.anon = intervalSet(f, m.prefixes)
}

func prefixMask(bits, n int) []byte {
	mask := make([]byte, n)
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// intervalSet encodes prefixes as nft does for an anonymous interval set: overlapping and
// adjacent ranges merged, each range as a start element and an "interval end" element at
// the address after it (none when the range reaches the top of the address space), and a
// leading interval end at the zero address when the first range does not start there.
func intervalSet(f *family, prefixes []netip.Prefix) *anonSet {
	type span struct{ lo, hi []byte } // hi is exclusive; nil means "past the top"
	spans := make([]span, 0, len(prefixes))
	for _, p := range prefixes {
		p = p.Masked()
		lo := f.addrBytes(p.Addr())
		spans = append(spans, span{lo: lo, hi: addBytes(lo, p.Bits())})
	}
	slices.SortFunc(spans, func(a, b span) int { return bytes.Compare(a.lo, b.lo) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if last.hi == nil || bytes.Compare(s.lo, last.hi) <= 0 {
				if last.hi != nil && (s.hi == nil || bytes.Compare(s.hi, last.hi) > 0) {
					last.hi = s.hi
				}
				continue
			}
		}
		merged = append(merged, s)
	}
	set := &anonSet{
		flags:   unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL,
		keyType: f.addrType, keyLen: uint32(f.addrLn),
	}
	zero := make([]byte, f.addrLn)
	if len(merged) > 0 && !bytes.Equal(merged[0].lo, zero) {
		set.elems = append(set.elems, anonElem{key: zero, intervalEnd: true})
	}
	for _, s := range merged {
		set.elems = append(set.elems, anonElem{key: s.lo})
		if s.hi != nil {
			set.elems = append(set.elems, anonElem{key: s.hi, intervalEnd: true})
		}
	}
	return set
}

// addBytes returns the first address after the prefix lo/bits, or nil if there is none.
func addBytes(lo []byte, bits int) []byte {
	out := slices.Clone(lo)
	hostBits := len(lo)*8 - bits
	// Set all host bits, then add one.
	for i := 0; i < hostBits; i++ {
		byteIdx := len(out) - 1 - i/8
		out[byteIdx] |= 1 << (i % 8)
	}
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			return out
		}
	}
	return nil
}

// addrInSet is "ip daddr @set" (or "!= @set").
type addrInSet struct {
	dir addrDir
	neg bool
	set string
}

func (m addrInSet) render(f *family, b *strings.Builder) {
	b.WriteString(f.name + " " + m.dir.String() + " ")
	writeNeg(b, m.neg)
	b.WriteString("@" + m.set)
}

func (m addrInSet) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs, loadAddr(f, m.dir, 1, uint32(f.addrLn)),
		&expr.Lookup{SourceRegister: 1, SetName: m.set, Invert: m.neg})
}

// fibLocal is "fib saddr type local" or "fib daddr type local".
type fibLocal struct{ dir addrDir }

func (m fibLocal) render(_ *family, b *strings.Builder) {
	b.WriteString("fib " + m.dir.String() + " type local")
}

func (m fibLocal) compile(_ *family, c *compiled) {
	const rtnLocal = 2 // RTN_LOCAL
	c.exprs = append(c.exprs,
		&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagSADDR: m.dir == saddr, FlagDADDR: m.dir == daddr},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(rtnLocal)},
	)
}

// iifname is `iifname "cbr0"` or, with a trailing "*", a prefix match.
type iifname struct {
	name string
	neg  bool
}

func (m iifname) render(_ *family, b *strings.Builder) {
	b.WriteString("iifname ")
	writeNeg(b, m.neg)
	b.WriteString(strconv.Quote(m.name))
}

func (m iifname) compile(_ *family, c *compiled) {
	var data []byte
	if prefix, ok := strings.CutSuffix(m.name, "*"); ok {
		data = []byte(prefix)
	} else {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, m.name)
	}
	c.exprs = append(c.exprs,
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: cmpOp(m.neg), Register: 1, Data: data})
}

// l4proto is "meta l4proto tcp".
type l4proto struct{ proto byte }

func (m l4proto) render(_ *family, b *strings.Builder) {
	b.WriteString("meta l4proto " + protoName(m.proto))
}

func (m l4proto) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, loadL4Proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.proto}})
}

// markSetOr is "mark set mark or M": ask for masquerading.
type markSetOr struct{ mark uint32 }

func (m markSetOr) render(_ *family, b *strings.Builder) {
	b.WriteString("mark set mark or " + markString(m.mark))
}

func (m markSetOr) compile(_ *family, c *compiled) { compileMarkSet(c, ^m.mark, m.mark) }

// markSetXor is "mark set mark xor M": clear the masquerade bit we know is set.
type markSetXor struct{ mark uint32 }

func (m markSetXor) render(_ *family, b *strings.Builder) {
	b.WriteString("mark set mark xor " + markString(m.mark))
}

func (m markSetXor) compile(_ *family, c *compiled) { compileMarkSet(c, 0xffffffff, m.mark) }

// compileMarkSet sets the packet mark to (mark & mask) ^ xor, which is how nft writes both
// "mark set mark or M" (mask ^M, xor M) and "mark set mark xor M" (mask all ones, xor M).
func compileMarkSet(c *compiled, mask, xor uint32) {
	c.exprs = append(c.exprs,
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

// markAndNonZero is "mark and M != 0".
type markAndNonZero struct{ mark uint32 }

func (m markAndNonZero) render(_ *family, b *strings.Builder) {
	b.WriteString("mark and " + markString(m.mark) + " != 0")
}

func (m markAndNonZero) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs,
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(m.mark), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}})
}

// masqueradeFullyRandom is "masquerade fully-random".
type masqueradeFullyRandom struct{}

func (masqueradeFullyRandom) render(_ *family, b *strings.Builder) {
	b.WriteString("masquerade fully-random")
}

func (masqueradeFullyRandom) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, &expr.Masq{FullyRandom: true})
}

// addrProtoPortLookup is "ip daddr . meta l4proto . th dport vmap @map" (vmap) or
// "ip daddr . meta l4proto . th dport @set".
type addrProtoPortLookup struct {
	set  string
	vmap bool
}

func (m addrProtoPortLookup) render(f *family, b *strings.Builder) {
	b.WriteString(f.name + " daddr . meta l4proto . th dport " + lookupOp(m.vmap) + m.set)
}

func (m addrProtoPortLookup) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs,
		loadAddr(f, daddr, 1, uint32(f.addrLn)),
		loadL4Proto(f.regProtoAfterAddr),
		loadDport(f.regPortAfterAddr),
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: m.vmap, SetName: m.set})
}

// protoPortLookup is "meta l4proto . th dport vmap @map" (vmap) or "meta l4proto . th
// dport @set".
type protoPortLookup struct {
	set  string
	vmap bool
}

func (m protoPortLookup) render(_ *family, b *strings.Builder) {
	b.WriteString("meta l4proto . th dport " + lookupOp(m.vmap) + m.set)
}

func (m protoPortLookup) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, loadL4Proto(1), loadDport(9),
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: m.vmap, SetName: m.set})
}

func lookupOp(vmap bool) string {
	if vmap {
		return "vmap @"
	}
	return "@"
}

// hairpinMatch is "ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections".
type hairpinMatch struct{}

func (hairpinMatch) render(f *family, b *strings.Builder) {
	b.WriteString(f.name + " saddr . " + f.name + " daddr . meta l4proto . th dport @" + hairpinConnectionsSet)
}

func (hairpinMatch) compile(f *family, c *compiled) {
	n := uint32(f.addrLn)
	c.exprs = append(c.exprs,
		loadAddr(f, saddr, 1, n), loadAddr(f, daddr, f.regHairpinDaddr, n),
		loadL4Proto(f.regHairpinProto), loadDport(f.regHairpinPort),
		&expr.Lookup{SourceRegister: 1, SetName: hairpinConnectionsSet})
}

// verdictTerm is "jump X", "goto X", "drop", "accept" or "return".
type verdictTerm struct {
	kind  expr.VerdictKind
	chain string
}

func jumpTo(chain string) verdictTerm { return verdictTerm{kind: expr.VerdictJump, chain: chain} }
func gotoChain(chain string) verdictTerm {
	return verdictTerm{kind: expr.VerdictGoto, chain: chain}
}

var dropVerdict = verdictTerm{kind: expr.VerdictDrop}

func (v verdictTerm) render(_ *family, b *strings.Builder) {
	b.WriteString(verdictString(v.kind, v.chain))
}

func (v verdictTerm) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, &expr.Verdict{Kind: v.kind, Chain: v.chain})
}

func verdictString(kind expr.VerdictKind, chain string) string {
	switch kind {
	case expr.VerdictJump:
		return "jump " + chain
	case expr.VerdictGoto:
		return "goto " + chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictReturn:
		return "return"
	}
	return "verdict(" + strconv.Itoa(int(kind)) + ")"
}

// rejectTerm is nft's default "reject".
type rejectTerm struct{}

func (rejectTerm) render(_ *family, b *strings.Builder) { b.WriteString("reject") }
func (rejectTerm) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.rejectCode})
}

// tcpResetTerm is "reject with tcp reset"; the rule must match TCP first (l4proto).
type tcpResetTerm struct{}

func (tcpResetTerm) render(_ *family, b *strings.Builder) { b.WriteString("reject with tcp reset") }
func (tcpResetTerm) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
}

// rejectRules are the rules refusing what the rules before them matched (match): TCP
// with a reset, everything else with nft's default ICMP port unreachable. Upstream
// answers TCP with ICMP too; Linux TCP takes an ICMPv6 error during connect as a soft
// error when the socket is busy, and ICMP errors are rate-limited per peer, so an IPv6
// (and sometimes an IPv4) client waited for retransmits instead of being refused.
func rejectRules(comment string, match ...term) []rule {
	tcp := append(append([]term{}, match...), l4proto{unix.IPPROTO_TCP}, tcpResetTerm{})
	other := append(append([]term{}, match...), rejectTerm{})
	return []rule{{terms: tcp, comment: comment}, {terms: other, comment: comment}}
}

// dnatTo is "dnat to 10.0.0.1:80" (the caller puts "meta l4proto P" before it).
type dnatTo struct{ to netip.AddrPort }

func (d dnatTo) render(_ *family, b *strings.Builder) { b.WriteString("dnat to " + d.to.String()) }

func (d dnatTo) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs,
		&expr.Immediate{Register: 1, Data: f.addrBytes(d.to.Addr())},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(d.to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.natFamily(),
			RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true})
}

// dnatMap is "dnat ip addr . port to numgen random mod 1048576 offset B map
// @endpoints-XX": a random number in the chain's block B..B+endpointBlockSize-1 of the
// interval map, whose ranges split the block evenly among the chain's endpoints (see
// endpointRules). The rule is the same whatever the number of endpoints.
type dnatMap struct {
	base uint32 // set by the planner when it has allocated the block
	set  string
}

func (d *dnatMap) render(f *family, b *strings.Builder) {
	b.WriteString("dnat " + f.name + " addr . port to numgen random mod " + strconv.Itoa(endpointBlockSize) +
		" offset " + strconv.FormatUint(uint64(d.base), 10) + " map @" + d.set)
}

func (d *dnatMap) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs,
		&expr.Numgen{Register: 1, Modulus: endpointBlockSize, Type: unix.NFT_NG_RANDOM, Offset: d.base},
		// Interval keys compare as big-endian bytes; numgen leaves a host-order number
		// (nft adds the same conversion).
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: d.set},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.natFamily(),
			RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: f.regMapPort, RegProtoMax: f.regMapPort, Specified: true})
}

// endpointBlockSize is the number of numgen values each chain's block of an endpoint map
// spans. With N endpoints, endpoint i gets the values [i*S/N, (i+1)*S/N): the shares
// differ by at most one value in 2^20, so the spread is even to within N/2^20 (0.001 %
// for 10 endpoints). A map holds 4 096 blocks (the key is 32 bits); there are 256 maps.
const endpointBlockSize = 1 << 20

// Keys of endpoint map elements. The maps are interval maps, and the kernel keeps a
// range as two elements: its first value (with the endpoint) and an "interval end" at
// the value after its last. The planner keeps them as one elemDef whose key is both
// bounds (8 bytes: rangeKey); a lone start (4 bytes) or lone end (endKey, 5 bytes) only
// appears when a full resync finds half a range in the kernel.

// rangeKey is the key of the range [lo, hi) of an endpoint map.
func rangeKey(lo, hi uint32) string {
	var b [8]byte
	binary.BigEndian.PutUint32(b[:], lo)
	binary.BigEndian.PutUint32(b[4:], hi)
	return string(b[:])
}

// startKey is the key of the element starting a range at v (big-endian, as the rule's
// byteorder conversion leaves the number).
func startKey(v uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return string(b[:])
}

// endKey is how the planner names the interval end element at v.
func endKey(v uint32) string { return startKey(v) + "e" }

// blockRange returns the bounds of endpoint i's range when n endpoints share the block at
// base.
func blockRange(base uint32, i, n int) (lo, hi uint32) {
	lo = base + uint32(uint64(endpointBlockSize)*uint64(i)/uint64(n))
	hi = base + uint32(uint64(endpointBlockSize)*uint64(i+1)/uint64(n))
	return lo, hi
}

// endpointValue is the value of an endpoint map element: address . port, each part
// padded to four bytes, behind the "=" that marks raw data rather than a verdict.
func endpointValue(f *family, ap netip.AddrPort) string {
	b := make([]byte, 1, 1+f.addrLn+4)
	b[0] = '='
	b = append(b, f.addrBytes(ap.Addr())...)
	b = append(b, byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
	return string(b)
}

// numgenVmap is "numgen random mod N vmap { 0 : goto A, ... }", used with session
// affinity where each endpoint has a chain of its own.
type numgenVmap struct{ chains []string }

func (v numgenVmap) render(_ *family, b *strings.Builder) {
	b.WriteString("numgen random mod " + itoa(len(v.chains)) + " vmap { ")
	for i, ch := range v.chains {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(itoa(i) + " : goto " + ch)
	}
	b.WriteString(" }")
}

func (v numgenVmap) compile(f *family, c *compiled) {
	c.anon = v.anon(f)
	c.exprs = append(c.exprs,
		&expr.Numgen{Register: 1, Modulus: uint32(len(v.chains)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: true})
}

func (v numgenVmap) anon(_ *family) *anonSet {
	set := &anonSet{
		flags:   unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT | unix.NFT_SET_MAP,
		keyType: typeInteger, keyLen: 4, dataType: dataTypeVerdict,
	}
	for i, ch := range v.chains {
		set.elems = append(set.elems, anonElem{key: binaryutil.NativeEndian.PutUint32(uint32(i)), verdict: "goto " + ch})
	}
	return set
}

// numgenIsZero is "numgen random mod N 0": true once in N. The rules of a cascade
// "numgen random mod (N-i) 0 dnat to endpoint i" pick each of N endpoints with
// probability 1/N, like iptables' statistic match, without a map: see endpointRules.
type numgenIsZero struct{ mod int }

func (n numgenIsZero) render(_ *family, b *strings.Builder) {
	b.WriteString("numgen random mod " + itoa(n.mod) + " 0")
}

func (n numgenIsZero) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs,
		&expr.Numgen{Register: 1, Modulus: uint32(n.mod), Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}})
}

// updateSaddr is "update @set { ip saddr }": refresh the client's affinity entry.
type updateSaddr struct{ set string }

func (u updateSaddr) render(f *family, b *strings.Builder) {
	b.WriteString("update @" + u.set + " { " + f.name + " saddr }")
}

func (u updateSaddr) compile(f *family, c *compiled) {
	c.exprs = append(c.exprs, loadAddr(f, saddr, 1, uint32(f.addrLn)),
		&expr.Dynset{SrcRegKey: 1, SetName: u.set, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// counterTerm counts the packets and bytes that reach it (a traffic counter, see
// buildServicePort). A counter read from the kernel is compared without its values
// (parseKernelRule zeroes them), so counting never makes a chain look changed.
type counterTerm struct{}

func (counterTerm) render(_ *family, b *strings.Builder) { b.WriteString("counter") }
func (counterTerm) compile(_ *family, c *compiled) {
	c.exprs = append(c.exprs, &expr.Counter{})
}

func itoa(i int) string { return strconv.Itoa(i) }

// Constant terms (see constantTerm).

func (ctStateNew) constKey() string            { return "ctstatenew" }
func (counterTerm) constKey() string           { return "counter" }
func (ctStatusDNAT) constKey() string          { return "ctstatusdnat" }
func (m l4proto) constKey() string             { return "l4proto/" + itoa(int(m.proto)) }
func (m markSetOr) constKey() string           { return "markor/" + markString(m.mark) }
func (m markSetXor) constKey() string          { return "markxor/" + markString(m.mark) }
func (m markAndNonZero) constKey() string      { return "markand/" + markString(m.mark) }
func (masqueradeFullyRandom) constKey() string { return "masq" }
func (m addrProtoPortLookup) constKey() string { return "app/" + lookupOp(m.vmap) + m.set }
func (m protoPortLookup) constKey() string     { return "pp/" + lookupOp(m.vmap) + m.set }
func (hairpinMatch) constKey() string          { return "hairpin" }
func (rejectTerm) constKey() string            { return "reject" }
func (tcpResetTerm) constKey() string          { return "tcpreset" }
func (m fibLocal) constKey() string            { return "fiblocal/" + m.dir.String() }
func (v numgenVmap) constKey() string          { return "numgenvmap/" + itoa(len(v.chains)) }
func (n numgenIsZero) constKey() string        { return "numgeniszero/" + itoa(n.mod) }
