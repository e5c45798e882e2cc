package wire

import (
	"testing"

	"github.com/dflow-dev/dflow/items"
)

// TestPoolAlloc: aligned regions, lowest first; freed ones coalesce, so
// the whole pool is one region again; a full pool says so instead of
// waiting.
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

// TestPoolRest: a region freed is not the next one taken while the pool
// has room elsewhere; once only resting regions are left, the one that
// has rested longest is taken, and nothing free is out of reach.
func TestPoolRest(t *testing.T) {
	t.Parallel()
	p := newPool(0, make([]byte, 1024), -1)
	a, _ := p.Alloc(256)
	b, _ := p.Alloc(256)
	p.Free(a.Off)
	c, _ := p.Alloc(256)
	if c.Off != 512 {
		t.Fatalf("the region after a's release at %d, want 512 (past b), not a's 0", c.Off)
	}
	p.Free(b.Off)
	d, ok := p.Alloc(256)
	if !ok || d.Off != 768 {
		t.Fatalf("the last quarter: %v %v", d, ok)
	}
	e, ok := p.Alloc(256) // only a and b left, resting: a, freed first
	if !ok || e.Off != 0 {
		t.Fatalf("with only resting regions left: %v %v, want a's offset 0", e, ok)
	}
	for _, h := range []*Held{c, d, e} {
		p.Free(h.Off)
	}
	if whole, ok := p.Alloc(1024); !ok || whole.Off != 0 {
		t.Errorf("the whole pool, every region resting: %v %v", whole, ok)
	}
}

// TestPoolFewRegions: a steady stream of items, a few in flight, cycles
// through a few regions of the pool (whose memory stays in the cache),
// not through the whole pool; and a region freed is taken again only
// after restMin allocations, or as many as restBytes of its size, so that
// an item kept a little past its lifetime is still caught.
func TestPoolFewRegions(t *testing.T) {
	t.Parallel()
	const inFlight = 3
	for _, size := range []int64{64 << 10, 1 << 20, 16 << 20} {
		p := newPool(0, make([]byte, DefaultPoolBytes), -1) // untouched: Alloc and Free only count
		rest := max(restMin, restBytes/size)
		var held []int64
		freedAt := map[int64]int{} // offset: allocations before its release
		used := map[int64]bool{}
		for i := range 2000 {
			if len(held) == inFlight {
				freedAt[held[0]] = i
				if err := p.Free(held[0]); err != nil {
					t.Fatal(err)
				}
				held = held[1:]
			}
			h, ok := p.Alloc(size)
			if !ok {
				t.Fatalf("%d B: item %d found no room", size, i)
			}
			if at, ok := freedAt[h.Off]; ok && i-at < int(rest) {
				t.Fatalf("%d B: item %d took the region at %d, freed %d allocations before, want %d at least", size, i, h.Off, i-at, rest)
			}
			held = append(held, h.Off)
			used[h.Off] = true
		}
		if want := inFlight + int(rest); len(used) > want {
			t.Errorf("%d B items, %d in flight: %d regions of the pool written (%d MiB), want %d at most", size, inFlight, len(used), int64(len(used))*size>>20, want)
		}
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
