package wire

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/dflow-dev/dflow/plugins/proto"

	"github.com/dflow-dev/dflow/items"
)

// TestSendItemChunks: items below, at and above ChunkSize, with empty
// arrays among their pieces, cross as chunks of at most ChunkSize bytes
// (the first giving the whole size, the last alone with more = false) and
// come back equal (package items tests the in-memory and the portable
// layouts).
func TestSendItemChunks(t *testing.T) {
	t.Parallel()
	hidden := func(n int) *items.HiddenStates {
		h := &items.HiddenStates{B: 1, T: 1, K: 1, D: n, Seq: 3, Hidden: make([]float32, n), Tokens: []int32{1}, Greedy: []int32{2}}
		for i := range h.Hidden {
			h.Hidden[i] = float32(i) - 0.5
		}
		return h
	}
	blob := func(n int) *items.Blob {
		b := &items.Blob{Replica: 1, Seq: 2, Data: make([]byte, n)}
		for i := range b.Data {
			b.Data[i] = byte(i * 7)
		}
		return b
	}
	all := []any{
		[]byte{},
		blob(0),
		blob(ChunkSize - 16), // exactly one chunk
		blob(ChunkSize - 15), // one byte over
		blob(3*ChunkSize + 5),
		&items.Batch{B: 0, T: 4, Seq: 1, Tokens: []int32{}},
		hidden(ChunkSize / 4), // the float32s alone fill a chunk
		&items.HiddenStates{B: 0, T: 0, K: 2, D: 2, Hidden: []float32{}, Tokens: []int32{}, Greedy: []int32{}},
	}
	for _, item := range all {
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
			t.Errorf("%T of %d bytes did not come back equal (%v)", item, len(want), err)
		}
	}
}

// TestAssemblerBounds: a single chunk is its own payload, and a first
// chunk claiming an absurd size does not make the receiver allocate it.
func TestAssemblerBounds(t *testing.T) {
	t.Parallel()
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

// BenchmarkCodec: a 16 MiB hidden-states item Encoded into chunks,
// reassembled and decoded, without gRPC: the codec's share of a plugin
// stage's cost per item.
func BenchmarkCodec(b *testing.B) {
	n := 16 << 20 / 4
	h := &items.HiddenStates{B: 8, T: 128, K: 1, D: n / (8 * 128), Hidden: make([]float32, n), Tokens: make([]int32, 8*128), Greedy: make([]int32, 8*128)}
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
		if err != nil || item.(*items.HiddenStates).D != h.D {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(size))
}
