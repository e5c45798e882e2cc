package wire

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// Large items cross by reference between dflow and a plugin on the same
// host (Start.pools, DescribeResponse.shared_memory): dflow creates two
// memfd pools per replica, the plugin maps them through /proc/PID/fd, and
// an item of at least Threshold bytes is written once into a region of a
// pool and named by an Item.ref. Pool 0 holds what dflow sends (dflow
// allocates, the plugin maps it read-only), pool 1 what the plugin sends
// (the plugin allocates, dflow maps it read-only). The receiver of a ref
// releases it (a Release message) once its consumer is done with it; the
// region is then free to be reused. docs/plugin-protocol.md has the rules.

// Threshold is the smallest payload that goes by reference when pools are
// attached; smaller items go on the stream, in batches.
const Threshold = 64 << 10

// DefaultPoolBytes is the size of each of a replica's two pools: the shared
// memory its items by reference may occupy at most, each way. An item
// that does not fit (larger than the pool, or the pool full of items not
// yet released) goes on the stream as bytes instead, so a full pool slows
// items down but never stops them; the credit windows bound what is held
// either way. dflow may choose another size (host.Host.PoolBytes).
const DefaultPoolBytes int64 = 256 << 20

// SharedMemoryEnabled says whether this process offers (dflow) or accepts
// (a plugin) shared memory: on where the platform has it, unless
// DFLOW_PLUGIN_SHM=off.
func SharedMemoryEnabled() bool {
	return shmSupported && !strings.EqualFold(os.Getenv("DFLOW_PLUGIN_SHM"), "off")
}

// poolAlign aligns regions, so that the arrays of an item decoded in
// place are aligned.
const poolAlign = 64

// Pool is one shared-memory pool as mapped in this process. Its owner
// (the side that writes it) allocates regions with Alloc and frees them
// when the other side releases them; the other side only reads.
type Pool struct {
	Index int32  // 0: dflow's, 1: the plugin's
	mem   []byte // the mapping
	fd    int    // the memfd, on dflow's side until the plugin has attached; -1 otherwise

	mu           sync.Mutex
	free         []span          // free spans, sorted by offset, coalesced
	resting      []span          // regions freed, not yet free, oldest first
	restingBytes int64           // their total
	live         map[int64]*Held // allocated regions by offset
	touched      int64           // the end of the highest region taken yet
}

type span struct{ off, n int64 }

// Held is a region of a pool that is in use: allocated by its owner, or,
// on the receiving side, an item by reference that its consumer has not
// released yet.
type Held struct {
	Off, Len int64
	// Origin is the item the owner wrote into the region, kept so that
	// the region coming back unchanged (a node that passes its input on)
	// is that item again, without a copy; Wire is its encoding.
	Origin any
	Wire   string
	refs   int32 // holds on a received region (the node's, pending sends')
	given  bool  // a received region's item has been given to the node (Give)
}

func newPool(index int32, mem []byte, fd int) *Pool {
	p := &Pool{Index: index, mem: mem, fd: fd, live: map[int64]*Held{}}
	p.free = []span{{0, int64(len(mem))}}
	mapped.Store(p, true)
	return p
}

// mapped are the pools mapped in this process (Shared).
var mapped sync.Map

// Shared reports whether an item's bytes lie in shared memory: an item
// received by reference (a view of a pool), valid only as long as the
// lifetime rules say (Recv).
func Shared(item any) bool {
	_, pieces, err := encode(item)
	if err != nil {
		return false
	}
	shared := false
	mapped.Range(func(k, _ any) bool {
		for _, piece := range pieces {
			if len(piece) > 0 && k.(*Pool).holds(piece) {
				shared = true
			}
		}
		return !shared
	})
	return shared
}

func (p *Pool) holds(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.mem) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(p.mem)))
	a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a >= base && a < base+uintptr(len(p.mem))
}

// Size is the pool's size in bytes (0 once closed).
func (p *Pool) Size() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(len(p.mem))
}

// Bytes is the region's memory. The region must lie within the pool
// (Check) and the pool must be open: what uses the memory must be done
// with it before Pools.Close, which unmaps it (the SDK's session and
// dflow's replica wait for every goroutine that touches a pool).
func (p *Pool) Bytes(off, n int64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mem[off : off+n : off+n]
}

