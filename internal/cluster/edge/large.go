package edge

import (
	"context"
	"fmt"

	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/items"
	"github.com/nats-io/nats.go/jetstream"
)

// laterItem is an item whose bytes came back late (refetch), or the
// error that they did not.
type laterItem struct {
	m    jetstream.Msg
	data []byte
	r    ref
	err  error
}

// refetch fetches the bytes of m again in the background, from the
// holder a restart of its producer records (fetchAgain), and hands the
// item to Recv then. m stays held, and followed so that a redelivery of
// it is dropped, not acked.
func (q *Queue) refetch(ctx context.Context, m jetstream.Msg, r ref, id string, first error) {
	q.hmu.Lock()
	q.following[id] = true
	q.hmu.Unlock()
	q.refetching.Add(1)
	q.env.Go(func() {
		defer q.refetching.Add(-1)
		it := laterItem{m: m}
		var err error
		if it.data, it.r, err = q.fetchAgain(ctx, r, id); err != nil && ctx.Err() == nil {
			it.err = fmt.Errorf("%s: the bytes of item %s are held by worker %s (data plane %s), which did not give them: %w; and no replica of stage %q sent them again within 2 minutes",
				q.Name(), id, m.Headers().Get(hdrHolder), m.Headers().Get(dataplane.HdrRef), first, q.edge.From.Stage.Name)
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case q.later <- it:
		case <-ctx.Done():
		case <-q.env.Stop.Done():
		}
	})
}

// finish rebuilds m's item from its bytes and takes it (take).
func (q *Queue) finish(m jetstream.Msg, data []byte, r ref, onPlane bool) (engine.Delivery, error) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	item, err := items.Decode(m.Headers().Get(hdrWire), data)
	if err != nil {
		q.ack(id)
		return engine.Delivery{}, fmt.Errorf("%s: %w", q.Name(), err)
	}
	if b, ok := item.(*items.Blob); ok && b.ItemKey == "" {
		b.ItemKey = m.Headers().Get(hdrKey)
	}
	q.hmu.Lock()
	q.seen.add(id)
	q.hmu.Unlock()
	var held *ref
	if onPlane {
		held = &r
	}
	d := engine.Delivery{Item: item}
	d.Receipt = q.take(id, held)
	return d, nil
}

// aheadMax is how many large items' bytes a queue's consumer side fetches
// before their turn: the transfer of the next overlaps the wait for its
// message and the work on the one before.
const aheadMax = 2

// fetching is a fetch of an item's bytes begun before its turn.
type fetching struct {
	done chan struct{}
	data []byte
	err  error
}

// fetchAhead begins fetching the bytes of m's item when they are on a
// data plane, waiting while aheadMax fetches are under way or unclaimed
// (the pull loop then waits too: a bounded pipeline).
func (q *Queue) fetchAhead(m jetstream.Msg) {
	r, ok := dataplane.RefOf(m.Headers())
	if !ok {
		return
	}
	id := m.Headers().Get(jetstream.MsgIDHeader)
	select {
	case q.aheadSlots <- struct{}{}:
	case <-q.env.Stop.Done():
		return
	}
	f := &fetching{done: make(chan struct{})}
	q.hmu.Lock()
	if q.ahead[id] != nil {
		q.hmu.Unlock()
		<-q.aheadSlots
		return
	}
	q.ahead[id] = f
	q.hmu.Unlock()
	q.env.Go(func() {
		defer close(f.done)
		ctx, cancel := context.WithCancel(q.env.Share.RunCtx())
		defer cancel()
		defer context.AfterFunc(q.env.Stop, cancel)()
		f.data, f.err = q.env.DP.Fetch(ctx, r, id)
	})
}

// claim takes id's fetch begun ahead, if any, freeing its slot.
func (q *Queue) claim(id string) *fetching {
	q.hmu.Lock()
	f := q.ahead[id]
	delete(q.ahead, id)
	q.hmu.Unlock()
	if f != nil {
		<-q.aheadSlots
	}
	return f
}

// bytesOf returns an item's bytes: fetched ahead, or now.
func (q *Queue) bytesOf(ctx context.Context, r ref, id string) ([]byte, error) {
	if f := q.claim(id); f != nil {
		select {
		case <-f.done:
			if f.err == nil {
				return f.data, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return q.env.DP.Fetch(ctx, r, id) // not fetched ahead, or that fetch failed: once more
}

// Release tells the holder of an item's bytes that its message is acked:
// it may drop them (off the caller's path).
func (q *Queue) Release(id string, r *ref) {
	if r == nil {
		return
	}
	q.env.Go(func() {
		q.env.DP.Release(q.env.Stop, *r, id)
	})
}
