package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// queue is one bounded queue of an edge. Its channel is closed by the last
// producer replica to finish (termination from topology); gone is closed
// when the last consumer replica has returned, so that producers blocked on
// a full queue fail instead of hanging.
type queue struct {
	edge  *edge
	index int
	ch    chan any
	// chain, when set, makes the queue a chain's: each item sent on it
	// goes boxed with a receipt derived from its sender's delivery in
	// hand (transport.go)
	chain Chain
	gone  chan struct{}
	// mu orders the close of ch with the wake tokens sent once the run is
	// cancelled (wake.go); closed is true once ch is closed.
	mu     sync.Mutex
	closed bool

	producersLeft atomic.Int32
	consumersLeft atomic.Int32
	consumersGone stopFlag // set as gone is closed
	// live[i] is true while producer replica producers[i] has not finished;
	// read by monitoring to say who holds the queue open.
	producers []int
	live      []atomic.Bool
	// consumerIdx are the consumer replicas, the graph's and a
	// rebalance's parked ones
	consumerIdx []int

	// capacity_bytes accounting; room is signalled when bytes are freed.
	capBytes int64
	bytes    atomic.Int64
	room     chan struct{}

	// the ports on the queue, whose counters make produced and consumed
	senders   []*outQueue
	receivers []*inQueue

	depthSum, samples atomic.Int64 // sampled depth, for the mean
	// sampledMax is the deepest a sample saw a queue carried by a
	// transport (whose producers cannot see its depth as they send)
	sampledMax atomic.Int64

	// t carries the queue when it is not in process (transport.go);
	// goneCtx is done once every consumer has gone, for its sends.
	t        Transport
	goneCtx  context.Context
	goneDone context.CancelFunc
	// noLocalConsumers: every consumer runs in another engine, so the
	// queue gets no pump (placement.go)
	noLocalConsumers bool
}

func newQueue(e *edge, q graph.Queue, capacity int, capBytes int64) *queue {
	qu := &queue{
		edge:        e,
		index:       q.Index,
		ch:          make(chan any, capacity),
		gone:        make(chan struct{}),
		producers:   append([]int(nil), q.Producers...),
		consumerIdx: append([]int(nil), q.Consumers...),
		live:        make([]atomic.Bool, len(q.Producers)),
		capBytes:    capBytes,
		room:        make(chan struct{}, 1),
	}
	qu.goneCtx, qu.goneDone = context.WithCancel(context.Background())
	qu.producersLeft.Store(int32(len(q.Producers)))
	qu.consumersLeft.Store(int32(len(q.Consumers)))
	for i := range qu.live {
		qu.live[i].Store(true)
	}
	return qu
}

func sizeOf(item any) int64 {
	if s, ok := item.(nodes.Sizer); ok {
		return s.SizeBytes()
	}
	return 0
}

// sendWait pushes an item for replica r, blocking while the queue is
// full. When ctx is the replica's own context, the one its Run was given,
// the wait is a plain channel send, released on cancellation by the run's
// wake-ups (wake.go).
func (q *queue) sendWait(ctx context.Context, r *replica, item any) error {
	if q.t != nil {
		return q.remoteSend(ctx, r, item)
	}
	if ctx == r.ctx {
		// Flags, not a select: a select on two channels locks both, and
		// gone is shared by every producer of the queue.
		if q.consumersGone.isSet() {
			return q.noConsumers()
		}
		if r.stopping() {
			return ctx.Err()
		}
		q.ch <- item
		return nil
	}
	select {
	case q.ch <- item:
		return nil
	case <-q.gone:
		return q.noConsumers()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryReserve takes n bytes of the capacity_bytes budget if they fit, or
// if the queue holds nothing (an item larger than the whole budget then
// passes alone instead of deadlocking).
func (q *queue) tryReserve(n int64) bool {
	for {
		cur := q.bytes.Load()
		if cur != 0 && cur+n > q.capBytes {
			return false
		}
		if q.bytes.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// release frees the bytes of an item taken off the queue.
func (q *queue) release(item any) {
	q.bytes.Add(-sizeOf(item))
	select {
	case q.room <- struct{}{}:
	default:
	}
}

// produced and consumed add up the counters of the ports on the queue.
func (q *queue) produced() int64 {
	var n int64
	for _, oq := range q.senders {
		n += oq.sent.load()
	}
	return n
}

// maxDepth is the deepest any producer saw the queue, right after a send.
func (q *queue) maxDepth() int64 {
	d := q.sampledMax.Load()
	for _, oq := range q.senders {
		d = max(d, oq.maxDepth.Load())
	}
	return d
}

func (q *queue) consumed() int64 {
	var n int64
	for _, iq := range q.receivers {
		n += iq.got.load()
	}
	return n
}

// isClosed reports whether a signal channel (one that is only ever
// closed) is closed, without taking its lock while it is open.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (q *queue) noConsumers() error {
	return fmt.Errorf("edge %q: %w: every replica of stage %q has returned",
		q.edge.g.Name, nodes.ErrNoConsumers, q.edge.g.To.Stage.Name)
}

// producerDone is called once per producer replica wired to the queue when
// that replica returns; the last one closes the queue.
func (q *queue) producerDone(replica int) {
	for i, p := range q.producers {
		if p == replica {
			q.live[i].Store(false)
		}
	}
	if q.producersLeft.Add(-1) == 0 {
		if q.t != nil {
			q.t.Close() // the pump closes the channel once it has drained
			return
		}
		q.mu.Lock()
		q.closed = true
		close(q.ch)
		q.mu.Unlock()
	}
}

// consumerDone is called once per consumer replica when it returns. The
// last one closes gone and reports whether the queue was left unfinished:
// producers still running, or items never read.
func (q *queue) consumerDone() (unfinished bool, unread int) {
	if q.consumersLeft.Add(-1) != 0 {
		return false, 0
	}
	q.consumersGone.set()
	close(q.gone)
	q.goneDone()
	if g, ok := q.t.(ConsumersGoner); ok {
		g.ConsumersGone()
	}
	unread = q.depth()
	if q.t != nil {
		unread = len(q.ch) // the item at hand: the transport's depth leaves it out
		if h, ok := q.t.(Holder); ok {
			unread += h.Held() // what it has taken for this engine's consumers
		}
	}
	return q.producersLeft.Load() > 0 || unread > 0, unread
}

// Open reports the producer replicas still holding the queue open.
func (q *queue) Open() []int {
	var open []int
	for i, p := range q.producers {
		if q.live[i].Load() {
			open = append(open, p)
		}
	}
	return open
}

func (q *queue) sample() {
	d := int64(q.depth())
	q.depthSum.Add(d)
	q.samples.Add(1)
	if q.t != nil && d > q.sampledMax.Load() {
		q.sampledMax.Store(d) // one sampler: no race to lose
	}
}
