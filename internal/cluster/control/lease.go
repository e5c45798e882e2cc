package control

import (
	"sync/atomic"
	"time"
)

// Beat is how often a heartbeat goes, and a lease is checked.
const Beat = 250 * time.Millisecond

// pauseAfter is how late a lease check may come before the process
// making it counts itself paused: a host too loaded to schedule it, a
// long stop of the world. Checks go every Beat.
const pauseAfter = 4 * Beat

// Pauses tracks the pauses of a process judging a lease, seen by a
// goroutine that does nothing but tick. Beats that came while it was not
// running sit unread in its socket, and a judgment made on waking would
// count them missing: silence counts from the later of the last beat
// heard and the end of the last pause.
type Pauses struct {
	prev    time.Time    // the previous check (the ticking goroutine's)
	resumed atomic.Int64 // the end of the last pause seen, unix ns
}

// Check records a tick at now; one late by more than pauseAfter ends a
// pause.
func (p *Pauses) Check(now time.Time) {
	if !p.prev.IsZero() && now.Sub(p.prev) > pauseAfter {
		p.resumed.Store(now.UnixNano())
	}
	p.prev = now
}

// Since is when the silence after a beat heard at t counts from.
func (p *Pauses) Since(t time.Time) time.Time {
	if r := time.Unix(0, p.resumed.Load()); r.After(t) {
		return r
	}
	return t
}

// LeaseWatch judges a lease from the side that waits on it: silent past
// the lease (pauses aside), the other side is asked once more (probe)
// before it is counted gone.
type LeaseWatch struct {
	Lease time.Duration
	Heard func() time.Time // the last beat heard
	// Probe asks the other side directly and says whether it answered
	// (within a lease); nil counts silence alone
	Probe func() bool
	Clock func() time.Time
	Pauses
}

// Gone is one check: whether the other side is counted gone now.
func (w *LeaseWatch) Gone() bool {
	now := w.Clock()
	w.Check(now)
	if now.Sub(w.Since(w.Heard())) <= w.Lease {
		return false
	}
	answered := w.Probe != nil && w.Probe()
	w.prev = w.Clock() // the probe's wait is not a pause
	return !answered
}
