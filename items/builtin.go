package items

import (
	"encoding/binary"
	"fmt"
	"reflect"
)

// Blob is the payload synthetic_source emits. Data is shared, read-only,
// by every item of a stage: it stands for a payload of that size without
// costing an allocation per item.
type Blob struct {
	Replica int   // the source replica that made it
	Seq     int64 // its sequence number within that replica
	Data    []byte
	// ItemKey is the key synthetic_source gives it (its keys config), ""
	// for none; it is not part of the wire encoding.
	ItemKey string
}

// SizeBytes implements nodes.Sizer.
func (b *Blob) SizeBytes() int64 { return int64(len(b.Data)) }

// Key implements nodes.Keyed: a key_hash edge routes the blob by it ("" is
// no key).
func (b *Blob) Key() string { return b.ItemKey }

// Batch is a batch of byte-token sequences: B rows of T+1 tokens each, so
// row[:T] is a model's input and row[1:] its next-token targets. A Batch
// is read-only once sent.
type Batch struct {
	Tokens []int32 // B*(T+1)
	B, T   int
	Seq    int64 // the batch's number in the reader's order
}

// SizeBytes implements nodes.Sizer.
func (b *Batch) SizeBytes() int64 { return int64(4 * len(b.Tokens)) }

// Inputs copies the model inputs [B*T] into dst.
func (b *Batch) Inputs(dst []int32) {
	for r := 0; r < b.B; r++ {
		copy(dst[r*b.T:(r+1)*b.T], b.Tokens[r*(b.T+1):])
	}
}

// Targets copies the next-token targets [B*T] into dst.
func (b *Batch) Targets(dst []int32) {
	for r := 0; r < b.B; r++ {
		copy(dst[r*b.T:(r+1)*b.T], b.Tokens[r*(b.T+1)+1:])
	}
}

// HiddenStates is one batch as a target model saw it. Read-only once
// sent.
type HiddenStates struct {
	B, T, K, D int
	// Hidden holds, for every position (b, t), the K tapped layers'
	// residual streams concatenated: [B*T, K*D].
	Hidden []float32
	// Tokens are the input bytes [B*T]; Greedy[i] is the target's argmax
	// next byte after position i [B*T].
	Tokens, Greedy []int32
	Seq            int64
}

// SizeBytes implements nodes.Sizer.
func (h *HiddenStates) SizeBytes() int64 {
	return int64(4 * (len(h.Hidden) + len(h.Tokens) + len(h.Greedy)))
}

// The built-in encodings; all integers and floats are little-endian:
//
//	wire    Go type         layout
//	bytes   []byte          the bytes
//	blob    *Blob           int64 replica, int64 seq, data
//	tokens  *Batch          int64 B, T, seq, then int32 tokens
//	hidden  *HiddenStates   int64 B, T, K, D, seq, then float32 hidden,
//	                        int32 tokens, int32 greedy
//
// A plugin in another language reads and writes these layouts.
func init() {
	Register(Codec{Wire: "bytes", Type: reflect.TypeFor[[]byte](),
		Encode: func(item any) [][]byte { return [][]byte{item.([]byte)} },
		Decode: func(b []byte) (any, error) { return b, nil }})
	Register(Codec{Wire: "blob", Type: reflect.TypeFor[*Blob](), Encode: encodeBlob, Decode: decodeBlob})
	Register(Codec{Wire: "tokens", Type: reflect.TypeFor[*Batch](), Encode: encodeBatch, Decode: decodeBatch})
	Register(Codec{Wire: "hidden", Type: reflect.TypeFor[*HiddenStates](), Encode: encodeHidden, Decode: decodeHidden})
}

func encodeBlob(item any) [][]byte {
	v := item.(*Blob)
	return [][]byte{header(int64(v.Replica), v.Seq), v.Data}
}

func decodeBlob(b []byte) (any, error) {
	if len(b) < 16 {
		return malformed("blob", b, "shorter than its header")
	}
	return &Blob{Replica: int(int64(binary.LittleEndian.Uint64(b))), Seq: int64(binary.LittleEndian.Uint64(b[8:])), Data: b[16:]}, nil
}

func encodeBatch(item any) [][]byte {
	v := item.(*Batch)
	return [][]byte{header(int64(v.B), int64(v.T), v.Seq), int32Bytes(v.Tokens)}
}

func decodeBatch(b []byte) (any, error) {
	h, rest, ok := readHeader(b, 3)
	if !ok {
		return malformed("tokens", b, "shorter than its header")
	}
	n, ok := elems(h[0], h[1], 1)
	if !ok || int64(len(rest)) != 4*n {
		return malformed("tokens", b, "sizes do not match the header")
	}
	return &Batch{B: int(h[0]), T: int(h[1]), Seq: h[2], Tokens: readInt32s(rest)}, nil
}

func encodeHidden(item any) [][]byte {
	v := item.(*HiddenStates)
	return [][]byte{header(int64(v.B), int64(v.T), int64(v.K), int64(v.D), v.Seq),
		float32Bytes(v.Hidden), int32Bytes(v.Tokens), int32Bytes(v.Greedy)}
}

func decodeHidden(b []byte) (any, error) {
	h, rest, ok := readHeader(b, 5)
	if !ok {
		return malformed("hidden", b, "shorter than its header")
	}
	n, ok1 := elems(h[0], h[1], 0)
	all, ok2 := elems(h[0], h[1], 0, h[2], h[3])
	if !ok1 || !ok2 || int64(len(rest)) != 4*(all+2*n) {
		return malformed("hidden", b, "sizes do not match the header")
	}
	return &HiddenStates{B: int(h[0]), T: int(h[1]), K: int(h[2]), D: int(h[3]), Seq: h[4],
		Hidden: readFloat32s(rest[:4*all]), Tokens: readInt32s(rest[4*all : 4*all+4*n]), Greedy: readInt32s(rest[4*all+4*n:])}, nil
}

func malformed(wire string, b []byte, what string) (any, error) {
	return nil, fmt.Errorf("items: malformed %s item (%d bytes): %s", wire, len(b), what)
}
