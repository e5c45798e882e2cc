package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
)

// ref is where an item's bytes are held (the data plane's reference).
type ref = dataplane.Ref

// Stores and NoConsumers make a queue the data plane's Queue: what tells
// it, at a share's end, whether a held item may still be fetched.
func (q *Queue) Stores(ctx context.Context, seq uint64) bool { return q.stores(ctx, seq) }
func (q *Queue) NoConsumers(ctx context.Context) bool {
	return q.consumersGone(ctx, q.qi)
}

// A large item sent again after a loss.
//
// An item a restartable replica sent from an input lives on its holder's
// data plane until a consumer releases it, and the input is settled only
// then (dataplane.Input). If the holder is lost first, the input comes back
// and the replica that does it again sends the item again: the broker
// answers that it is a duplicate of the message that stands, whose bytes
// are gone. The new copy is kept (rehold) and its address recorded under
// the item's id in the run's holder bucket; a consumer that cannot fetch
// from the first holder looks there (fetchAgain). The copy is dropped once
// the stream no longer stores the message (dataplane.Plane.SweepReheld),
// like any other.

// rehold keeps the bytes of id, sent again, for the message that stands,
// and records where they are.
func (q *Queue) rehold(id string) {
	d := q.env.DP
	d.Rehold(id)
	b, _ := json.Marshal(dataplane.HolderRef{Addr: d.Addr(), Pin: d.Pin(), Worker: q.env.Share.Worker()})
	ctx, cancel := context.WithTimeout(q.env.Share.RunCtx(), 5*time.Second)
	defer cancel()
	if _, err := q.env.Holders.Put(ctx, id, b); err != nil {
		q.env.Share.Fail(fmt.Errorf("%s: recording where item %s is held again: %w", q.Name(), id, err))
	}
}

// fetchAgain fetches the bytes of id from where they are held again after
// their first holder was lost (rehold), waiting for the input they derive
// from to come back and be done again, for as long as a duplicate can be
// dropped (2 minutes) or until ctx ends. It returns the new place, so
// that the release goes there.
func (q *Queue) fetchAgain(ctx context.Context, r ref, id string) ([]byte, ref, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if e, err := q.env.Holders.Get(ctx, id); err == nil {
			var h dataplane.HolderRef
			if json.Unmarshal(e.Value(), &h) == nil && h.Addr != r.Addr {
				nr := ref{Addr: h.Addr, Pin: h.Pin, Size: r.Size}
				if data, err := q.env.DP.Fetch(ctx, nr, id); err == nil {
					return data, nr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, r, ctx.Err()
		case <-time.After(wait):
		}
	}
}
