package wire

import (
	"testing"

	"github.com/dflow-dev/dflow/items"
)

// TestPoolAlloc: aligned regions, in turn; freed ones coalesce, so the
// whole pool is one region again; a full pool says so instead of waiting.
func TestPoolAlloc(t *testing.T) {
	t.Parallel()
	p := newPool(1, make([]byte, 1024), -1)
	a, _ := p.Alloc(100)
	b, _ := p.Alloc(64)
	c, _ := p.Alloc(1)
	if a.Off != 0 || b.Off != 128 || c.Off != 192 {
		t.Fatalf("offsets %d %d %d, want 0 128 192", a.Off, b.Off, c.Off)
	}
	if _, ok := p.Alloc(1024); ok {
		t.Fatal("a region larger than what is free")
	}
	for _, h := range []*Held{b, a, c} {
		if err := p.Free(h.Off); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Free(a.Off); err == nil {
		t.Error("a region freed twice")
	}
	if whole, ok := p.Alloc(1024); !ok || whole.Off != 0 || p.Live() != 1 {
		t.Errorf("after freeing all, the whole pool: %v %v", whole, ok)
	}
}

// TestPoolNextFit: a region freed is not the next one taken while the
// pool has room past the last region taken; the pool comes round to its
// start once the rest is taken, and to the free part below where it
// looks first, so nothing free is out of reach.
func TestPoolNextFit(t *testing.T) {
	t.Parallel()
	p := newPool(0, make([]byte, 1024), -1)
	a, _ := p.Alloc(256)
	b, _ := p.Alloc(256)
	p.Free(a.Off)
	c, _ := p.Alloc(256)
	if c.Off != 512 {
		t.Fatalf("the region after a's release at %d, want 512 (past b), not a's 0", c.Off)
	}
	d, ok := p.Alloc(256)
	if !ok || d.Off != 768 {
		t.Fatalf("the last quarter: %v %v", d, ok)
	}
	e, ok := p.Alloc(256) // the pool's end reached: round to its start
	if !ok || e.Off != 0 {
		t.Fatalf("coming round: %v %v, want offset 0", e, ok)
	}
	for _, h := range []*Held{b, c, d, e} {
		p.Free(h.Off)
	}
	// All free, one span, looked at from 256 first: a region that fits
	// only from the span's start is found there.
	if whole, ok := p.Alloc(1024); !ok || whole.Off != 0 {
		t.Errorf("the whole pool, looking from 256: %v %v", whole, ok)
	}
	p.Free(0)
	if f, ok := p.Alloc(64); !ok || f.Off != 0 { // next wrapped to 0
		t.Errorf("after the whole pool: %v %v, want offset 0", f, ok)
	}
	if g, ok := p.Alloc(64); !ok || g.Off != 64 {
		t.Errorf("then: %v %v, want offset 64", g, ok)
	}
}

// TestContiguous: an item decoded from a pool's bytes, sent on, is found
// in place (its header rebuilt equal to the bytes before its arrays); an
// item elsewhere, or one whose header changed, is not.
func TestContiguous(t *testing.T) {
	t.Parallel()
	p := newPool(0, make([]byte, 1<<20), -1)
	t.Cleanup(func() { mapped.Delete(p) })
	item := &items.HiddenStates{B: 1, T: 4, K: 2, D: 8, Seq: 3, Hidden: make([]float32, 64), Tokens: make([]int32, 4), Greedy: make([]int32, 4)}
	typ, pieces, _ := items.Encode(item)
	var size int64
	for _, piece := range pieces {
		size += int64(len(piece))
	}
	h, ok := p.Write(pieces, size, item, typ)
	if !ok {
		t.Fatal("no room")
	}
	view, err := Decode(typ, p.Bytes(h.Off, size))
	if err != nil {
		t.Fatal(err)
	}
	if !Shared(view) || Shared(item) {
		t.Errorf("Shared: view %v, heap item %v", Shared(view), Shared(item))
	}
	_, again, _ := items.Encode(view)
	if off, ok := p.Contiguous(again, size); !ok || off != h.Off {
		t.Errorf("the view sent on: %d %v, want %d", off, ok, h.Off)
	}
	if _, ok := p.Contiguous(pieces, size); ok {
		t.Error("a heap item found in the pool")
	}
	changed := *view.(*items.HiddenStates)
	changed.Seq = 4
	_, moved, _ := items.Encode(&changed)
	if _, ok := p.Contiguous(moved, size); ok {
		t.Error("an item with another header found in place")
	}
}
