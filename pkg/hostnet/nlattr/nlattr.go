// Package nlattr walks the attributes of netlink messages (type-length-value records,
// each padded to 4 bytes, nested ones holding more of them): the one decoder of the
// conntrack reconciler and the backends that read nf_tables and ctnetlink answers
// themselves. Attribute types are returned without the NLA_F_NESTED and
// NLA_F_NET_BYTEORDER flags. A truncated or malformed record ends the walk: what the
// kernel sent before it is still read.
package nlattr

import "encoding/binary"

// typeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER from an attribute type.
const typeMask = 0x3fff

// Iter walks attributes one by one:
//
//	for it := nlattr.NewIter(b); it.Next(); {
//		switch it.Type() { ... it.Value() ... }
//	}
type Iter struct {
	b   []byte
	typ uint16
	val []byte
}

// NewIter returns an Iter over b, the attributes after a message's fixed header or the
// value of a nested attribute.
func NewIter(b []byte) Iter { return Iter{b: b} }

// Next moves to the next attribute and reports whether there is one.
func (it *Iter) Next() bool {
	if len(it.b) < 4 {
		return false
	}
	l := int(binary.NativeEndian.Uint16(it.b))
	if l < 4 || l > len(it.b) {
		it.b = nil
		return false
	}
	it.typ = binary.NativeEndian.Uint16(it.b[2:]) & typeMask
	it.val = it.b[4:l]
	it.b = it.b[min((l+3)&^3, len(it.b)):]
	return true
}

// Type is the current attribute's type.
func (it *Iter) Type() uint16 { return it.typ }

// Value is the current attribute's payload (without padding).
func (it *Iter) Value() []byte { return it.val }

// Walk calls fn with the type and payload of each attribute of b, in order.
func Walk(b []byte, fn func(typ uint16, value []byte)) {
	for it := NewIter(b); it.Next(); {
		fn(it.typ, it.val)
	}
}

// String reads a NUL-terminated string payload.
func String(v []byte) string {
	for len(v) > 0 && v[len(v)-1] == 0 {
		v = v[:len(v)-1]
	}
	return string(v)
}

// Uint32 reads a big-endian (network order) 32-bit payload; 0 when it is shorter.
func Uint32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}

// Uint64 reads a big-endian (network order) 64-bit payload; 0 when it is shorter.
func Uint64(v []byte) uint64 {
	if len(v) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}
