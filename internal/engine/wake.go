package engine

import (
	"sync/atomic"
	"time"
)

// Waking blocked replicas on cancellation.
//
// A replica that waits on a queue with the context its Run was given (the
// common case) waits in a plain channel operation, not in a select that
// also watches its context: under contention a select costs 30-50% more
// per item than the plain operation (it locks every channel it watches,
// twice), which alone would break the runtime's overhead budget. A plain
// operation cannot see the context, so once the run is cancelled (a
// failure, or an abort) the engine releases such waits itself, every
// wakePeriod until every replica has returned:
//
//   - a producer blocked on a full queue is released by taking items out
//     of the queue (the run is being torn down: what the queues hold is
//     lost either way, and the report says so in produced vs consumed);
//   - a consumer blocked on an empty queue is released by a wake token,
//     which Recv never hands to the node: it returns ctx.Err().
//
// Before it blocks, a wait checks its context, so a wait that starts after
// the cancellation does not block at all; one that began just before is
// released within wakePeriod. A drain (the first Ctrl-C) stops only the
// sources, and a source blocked on a full queue then completes its Send
// as the consumers make room: the item is delivered like any other.
const wakePeriod = time.Millisecond

// wakeToken is put in a queue to wake a consumer; it never reaches a node.
type wakeToken struct{}

var theWakeToken any = &wakeToken{}

func isWake(item any) bool {
	_, ok := item.(*wakeToken)
	return ok
}

// wake releases the replicas blocked on the run's queues, every wakePeriod
// until finished or quit is closed.
func (r *run) wake(finished, quit <-chan struct{}) {
	t := time.NewTicker(wakePeriod)
	defer t.Stop()
	for {
		for _, e := range r.edges {
			for _, q := range e.queues {
				q.wake()
			}
		}
		select {
		case <-finished:
			return
		case <-quit:
			return
		case <-t.C:
		}
	}
}

// wake releases the replicas blocked on q: it takes out up to a queue's
// worth of items, each letting one blocked producer complete, then offers
// a wake token to each consumer.
func (q *queue) wake() {
	for range cap(q.ch) {
		if !q.discard() {
			break
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return // every consumer is released by the close already
	}
	for range q.receivers {
		select {
		case q.ch <- theWakeToken:
		default:
			return // full: no consumer is blocked on it
		}
	}
}

// discard takes one item out of q if one is there.
func (q *queue) discard() bool {
	select {
	case _, ok := <-q.ch:
		return ok
	default:
		return false
	}
}

// stopFlag is set once and read before every wait, by every replica it
// concerns: on a cache line of its own.
type stopFlag struct {
	_ linePad
	v atomic.Bool
	_ linePad
}

func (f *stopFlag) set()        { f.v.Store(true) }
func (f *stopFlag) isSet() bool { return f.v.Load() }

// stopping reports whether the replica's context is done, testing its
// Done channel only once the run has set the replica's stop flag. The
// flag may come a moment after the context is done (the context's
// children are cancelled after it): a wait that starts then blocks and is
// released by the wake-ups, like one that started just before.
func (r *replica) stopping() bool {
	return r.stop != nil && r.stop.isSet() && isClosed(r.done)
}
