package engine

import (
	"sync/atomic"
	_ "unsafe" // for go:linkname
)

// Timing waits.
//
// Reading the system clock costs about 30ns (60ns through time.Now, which
// reads it twice), and a replica moving small items can wait, and wake,
// every few items: two reads per wait would then cost more than the whole
// rest of the runtime's per-item path. So a wait is timed exactly only
// where that is cheap next to the work: while the replica's items take
// 10µs or more (see itemClock), and while the item in hand is being timed
// for its service time. Other waits are timed against the run's coarse
// clock, an atomic the run's sampler advances every 10ms: a wait shorter
// than a tick counts as nothing or as a whole tick, as it happens to
// straddle a tick or not, so that the sum over many waits, which begin at
// random phases of the tick, is right on average (TestCoarseWaitsUnbiased checks
// it against exact timing). No timer of its own: every Go timer makes the
// scheduler read the clock at each goroutine switch.

// nanotime is the runtime's monotonic clock, in ns.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// coarseClock is a monotonic clock in ns, read with one atomic load; the
// run's sampler advances it every Options.SampleEvery (10ms).
type coarseClock struct {
	_   linePad
	now atomic.Int64
	_   linePad
}

// wait is a wait in progress: when it began, on which clock.
type wait struct {
	start int64
	exact bool
}

// beginWait marks the start of a wait that blocks; state is stateIdle or
// stateBlocked.
func (r *replica) beginWait(state int32) wait {
	w := wait{exact: r.coarse == nil || r.clock.timing.Load() || r.clock.every.Load() <= 1}
	if w.exact {
		w.start = nanotime()
	} else {
		w.start = r.coarse.now.Load()
	}
	r.waitStart.Store(w.start)
	r.state.Store(state)
	return w
}

// endWait charges the wait w to acc.
func (r *replica) endWait(w wait, acc *atomic.Int64) {
	if w.exact {
		acc.Add(nanotime() - w.start)
	} else {
		acc.Add(r.coarse.now.Load() - w.start)
	}
	r.state.Store(stateBusy)
}
