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

// waitTotal is a replica's total time in one kind of wait, idle or
// blocked, with the wait in progress folded into the same word, so that a
// wait costs one atomic add when it begins and one when it ends and
// monitoring still sees it as it happens. A wait that begins at start adds
// -(start+waitBias) and adds end+waitBias when it ends: between waits the
// word is the total of those done (>= 0); during one it is that total less
// start+waitBias, negative whatever the clock's origin. The bias, 2^60 ns
// (36 years), leaves room for a few waits at once (a node that uses a
// port and a group collective from two goroutines) and lets waitsAt count
// them.
type waitTotal struct {
	v atomic.Int64
}

const waitBias = 1 << 60

func (w *waitTotal) begin(start int64) { w.v.Add(-(start + waitBias)) }
func (w *waitTotal) end(end int64)     { w.v.Add(end + waitBias) }

// waitsAt reads a waitTotal's word v as of now (nanotime, read after v,
// so that every wait in v began before now): the total with the waits in
// progress counted up to now, and how many there are.
func waitsAt(v, now int64) (total int64, waiting int) {
	if v >= 0 {
		return v, 0
	}
	k := (-v + waitBias/2) / waitBias // each wait in progress took off about waitBias
	return max(v+k*(now+waitBias), 0), int(k)
}

// wait is a wait in progress: when it began, on which clock, and what it
// is charged to.
type wait struct {
	acc   *waitTotal
	site  *waitSite
	start int64
	exact bool
}

// beginWait marks the start of a wait that blocks, charged to acc (the
// replica's idle or blocked), on site: what the wait needs to end, for
// the deadlock detector (deadlock.go), with the replica's own context.
func (r *replica) beginWait(acc *waitTotal, site *waitSite) wait {
	return r.beginWaitOn(acc, site, true)
}

// beginWaitOn is beginWait with own false for a wait with a context
// other than the replica's: the replica's waitOn is then opaque. For a
// node that can say it is quiescent (nodes.Quiescer), the site also
// counts the wait in progress, which the detector reads then; other
// replicas skip the count (two atomic adds a blocking wait). Only
// blocking waits get here, so none of it costs the fast path.
func (r *replica) beginWaitOn(acc *waitTotal, site *waitSite, own bool) wait {
	if r.countSites && site.kind != waitOpaque {
		site.active.Add(1)
	}
	if own {
		r.waitOn.Store(site)
	} else {
		r.waitOn.Store(opaqueWait)
	}
	w := wait{acc: acc, site: site, exact: r.coarse == nil || r.clock.timing.Load() || r.clock.every.Load() <= 1}
	if w.exact {
		w.start = nanotime()
	} else {
		w.start = r.coarse.now.Load()
	}
	acc.begin(w.start)
	return w
}

// endWait ends the wait w.
func (r *replica) endWait(w wait) {
	if w.exact {
		w.acc.end(nanotime())
	} else {
		w.acc.end(r.coarse.now.Load())
	}
	if r.countSites && w.site.kind != waitOpaque {
		w.site.active.Add(-1)
	}
}