// A region freed rests before it is taken again: the restMin regions
// freed last, and more of them while they total at most restBytes, are
// left alone while the rest of the pool has room. Past that, Alloc takes
// the lowest free region that fits (first fit), so that a steady stream
// of items cycles through a few regions whose memory stays in the
// processor's cache. (Taking regions in turn through the whole pool, so
// that a freed one waited as long as the pool allowed, wrote every large
// item to memory that had long left the cache: TestPoolFewRegions.)
//
// How long a freed region rests is how long the reader can tell an item
// its node kept past its lifetime from a later one: a region of s bytes
// is taken again once r = max(restMin, restBytes/s) regions have been
// freed after it (2 for items of 8 MiB or more, 16 for 1 MiB, 256 for
// 64 KiB), or sooner when the pool has no other room, and as the lowest
// free region it is then likely the next one taken. The SDKs check what
// a node sends (only that: a read of a kept item's bytes is not checked,
// which would cost per byte, and reads a later item's once dflow has
// written one there): bytes that lie in no region the node holds fail
// the replica, and a region dflow took again for an item the node has
// not received yet is not one it holds (Give, Given). A late send goes
// out unnoticed, as the later item, only while the node holds the later
// item written in its region: for a node with one input, from its
// (r+1)th Recv after the kept item's at the earliest (its third, for
// items of 8 MiB or more), until its next Recv.
const (
	restMin   = 2
	restBytes = 16 << 20
)

// Alloc takes a region of n bytes, the lowest free one that fits; the
// regions resting since they were freed, oldest first, only when none
// does; false when none is free.
func (p *Pool) Alloc(n int64) (*Held, bool) {
	size := (max(n, 1) + poolAlign - 1) &^ (poolAlign - 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for i, s := range p.free {
			if s.n < size {
				continue
			}
			h := &Held{Off: s.off, Len: n}
			if s.n == size {
				p.free = append(p.free[:i], p.free[i+1:]...)
			} else {
				p.free[i] = span{s.off + size, s.n - size}
			}
			p.live[h.Off] = h
			p.touched = max(p.touched, h.Off+size)
			return h, true
		}
		if len(p.resting) == 0 {
			return nil, false
		}
		p.wake()
	}
}

// Free returns the region at off to the pool, to rest there a while; it
// fails for an offset that names no allocated region.
func (p *Pool) Free(off int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.live[off]
	if !ok {
		return fmt.Errorf("no region at offset %d of pool %d", off, p.Index)
	}
	delete(p.live, off)
	size := (max(h.Len, 1) + poolAlign - 1) &^ (poolAlign - 1)
	p.resting = append(p.resting, span{off, size})
	p.restingBytes += size
	for len(p.resting) > restMin && p.restingBytes > restBytes {
		p.wake()
	}
	return nil
}

// wake makes the region that has rested longest free.
func (p *Pool) wake() {
	s := p.resting[0]
	p.resting = p.resting[1:]
	p.restingBytes -= s.n
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].off > s.off })
	p.free = slices.Insert(p.free, i, s)
	// Coalesce with the neighbours.
	if i+1 < len(p.free) && p.free[i].off+p.free[i].n == p.free[i+1].off {
		p.free[i].n += p.free[i+1].n
		p.free = slices.Delete(p.free, i+1, i+2)
	}
	if i > 0 && p.free[i-1].off+p.free[i-1].n == p.free[i].off {
		p.free[i-1].n += p.free[i].n
		p.free = slices.Delete(p.free, i, i+1)
	}
}

// Touched is the end of the highest region taken since the pool was
// made: the part of the pool its items have been written to.
func (p *Pool) Touched() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.touched
}

// Live is the number of regions allocated.
func (p *Pool) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
}

// Track records a region received by reference (the receiving side's
// bookkeeping: one hold, the node's).
func (p *Pool) Track(off, n int64) *Held {
	h := &Held{Off: off, Len: n, refs: 1}
	p.mu.Lock()
	p.live[off] = h
	p.mu.Unlock()
	return h
}

// Containing is the live region that holds [off, off+n), if any.
func (p *Pool) Containing(off, n int64) *Held {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.live[off]; ok && n <= h.Len {
		return h
	}
	for _, h := range p.live {
		if h.Off <= off && off+n <= h.Off+h.Len {
			return h
		}
	}
	return nil
}

// Give records that a received region's item has been given to the node
// (its Recv returned it). Until then the node cannot have the region's
// bytes from this item: bytes of the region it sends are an item's it
// kept past its lifetime, whose region dflow has taken again (Given).
func (p *Pool) Give(h *Held) {
	p.mu.Lock()
	h.given = true
	p.mu.Unlock()
}

// Given reports whether a received region's item has been given to the
// node (Give).
func (p *Pool) Given(h *Held) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return h.given
}

// Hold adds a hold on a received region.
func (p *Pool) Hold(h *Held) {
	p.mu.Lock()
	h.refs++
	p.mu.Unlock()
}

// Drop drops a hold on a received region; it reports whether that was the
// last, when the region is released (and forgotten here).
func (p *Pool) Drop(h *Held) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h.refs--
	if h.refs > 0 {
		return false
	}
	delete(p.live, h.Off)
	return true
}

// Check says whether a ref's bytes lie within the pool.
func (p *Pool) Check(ref *proto.Ref) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil {
		return fmt.Errorf("a reference to pool %d, which is closed", p.Index)
	}
	if ref.Offset < 0 || ref.Length < 0 || ref.Offset > int64(len(p.mem))-ref.Length {
		return fmt.Errorf("a reference to bytes %d-%d of pool %d, which has %d", ref.Offset, ref.Offset+ref.Length, p.Index, len(p.mem))
	}
	return nil
}

