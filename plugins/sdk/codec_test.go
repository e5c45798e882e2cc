package sdk

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"testing"
	"unsafe"

	"github.com/dflow-dev/dflow/plugins/proto"

	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
)

// sampleItems has one item of every wire type.
var sampleItems = []any{
	[]byte("raw"),
	&synthetic.Blob{Replica: 3, Seq: 99, Data: []byte{1, 2, 3}},
	&text.Batch{B: 2, T: 2, Seq: 7, Tokens: []int32{1, 2, 3, 4, 5, 6}},
	&dflash.HiddenStates{B: 1, T: 2, K: 1, D: 2, Seq: 4, Hidden: []float32{1, -2, 3.5, 4}, Tokens: []int32{9, 8}, Greedy: []int32{7, 6}},
}

func TestCodecRoundTrip(t *testing.T) {
	for _, item := range sampleItems {
		name, b, err := Encode(item)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(name, b)
		if err != nil || !reflect.DeepEqual(back, item) {
			t.Errorf("%s: got %#v (%v), want %#v", name, back, err, item)
		}
	}
	if _, _, err := Encode(42); err == nil {
		t.Error("an int has no encoding")
	}
	for name, b := range map[string][]byte{"blob": {1}, "tokens": make([]byte, 30), "hidden": make([]byte, 8), "nope": nil} {
		if _, err := Decode(name, b); err == nil {
			t.Errorf("%s: malformed bytes decoded", name)
		}
	}
}

// TestWireLayout pins the documented byte layouts (docs/plugins.md) that
// plugins in other languages read and write.
func TestWireLayout(t *testing.T) {
	le := func(vals ...any) []byte {
		var b []byte
		for _, v := range vals {
			switch v := v.(type) {
			case int64:
				b = binary.LittleEndian.AppendUint64(b, uint64(v))
			case int32:
				b = binary.LittleEndian.AppendUint32(b, uint32(v))
			case float32:
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			case []byte:
				b = append(b, v...)
			}
		}
		return b
	}
	for _, tc := range []struct {
		item any
		typ  string
		want []byte
	}{
		{[]byte{7, 8}, "bytes", []byte{7, 8}},
		{&synthetic.Blob{Replica: 3, Seq: -2, Data: []byte{1, 2}}, "blob", le(int64(3), int64(-2), []byte{1, 2})},
		{&text.Batch{B: 1, T: 1, Seq: 5, Tokens: []int32{-1, 300}}, "tokens", le(int64(1), int64(1), int64(5), int32(-1), int32(300))},
		{&dflash.HiddenStates{B: 1, T: 1, K: 1, D: 2, Seq: 9, Hidden: []float32{1.5, -2}, Tokens: []int32{4}, Greedy: []int32{6}},
			"hidden", le(int64(1), int64(1), int64(1), int64(2), int64(9), float32(1.5), float32(-2), int32(4), int32(6))},
	} {
		for _, native := range []bool{true, false} {
			setLittleEndian(t, native && littleEndian)
			typ, b, err := Encode(tc.item)
			if err != nil || typ != tc.typ || !bytes.Equal(b, tc.want) {
				t.Errorf("native %v: Encode(%T) = %s % x, %v; want %s % x", native, tc.item, typ, b, err, tc.typ, tc.want)
			}
		}
	}
}

// setLittleEndian makes the codec take its in-memory path (v true, on a
// little-endian machine) or its portable one, for the rest of the test.
func setLittleEndian(t *testing.T, v bool) {
	old := littleEndian
	littleEndian = v
	t.Cleanup(func() { littleEndian = old })
}

