package items

import (
	"encoding/binary"
	"math"
	"unsafe"
)

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
