package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// tally is a count kept by the one goroutine using a port and read by
// monitoring. Readers see the count as last published: at every count
// while the replica's items take 10µs or more (an atomic store is then
// nothing next to the item), every publishEvery counts for faster ones,
// before every wait that blocks, and once Run has returned. So a replica
// in a wait, or one with slow items, shows exact counts; one streaming
// fast items lags by fewer than publishEvery (under a millisecond of its
// work); reports, taken when every replica has returned, are exact.
type tally struct {
	n   int64 // owned by the port's goroutine
	pub atomic.Int64
}

// linePad keeps what one replica's goroutine writes on every item off the
// cache lines of other replicas' (false sharing cost more than all the
// accounting together).
type linePad [64]byte

const publishEvery = 64 // a power of two

// add counts one; every is the replica's itemClock.every, 1 while its
// items are slow.
// It reports whether it published the count.
func (t *tally) add(every int32) bool {
	t.n++
	if every <= 1 || t.n&(publishEvery-1) == 0 {
		t.pub.Store(t.n)
		return true
	}
	return false
}

// flush publishes the count, if it has moved (a store costs a barrier;
// a load of its own cache line does not).
func (t *tally) flush() {
	if t.pub.Load() != t.n {
		t.pub.Store(t.n)
	}
}

func (t *tally) load() int64 { return t.pub.Load() }

// itemClock measures a replica's service time (the busy time between two
// Recv calls; for a source, between two Sends) on a sample of its items.
// Timing an item costs two clock reads, two lock round trips and a
// histogram update, 150-300ns: every item is timed while items take 10µs
// or more, and a random one in every n of faster ones, n = 30µs / the mean
// so far, keeping the cost under 1% (at most one in maxSampleEvery). The
// mean and quantiles are those of the sample.
type itemClock struct {
	mu      sync.Mutex // start and stop may come from two port goroutines
	timing  atomic.Bool
	begin   int64 // nanotime
	waited  int64 // the replica's idle+blocked when the item began
	every   atomic.Int32
	service histogram
}

const (
	timeEveryItemAbove = 10 * time.Microsecond
	sampleBudget       = 30 * time.Microsecond // of items' time per timed item
	maxSampleEvery     = 1024
)

// start begins timing the item just taken, unless one is being timed; it
// reports whether it did.
func (c *itemClock) start(r *replica) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timing.Load() {
		return false
	}
	c.begin, c.waited = r.waited()
	c.timing.Store(true)
	return true
}

// stop ends the timed item: its service time is the time since start less
// the replica's waits meanwhile.
func (c *itemClock) stop(r *replica) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.timing.Load() {
		return
	}
	now, waited := r.waited()
	d := time.Duration(max(now-c.begin-(waited-c.waited), 0))
	c.service.observe(d)
	c.every.Store(sampleEvery(c.service.mean()))
	c.timing.Store(false)
}

func sampleEvery(mean time.Duration) int32 {
	if mean >= timeEveryItemAbove {
		return 1
	}
	return int32(min(int64(sampleBudget/max(mean, 1)), maxSampleEvery))
}

// portClock is what a port's per-item path needs of its replica's
// itemClock, kept in the port: the fast path then reads no cache line but
// the port's and its queue's (a line read on every item that other
// goroutines' items also read is fetched across cores under contention:
// docs/performance.md, "What limits each figure").
type portClock struct {
	pick  sampler
	every int32 // the replica's itemClock.every as of this port's last pick
	// starts: this port's calls delimit its replica's items (every input
	// port; a source's output ports). solo: it is the only such port of
	// its replica, so the item in hand can only be timed if this port
	// started it, which timed says.
	starts, solo bool
	timed        bool
}

// inHand reports whether the item in hand is being timed, so that the
// call ending it must stop the clock.
func (pc *portClock) inHand(c *itemClock) bool {
	if pc.solo {
		return pc.timed
	}
	return c.timing.Load()
}

// stop ends the timing of the item in hand.
func (pc *portClock) stop(r *replica) {
	pc.timed = false
	r.clock.stop(r)
}

// picked starts timing the item the sampler just picked, and takes the
// replica's current rate. (Callers test pick.next themselves, so that the
// per-item test is inlined.)
func (pc *portClock) picked(r *replica) {
	pc.timed = r.clock.start(r)
	pc.every = r.clock.every.Load()
	pc.pick.reset(pc.every)
}

// sampler, one per port, picks which items to time: on average one in
// every n, at a random distance from the last so that a periodic workload
// cannot line up with it. Its zero value picks the first item.
type sampler struct {
	left int32
	rng  uint32
}

func (s *sampler) next() bool {
	s.left--
	return s.left <= 0
}

func (s *sampler) reset(every int32) {
	if every <= 1 {
		s.left = 1
		return
	}
	if s.rng == 0 {
		s.rng = 0x9e3779b9
	}
	s.rng ^= s.rng << 13 // xorshift32
	s.rng ^= s.rng >> 17
	s.rng ^= s.rng << 5
	s.left = 1 + int32(s.rng%uint32(2*every-1)) // mean every
}
