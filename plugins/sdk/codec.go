package sdk

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
)

// Items cross the process boundary encoded by Go type. The wire names and
// layouts (all integers and floats little-endian) are:
//
//	bytes    []byte                 the bytes
//	blob     *synthetic.Blob        int64 replica, int64 seq, data
//	tokens   *text.Batch            int64 B, T, seq, then int32 tokens
//	hidden   *dflash.HiddenStates   int64 B, T, K, D, seq, then float32
//	                                hidden, int32 tokens, int32 greedy
//
// A plugin in another language reads and writes these layouts.

// Encode turns an item into its wire name and bytes.
func Encode(item any) (string, []byte, error) {
	switch v := item.(type) {
	case []byte:
		return "bytes", v, nil
	case *synthetic.Blob:
		b := make([]byte, 16+len(v.Data))
		binary.LittleEndian.PutUint64(b, uint64(v.Replica))
		binary.LittleEndian.PutUint64(b[8:], uint64(v.Seq))
		copy(b[16:], v.Data)
		return "blob", b, nil
	case *text.Batch:
		b := header(int64(v.B), int64(v.T), v.Seq)
		return "tokens", appendInt32s(b, v.Tokens), nil
	case *dflash.HiddenStates:
		b := header(int64(v.B), int64(v.T), int64(v.K), int64(v.D), v.Seq)
		b = appendFloat32s(b, v.Hidden)
		b = appendInt32s(b, v.Tokens)
		return "hidden", appendInt32s(b, v.Greedy), nil
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
		if !ok || h[0] < 0 || h[1] < 0 || int64(len(rest)) != 4*h[0]*(h[1]+1) {
			return bad("sizes do not match the header")
		}
		return &text.Batch{B: int(h[0]), T: int(h[1]), Seq: h[2], Tokens: readInt32s(rest)}, nil
	case "hidden":
		h, rest, ok := readHeader(b, 5)
		if !ok {
			return bad("shorter than its header")
		}
		n, kd := h[0]*h[1], h[2]*h[3]
		if h[0] < 0 || h[1] < 0 || kd < 0 || n > 1<<40 || int64(len(rest)) != 4*(n*kd+2*n) {
			return bad("sizes do not match the header")
		}
		return &dflash.HiddenStates{B: int(h[0]), T: int(h[1]), K: int(h[2]), D: int(h[3]), Seq: h[4],
			Hidden: readFloat32s(rest[:4*n*kd]), Tokens: readInt32s(rest[4*n*kd : 4*n*kd+4*n]), Greedy: readInt32s(rest[4*n*kd+4*n:])}, nil
	}
	return nil, fmt.Errorf("sdk: unknown item encoding %q", name)
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

func appendInt32s(b []byte, xs []int32) []byte {
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

func appendFloat32s(b []byte, xs []float32) []byte {
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func readInt32s(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func readFloat32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
