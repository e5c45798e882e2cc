package engine

import (
	"context"
	"fmt"
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
	gone  chan struct{}

	producersLeft atomic.Int32
	consumersLeft atomic.Int32
	// live[i] is true while producer replica producers[i] has not finished;
	// read by monitoring to say who holds the queue open.
	producers []int
	live      []atomic.Bool

	// capacity_bytes accounting; room is signalled when bytes are freed.
	capBytes int64
	bytes    atomic.Int64
	room     chan struct{}

	produced, consumed atomic.Int64
	maxDepth           atomic.Int64
	depthSum, samples  atomic.Int64 // sampled depth, for the mean
}

func newQueue(e *edge, q graph.Queue, capacity int, capBytes int64) *queue {
	qu := &queue{
		edge:      e,
		index:     q.Index,
		ch:        make(chan any, capacity),
		gone:      make(chan struct{}),
		producers: q.Producers,
		live:      make([]atomic.Bool, len(q.Producers)),
		capBytes:  capBytes,
		room:      make(chan struct{}, 1),
	}
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

// send pushes an item, blocking while the queue is full.
func (q *queue) send(ctx context.Context, item any) error {
	if q.capBytes > 0 {
		if err := q.reserve(ctx, sizeOf(item)); err != nil {
			return err
		}
	}
	select {
	case q.ch <- item:
	default:
		select {
		case q.ch <- item:
		case <-q.gone:
			return q.noConsumers()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	q.produced.Add(1)
	if d := int64(len(q.ch)); d > q.maxDepth.Load() {
		q.maxDepth.Store(d) // a lost race only under-reports by one sample
	}
	return nil
}

// reserve waits for n bytes of room. An item larger than the whole budget
// passes alone once the queue is empty, so it cannot deadlock.
func (q *queue) reserve(ctx context.Context, n int64) error {
	for {
		cur := q.bytes.Load()
		if cur == 0 || cur+n <= q.capBytes {
			if q.bytes.CompareAndSwap(cur, cur+n) {
				return nil
			}
			continue
		}
		select {
		case <-q.room:
		case <-q.gone:
			return q.noConsumers()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// received does the accounting for an item taken off the queue.
func (q *queue) received(item any) {
	q.consumed.Add(1)
	if q.capBytes > 0 {
		q.bytes.Add(-sizeOf(item))
		select {
		case q.room <- struct{}{}:
		default:
		}
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
		close(q.ch)
	}
}

// consumerDone is called once per consumer replica when it returns. The
// last one closes gone and reports whether the queue was left unfinished:
// producers still running, or items never read.
func (q *queue) consumerDone() (unfinished bool, unread int) {
	if q.consumersLeft.Add(-1) != 0 {
		return false, 0
	}
	close(q.gone)
	return q.producersLeft.Load() > 0 || len(q.ch) > 0, len(q.ch)
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
	q.depthSum.Add(int64(len(q.ch)))
	q.samples.Add(1)
}