// TestSendItemChunks: items below, at and above ChunkSize, with empty
// arrays among their pieces, cross as chunks of at most ChunkSize bytes
// (the first giving the whole size, the last alone with more = false) and
// come back equal, through the in-memory and the portable paths.
func TestSendItemChunks(t *testing.T) {
	hidden := func(n int) *dflash.HiddenStates {
		h := &dflash.HiddenStates{B: 1, T: 1, K: 1, D: n, Seq: 3, Hidden: make([]float32, n), Tokens: []int32{1}, Greedy: []int32{2}}
		for i := range h.Hidden {
			h.Hidden[i] = float32(i) - 0.5
		}
		return h
	}
	blob := func(n int) *synthetic.Blob {
		b := &synthetic.Blob{Replica: 1, Seq: 2, Data: make([]byte, n)}
		for i := range b.Data {
			b.Data[i] = byte(i * 7)
		}
		return b
	}
	items := []any{
		[]byte{},
		blob(0),
		blob(ChunkSize - 16), // exactly one chunk
		blob(ChunkSize - 15), // one byte over
		blob(3*ChunkSize + 5),
		&text.Batch{B: 0, T: 4, Seq: 1, Tokens: []int32{}},
		hidden(ChunkSize / 4), // the float32s alone fill a chunk
		&dflash.HiddenStates{B: 0, T: 0, K: 2, D: 2, Hidden: []float32{}, Tokens: []int32{}, Greedy: []int32{}},
	}
	for _, native := range []bool{true, false} {
		setLittleEndian(t, native && littleEndian)
		for _, item := range items {
			_, want, _ := Encode(item)
			var chunks []*proto.Item
			err := SendItem(func(m *proto.Message) error {
				chunks = append(chunks, m.GetItem())
				return nil
			}, "in", item)
			if err != nil {
				t.Fatal(err)
			}
			var a Assembler
			var got []byte
			for i, c := range chunks {
				if len(c.Payload) > ChunkSize || c.Port != "in" {
					t.Fatalf("chunk %d: %d bytes on port %q", i, len(c.Payload), c.Port)
				}
				if (i == 0) != (c.Size != 0 || len(want) == 0) || i == 0 && c.Size != int64(len(want)) {
					t.Errorf("chunk %d says size %d (item %d bytes)", i, c.Size, len(want))
				}
				b, whole := a.Add(c)
				if whole != (i == len(chunks)-1) || c.More == whole {
					t.Fatalf("chunk %d of %d: whole %v, more %v", i, len(chunks), whole, c.More)
				}
				got = b
			}
			if len(chunks) != max(1, (len(want)+ChunkSize-1)/ChunkSize) && len(want) <= ChunkSize {
				t.Errorf("%d bytes in %d chunks", len(want), len(chunks))
			}
			back, err := Decode(chunks[0].Type, got)
			if b, ok := item.([]byte); ok && len(b) == 0 {
				if g, ok := back.([]byte); ok && len(g) == 0 {
					back = b // the wire does not tell an empty payload from none
				}
			}
			if err != nil || !reflect.DeepEqual(back, item) {
				t.Errorf("native %v: %T of %d bytes did not come back equal (%v)", native, item, len(want), err)
			}
		}
	}
}

// TestDecodeInPlace: aligned arrays are read where they lie (the item
// owns the received bytes); misaligned ones are copied, and equal.
func TestDecodeInPlace(t *testing.T) {
	_, b, _ := Encode(&text.Batch{B: 1, T: 1, Seq: 1, Tokens: []int32{10, -20}})
	item, _ := Decode("tokens", b)
	tokens := item.(*text.Batch).Tokens
	if littleEndian && unsafe.Pointer(&tokens[0]) != unsafe.Pointer(&b[24]) {
		t.Error("aligned tokens were copied")
	}
	shifted := make([]byte, len(b)+1)[1:] // starts at an odd address
	copy(shifted, b)
	item, err := Decode("tokens", shifted)
	if err != nil || !reflect.DeepEqual(item.(*text.Batch).Tokens, []int32{10, -20}) {
		t.Fatalf("misaligned tokens: %v %v", item, err)
	}
}