// Contiguous reports whether an item's pieces already lie in the pool,
// in order and back to back (a node that sends on an item it received, or
// one built in a region it allocated), and where: then the item goes by
// reference with no copy. A small piece (a header) that is not in place
// counts when the bytes in place equal it.
func (p *Pool) Contiguous(pieces [][]byte, size int64) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.mem) == 0 || size == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(p.mem)))
	end := base + uintptr(len(p.mem))
	start := int64(-1)
	var pos int64
	for _, piece := range pieces {
		if len(piece) == 0 {
			continue
		}
		a := uintptr(unsafe.Pointer(unsafe.SliceData(piece)))
		if a >= base && a < end {
			start = int64(a-base) - pos
			break
		}
		pos += int64(len(piece))
	}
	if start < 0 || start > int64(len(p.mem))-size {
		return 0, false
	}
	pos = start
	for _, piece := range pieces {
		if len(piece) == 0 {
			continue
		}
		a := uintptr(unsafe.Pointer(unsafe.SliceData(piece)))
		if a != base+uintptr(pos) && (len(piece) > 4096 || !bytes.Equal(p.mem[pos:pos+int64(len(piece))], piece)) {
			return 0, false
		}
		pos += int64(len(piece))
	}
	return start, true
}

// Write copies an item's pieces into a region of n bytes allocated for
// them, recording the item it holds (origin, of encoding wire); false
// when the pool has no room.
func (p *Pool) Write(pieces [][]byte, n int64, origin any, wire string) (*Held, bool) {
	h, ok := p.Alloc(n)
	if !ok {
		return nil, false
	}
	p.mu.Lock()
	h.Origin, h.Wire = origin, wire
	dst := p.mem[h.Off:]
	p.mu.Unlock()
	for _, piece := range pieces {
		dst = dst[copy(dst, piece):]
	}
	return h, true
}

// Prepared is an item Encoded to be sent, by reference or as bytes.
type Prepared struct {
	enc Encoded
	ref *proto.Ref
}

// Prepare encodes an item and, when it is of at least threshold bytes and
// pool p has room, copies it into a region of p, to go by reference
// (p nil: as bytes). Batcher.AddPrepared sends it.
func Prepare(p *Pool, threshold int64, item any) (Prepared, error) {
	e, err := EncodeItem(item)
	if err != nil || p == nil || int64(e.Size) < threshold {
		return Prepared{enc: e}, err
	}
	h, ok := p.Write(e.Pieces, int64(e.Size), item, e.Type)
	if !ok {
		return Prepared{enc: e}, nil
	}
	return Prepared{enc: e, ref: &proto.Ref{Pool: p.Index, Offset: h.Off, Length: int64(e.Size)}}, nil
}

// AddPrepared sends a prepared item (see Add, AddRef).
func (b *Batcher) AddPrepared(port string, p Prepared) error {
	if p.ref != nil {
		return b.AddRef(port, p.enc.Type, p.ref)
	}
	return b.AddEncoded(port, p.enc)
}

// Pools are a replica's two pools.
type Pools struct {
	In, Out *Pool // 0: dflow's items, 1: the plugin's
	pid     int
}

// Pool is pool i (0 or 1), or nil.
func (ps *Pools) Pool(i int32) *Pool {
	switch i {
	case 0:
		return ps.In
	case 1:
		return ps.Out
	}
	return nil
}

// Proto describes the pools to the plugin (Start.pools).
func (ps *Pools) Proto() *proto.Pools {
	return &proto.Pools{Pid: int64(ps.pid), InFd: int32(ps.In.fd), InSize: ps.In.Size(),
		OutFd: int32(ps.Out.fd), OutSize: ps.Out.Size(), Threshold: Threshold}
}

// Closed reports whether Close has unmapped the pools.
func (ps *Pools) Closed() bool { return ps.In.Size() == 0 && ps.Out.Size() == 0 }

// Attached closes dflow's descriptors of the pools once the plugin has
// mapped them: from then on only the two mappings keep the memory, and it
// goes when both processes have let go of it.
func (ps *Pools) Attached() {
	for _, p := range []*Pool{ps.In, ps.Out} {
		if p.fd >= 0 {
			closeFd(p.fd)
			p.fd = -1
		}
	}
}

// Close unmaps the pools (and closes what descriptors are left). Nothing
// may use their memory after.
func (ps *Pools) Close() {
	ps.Attached()
	for _, p := range []*Pool{ps.In, ps.Out} {
		if p.mem != nil {
			mapped.Delete(p)
			p.mu.Lock()
			unmap(p.mem)
			p.mem = nil
			p.mu.Unlock()
		}
	}
}
