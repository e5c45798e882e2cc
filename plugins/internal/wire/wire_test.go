package wire

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// TestBatcher: small items held and sent as one Batch, in order; a large
// one sends what is held first, then goes in chunks; with a receiver that
// does not take batches, every item goes alone.
func TestBatcher(t *testing.T) {
	t.Parallel()
	var msgs []*proto.Message
	b := Batcher{Send: func(m *proto.Message) error { msgs = append(msgs, m); return nil }, Batches: true}
	for i := range 3 {
		if err := b.Add("out", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(msgs) != 0 {
		t.Fatalf("%d messages before Flush", len(msgs))
	}
	big := bytes.Repeat([]byte{9}, ChunkSize+1)
	if err := b.Add("out", big); err != nil {
		t.Fatal(err)
	}
	if err := b.Add("out", []byte{3}); err != nil || b.Flush() != nil {
		t.Fatal(err)
	}
	// A Batch of three, the big item's two chunks, the last item alone.
	if len(msgs) != 4 || len(msgs[0].GetBatch().GetItems()) != 3 || !msgs[1].GetItem().GetMore() || msgs[2].GetItem() == nil || msgs[2].GetItem().GetMore() || msgs[3].GetItem() == nil {
		t.Fatalf("messages: %v", msgs)
	}
	for i, it := range msgs[0].GetBatch().GetItems() {
		if !bytes.Equal(it.Payload, []byte{byte(i)}) || it.More {
			t.Errorf("batched item %d: %v", i, it)
		}
	}
	if !bytes.Equal(msgs[3].GetItem().Payload, []byte{3}) {
		t.Errorf("last item: %v", msgs[3])
	}

	msgs = nil
	b = Batcher{Send: func(m *proto.Message) error { msgs = append(msgs, m); return nil }}
	for i := range 3 {
		b.Add("out", []byte{byte(i)})
	}
	if b.Flush(); len(msgs) != 3 || msgs[0].GetItem() == nil {
		t.Errorf("without batches: %v", msgs)
	}
}

// TestWireTypesMatchTheCodec: each port type of graph.WireTypes is the Go
// type the codec encodes under its wire name, and back; the built-in
// source's items are of the Go type of the port type it names.
func TestWireTypesMatchTheCodec(t *testing.T) {
	t.Parallel()
	samples := map[string]any{
		"bytes":         []byte("x"),
		"blob":          &synthetic.Blob{Data: []byte("x")},
		"tokens":        &text.Batch{B: 1, T: 1, Tokens: []int32{1, 2}},
		"hidden_states": &dflash.HiddenStates{B: 1, T: 1, K: 1, D: 1, Hidden: []float32{1}, Tokens: []int32{1}, Greedy: []int32{1}},
	}
	for _, w := range graph.WireTypes {
		item, ok := samples[w.Name]
		if !ok {
			t.Errorf("no sample of %s", w.Name)
			continue
		}
		if got := strings.Replace(fmt.Sprintf("%T", item), "[]uint8", "[]byte", 1); got != w.Go {
			t.Errorf("%s: documented as %s, the sample is %s", w.Name, w.Go, got)
		}
		name, b, err := Encode(item)
		if err != nil || name != w.Wire || WireName(item) != w.Wire {
			t.Errorf("%s: encodes as %q (%v), WireName %q; want %q", w.Name, name, err, WireName(item), w.Wire)
			continue
		}
		back, err := Decode(name, b)
		if err != nil || fmt.Sprintf("%T", back) != fmt.Sprintf("%T", item) {
			t.Errorf("%s: decodes to %T (%v)", w.Name, back, err)
		}
		if CheckPortItem(w.Name, item) != nil || CheckPortItem(w.Name, struct{}{}) == nil {
			t.Errorf("%s: CheckPortItem", w.Name)
		}
	}
	if w, ok := graph.LookupWireType("hidden_states(d=8,layers=0,1)"); !ok || w.Wire != "hidden" {
		t.Errorf("hidden_states(...) is %v, %v", w, ok)
	}
}