// TestAssemblerBounds: a single chunk is its own payload, and a first
// chunk claiming an absurd size does not make the receiver allocate it.
func TestAssemblerBounds(t *testing.T) {
	var a Assembler
	p := []byte{1, 2, 3}
	if b, whole := a.Add(&proto.Item{Payload: p}); !whole || &b[0] != &p[0] {
		t.Error("a one-chunk item should be its payload")
	}
	if _, whole := a.Add(&proto.Item{Payload: p, More: true, Size: 1 << 62}); whole || cap(a.buf) > maxPrealloc {
		t.Errorf("first chunk of a huge item: whole %v, %d bytes allocated", whole, cap(a.buf))
	}
	if b, whole := a.Add(&proto.Item{Payload: []byte{4}}); !whole || !bytes.Equal(b, []byte{1, 2, 3, 4}) {
		t.Errorf("assembled %v", b)
	}
}

// BenchmarkCodec: a 16 MiB hidden-states item encoded into chunks,
// reassembled and decoded, without gRPC: the codec's share of a plugin
// stage's cost per item.
func BenchmarkCodec(b *testing.B) {
	n := 16 << 20 / 4
	h := &dflash.HiddenStates{B: 8, T: 128, K: 1, D: n / (8 * 128), Hidden: make([]float32, n), Tokens: make([]int32, 8*128), Greedy: make([]int32, 8*128)}
	var size int
	b.ResetTimer()
	for range b.N {
		var a Assembler
		var item any
		err := SendItem(func(m *proto.Message) error {
			c := m.GetItem()
			c.Payload = bytes.Clone(c.Payload) // what the wire does
			if p, whole := a.Add(c); whole {
				size = len(p)
				var err error
				item, err = Decode(c.Type, p)
				return err
			}
			return nil
		}, "in", h)
		if err != nil || item.(*dflash.HiddenStates).D != h.D {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(size))
}

// FuzzDecode: whatever bytes a plugin sends, Decode returns an error or an
// item that is consistent with itself (sizes that match its arrays, no
// negative dimension) and encodes back to the same bytes; it never panics.
func FuzzDecode(f *testing.F) {
	for _, item := range sampleItems {
		name, b, _ := Encode(item)
		f.Add(name, b)
	}
	// Headers whose sizes multiply out to the payload only by overflow, or
	// with negative dimensions that cancel out.
	f.Add("hidden", append(header(1, 1, -1, -4, 0), make([]byte, 24)...))
	f.Add("hidden", append(header(1, 1, 1<<62, 4, 0), make([]byte, 8)...))
	f.Add("tokens", append(header(1<<62, 3, 0), make([]byte, 0)...))
	f.Add("tokens", append(header(-1, -2, 0), make([]byte, 4)...))
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		item, err := Decode(name, bytes.Clone(b))
		if err != nil {
			return
		}
		switch v := item.(type) {
		case *text.Batch:
			if v.B < 0 || v.T < 0 || v.B > 1<<31 || v.T > 1<<31 || len(v.Tokens) != v.B*(v.T+1) {
				t.Fatalf("tokens B=%d T=%d with %d tokens", v.B, v.T, len(v.Tokens))
			}
		case *dflash.HiddenStates:
			big := func(d int) bool { return d < 0 || d > 1<<31 }
			if big(v.B) || big(v.T) || big(v.K) || big(v.D) || len(v.Hidden) != v.B*v.T*v.K*v.D || len(v.Tokens) != v.B*v.T || len(v.Greedy) != v.B*v.T {
				t.Fatalf("hidden B=%d T=%d K=%d D=%d with %d, %d, %d values", v.B, v.T, v.K, v.D, len(v.Hidden), len(v.Tokens), len(v.Greedy))
			}
		}
		name2, b2, err := Encode(item)
		if err != nil || name2 != name || !bytes.Equal(b2, b) {
			t.Fatalf("%s did not encode back to its bytes (%v)", name, err)
		}
	})
}
