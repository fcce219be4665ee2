package nlattr

import (
	"encoding/binary"
	"slices"
	"testing"
)

// attr encodes one attribute the way the kernel does: native-endian length and type, the
// payload, padding to 4 bytes.
func attr(typ uint16, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

type seen struct {
	typ   uint16
	value string
}

func walk(b []byte) []seen {
	var out []seen
	Walk(b, func(typ uint16, v []byte) { out = append(out, seen{typ, string(v)}) })
	return out
}

func TestWalkReadsEveryAttributeUntilTheDataEnds(t *testing.T) {
	const nested, netByteOrder = 1 << 15, 1 << 14
	tests := []struct {
		name string
		in   []byte
		want []seen
	}{
		{name: "nothing", in: nil, want: nil},
		{name: "padded payloads", in: slices.Concat(attr(1, []byte("a")), attr(2, []byte("bcdef")), attr(3, nil)),
			want: []seen{{1, "a"}, {2, "bcdef"}, {3, ""}}},
		{name: "flags stripped from the type", in: slices.Concat(attr(5|nested, []byte("n")), attr(6|netByteOrder, []byte("be"))),
			want: []seen{{5, "n"}, {6, "be"}}},
		{name: "the last attribute without its padding", in: attr(7, []byte("xyz"))[:7], want: []seen{{7, "xyz"}}},
		{name: "a length beyond the data ends the walk", in: slices.Concat(attr(1, []byte("ok")), []byte{200, 0, 2, 0, 'x'}),
			want: []seen{{1, "ok"}}},
		{name: "a length under the header ends the walk", in: slices.Concat(attr(1, []byte("ok")), []byte{2, 0, 2, 0}, attr(3, nil)),
			want: []seen{{1, "ok"}}},
		{name: "trailing bytes shorter than a header are ignored", in: slices.Concat(attr(1, []byte("ok")), []byte{1, 2}),
			want: []seen{{1, "ok"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := walk(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIterReadsNestedAttributesAndValues(t *testing.T) {
	inner := slices.Concat(attr(1, binary.BigEndian.AppendUint32(nil, 7)), attr(2, binary.BigEndian.AppendUint64(nil, 1<<40)))
	msg := slices.Concat(attr(10, []byte("name\x00")), attr(11|1<<15, inner), attr(12, []byte{1}))
	var name string
	var u32 uint32
	var u64 uint64
	var short uint32 = 99
	for it := NewIter(msg); it.Next(); {
		switch it.Type() {
		case 10:
			name = String(it.Value())
		case 11:
			for in := NewIter(it.Value()); in.Next(); {
				switch in.Type() {
				case 1:
					u32 = Uint32(in.Value())
				case 2:
					u64 = Uint64(in.Value())
				}
			}
		case 12:
			short = Uint32(it.Value())
		}
	}
	if name != "name" || u32 != 7 || u64 != 1<<40 || short != 0 {
		t.Errorf("name %q, u32 %d, u64 %d, short %d", name, u32, u64, short)
	}
	if Uint64([]byte{1}) != 0 {
		t.Error("a short 64-bit payload is not 0")
	}
}
