package cluster

import (
	"sync/atomic"
	"time"
)

// pauseAfter is how late a lease check may come before the process
// making it counts itself paused: a host too loaded to schedule it, a
// long stop of the world. Checks go every hbEvery.
const pauseAfter = 4 * hbEvery

// pauses tracks the pauses of a process judging a lease, seen by a
// goroutine that does nothing but tick. Beats that came while it was not
// running sit unread in its socket, and a judgment made on waking would
// count them missing: silence counts from the later of the last beat
// heard and the end of the last pause.
type pauses struct {
	prev    time.Time    // the previous check (the ticking goroutine's)
	resumed atomic.Int64 // the end of the last pause seen, unix ns
}

// check records a tick at now; one late by more than pauseAfter ends a
// pause.
func (p *pauses) check(now time.Time) {
	if !p.prev.IsZero() && now.Sub(p.prev) > pauseAfter {
		p.resumed.Store(now.UnixNano())
	}
	p.prev = now
}

// since is when the silence after a beat heard at t counts from.
func (p *pauses) since(t time.Time) time.Time {
	if r := time.Unix(0, p.resumed.Load()); r.After(t) {
		return r
	}
	return t
}

// leaseWatch judges a lease from the side that waits on it: silent past
// the lease (pauses aside), the other side is asked once more (probe)
// before it is counted gone.
type leaseWatch struct {
	lease time.Duration
	heard func() time.Time // the last beat heard
	// probe asks the other side directly and says whether it answered
	// (within a lease); nil counts silence alone
	probe func() bool
	clock func() time.Time
	pauses
}

// gone is one check: whether the other side is counted gone now.
func (w *leaseWatch) gone() bool {
	now := w.clock()
	w.check(now)
	if now.Sub(w.since(w.heard())) <= w.lease {
		return false
	}
	answered := w.probe != nil && w.probe()
	w.prev = w.clock() // the probe's wait is not a pause
	return !answered
}
