package sdk

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
)

// Items cross the process boundary encoded by Go type. Each port type of
// graph.WireTypes means one Go type and one of these encodings; the wire
// names and layouts (all integers and floats little-endian) are:
//
//	port type      wire    Go type                layout
//	bytes          bytes   []byte                 the bytes
//	blob           blob    *synthetic.Blob        int64 replica, int64 seq, data
//	tokens         tokens  *text.Batch            int64 B, T, seq, then int32 tokens
//	hidden_states  hidden  *dflash.HiddenStates   int64 B, T, K, D, seq, then float32
//	                                              hidden, int32 tokens, int32 greedy
//
// A plugin in another language reads and writes these layouts.

// WireName is the encoding an item crosses as ("bytes", "blob", "tokens",
// "hidden"), or "" for an item the codec cannot carry.
func WireName(item any) string {
	switch item.(type) {
	case []byte:
		return "bytes"
	case *synthetic.Blob:
		return "blob"
	case *text.Batch:
		return "tokens"
	case *dflash.HiddenStates:
		return "hidden"
	}
	return ""
}

// CheckPortItem reports an item that is not of the Go type its port's type
// means (graph.WireTypes); on a port of type any, or of a type that has no
// wire encoding, every item passes.
func CheckPortItem(portType string, item any) error {
	w, ok := graph.LookupWireType(portType)
	if !ok || WireName(item) == w.Wire {
		return nil
	}
	return fmt.Errorf("a %T item on a port of type %q, which carries %s", item, portType, w.Go)
}

// CheckPortWire is CheckPortItem for an encoded item, by its wire name.
func CheckPortWire(portType, wire string) error {
	w, ok := graph.LookupWireType(portType)
	if !ok || wire == w.Wire {
		return nil
	}
	return fmt.Errorf("a %s item on a port of type %q, which carries %s (%s on the wire)", wire, portType, w.Go, w.Wire)
}

// Encode turns an item into its wire name and bytes.
func Encode(item any) (string, []byte, error) {
	e, err := encodeItem(item)
	if err != nil {
		return "", nil, err
	}
	return e.typ, e.whole(), nil
}

// encode turns an item into its wire name and the pieces of its bytes, in
// order: a large array is a piece of its own, the array's own memory
// where the machine is little-endian like the wire, so that it is sent
// without being copied first.
func encode(item any) (string, [][]byte, error) {
	switch v := item.(type) {
	case []byte:
		return "bytes", [][]byte{v}, nil
	case *synthetic.Blob:
		return "blob", [][]byte{header(int64(v.Replica), v.Seq), v.Data}, nil
	case *text.Batch:
		return "tokens", [][]byte{header(int64(v.B), int64(v.T), v.Seq), int32Bytes(v.Tokens)}, nil
	case *dflash.HiddenStates:
		return "hidden", [][]byte{header(int64(v.B), int64(v.T), int64(v.K), int64(v.D), v.Seq),
			float32Bytes(v.Hidden), int32Bytes(v.Tokens), int32Bytes(v.Greedy)}, nil
	}
	return "", nil, fmt.Errorf("sdk: no wire encoding for %T", item)
}

// Decode rebuilds an item from its wire name and bytes.
func Decode(name string, b []byte) (any, error) {
	bad := func(what string) (any, error) {
		return nil, fmt.Errorf("sdk: malformed %s item (%d bytes): %s", name, len(b), what)
	}
	switch name {
	case "bytes":
		return b, nil
	case "blob":
		if len(b) < 16 {
			return bad("shorter than its header")
		}
		return &synthetic.Blob{Replica: int(int64(binary.LittleEndian.Uint64(b))), Seq: int64(binary.LittleEndian.Uint64(b[8:])), Data: b[16:]}, nil
	case "tokens":
		h, rest, ok := readHeader(b, 3)
		if !ok {
			return bad("shorter than its header")
		}
		n, ok := elems(h[0], h[1], 1)
		if !ok || int64(len(rest)) != 4*n {
			return bad("sizes do not match the header")
		}
		return &text.Batch{B: int(h[0]), T: int(h[1]), Seq: h[2], Tokens: readInt32s(rest)}, nil
	case "hidden":
		h, rest, ok := readHeader(b, 5)
		if !ok {
			return bad("shorter than its header")
		}
		n, ok1 := elems(h[0], h[1], 0)
		all, ok2 := elems(h[0], h[1], 0, h[2], h[3])
		if !ok1 || !ok2 || int64(len(rest)) != 4*(all+2*n) {
			return bad("sizes do not match the header")
		}
		return &dflash.HiddenStates{B: int(h[0]), T: int(h[1]), K: int(h[2]), D: int(h[3]), Seq: h[4],
			Hidden: readFloat32s(rest[:4*all]), Tokens: readInt32s(rest[4*all : 4*all+4*n]), Greedy: readInt32s(rest[4*all+4*n:])}, nil
	}
	return nil, fmt.Errorf("sdk: unknown item encoding %q", name)
}

// Limits on the sizes a header may give: any one dimension, and the
// elements of an array.
const (
	maxDim   = 1 << 31
	maxElems = 1 << 40
)

// elems is the number of elements of an array with the given dimensions,
// read from a header, and whether they are sane: each in [0, maxDim], the
// product at most maxElems (checked before it could overflow). plus is
// added to the second dimension: tokens hold T+1 per row.
func elems(b, t, plus int64, more ...int64) (int64, bool) {
	if t >= 0 {
		t += plus
	}
	p := int64(1)
	for _, d := range append([]int64{b, t}, more...) {
		if d < 0 || d > maxDim || d != 0 && p > maxElems/d {
			return 0, false
		}
		p *= d
	}
	return p, true
}

func header(vals ...int64) []byte {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

func readHeader(b []byte, n int) ([]int64, []byte, bool) {
	if len(b) < 8*n {
		return nil, nil, false
	}
	h := make([]int64, n)
	for i := range h {
		h[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return h, b[8*n:], true
}

// littleEndian: this machine lays out integers and floats as the wire
// does, so arrays cross as the bytes they occupy in memory, without a
// conversion loop or a copy.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// int32Bytes is xs as wire bytes: xs's own memory where the machine is
// little-endian, a converted copy elsewhere.
func int32Bytes(xs []int32) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(xs))), 4*len(xs))
	}
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

func float32Bytes(xs []float32) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(xs))), 4*len(xs))
	}
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// aligned4 reports whether b can be read in place as 4-byte values: the
// machine is little-endian and b starts on a 4-byte boundary (payloads
// are allocated whole, and every array in them starts at a multiple of 4).
func aligned4(b []byte) bool {
	return littleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0
}

// readInt32s reads b as int32s: in place where it can (the item then owns
// the received bytes, which nothing else holds), converted otherwise.
func readInt32s(b []byte) []int32 {
	if aligned4(b) {
		return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func readFloat32s(b []byte) []float32 {
	if aligned4(b) {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
