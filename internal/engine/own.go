package engine

import (
	"sync"
	"time"
)

// ownTimes is a node's own account of where its replica's time goes, in
// place of what the runtime measures at the replica's ports: the plugin
// host's, whose plugin measures it (plugins/host). The host's ports wait
// for the plugin's credit and for its items, which says little of what
// the plugin's node does meanwhile: a plugin that computes while it holds
// credit for more input looked idle or blocked while it worked.
//
// With it, the replica's idle and blocked time are the node's, counted up
// to its latest account and from then on towards what it said it was
// doing then; busy is the rest of the replica's lifetime, as for any
// replica (the plugin's start included). Its service times are the
// node's. The deadlock detector still reads the ports' waits.
type ownTimes struct {
	mu            sync.Mutex
	at            time.Time // when the latest account came
	idle, blocked time.Duration
	state         int32 // at that time: stateBusy, stateIdle or stateBlocked
	service       histogram
}

// OwnTimes takes the node's own account of the replica's time from now
// on: its idle and blocked time so far, and whether it is waiting now,
// for an input item (idleNow) or to send (blockedNow); the time from now
// to the next call counts towards that wait, or towards busy. The plugin
// host calls it with what its plugin measured, through an interface of
// its own (the runtime's nodes.Replica is this replica); a node that
// never calls it is measured at its ports.
func (r *replica) OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool) {
	o := r.ownTimes()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.at = time.Now()
	o.idle, o.blocked = max(idle, 0), max(blocked, 0)
	switch {
	case blockedNow:
		o.state = stateBlocked
	case idleNow:
		o.state = stateIdle
	default:
		o.state = stateBusy
	}
}

// OwnService adds items' service times measured by the node itself to
// the replica's (which then shows only those): sum is their total, and
// counts says how many took about how long each.
func (r *replica) OwnService(sum time.Duration, counts map[time.Duration]int64) {
	o := r.ownTimes()
	for d, n := range counts {
		if n > 0 {
			o.service.count.Add(n)
			o.service.buckets[bucketOf(d)].Add(n)
		}
	}
	o.service.sum.Add(int64(max(sum, 0)))
}

// ownTimes is the replica's own account, made at the first call.
func (r *replica) ownTimes() *ownTimes {
	if o := r.own.Load(); o != nil {
		return o
	}
	r.own.CompareAndSwap(nil, &ownTimes{at: time.Now()})
	return r.own.Load()
}

// until is the node's idle and blocked time as of end: as of its latest
// account, and the time since counted towards its wait then, if any.
func (o *ownTimes) until(end time.Time) (idle, blocked time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	idle, blocked = o.idle, o.blocked
	since := max(end.Sub(o.at), 0)
	switch o.state {
	case stateIdle:
		idle += since
	case stateBlocked:
		blocked += since
	}
	return idle, blocked
}

// WaitIdle counts the time from now until end is called as the
// replica's idle: a wait of the runtime around its node that is none of
// the node's work (a cluster replica that has finished, waiting for its
// group's final save to settle its inputs). The deadlock detector takes
// it as a wait it cannot read, able to end, as it took the time before.
// The cluster's runtime calls it through an interface of its own (the
// runtime's nodes.Replica is this replica).
func (r *replica) WaitIdle() (end func()) {
	w := r.beginWaitOn(&r.idle, opaqueWait, false)
	return func() { r.endWait(w) }
}
