package settle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Sources that resume.
//
// A source whose kind resumes (nodes.Spec.Resumes: the same items in the
// same order on every start) restarts on a live worker after a loss, as a
// stateless stage does, and takes up where it was (package follow's
// resume wraps its replicas):
//
//   - its k-th item's id follows from the replica and k (an origin, as an
//     item a stateless replica sends), so one it sends again is a
//     duplicate its edge's stream drops;
//   - its position is how many of its items are settled, every one before
//     stored (and, for a large item, its bytes released by a consumer):
//     kept per replica in the run's position bucket, recorded after the
//     settle that moved it, within recordEvery (ledger.go);
//   - a restarted replica reads its position and drops what its node
//     emits before it (those were stored); what it emits after is sent,
//     and what of it had been stored already is dropped as a duplicate.
//     The position lags the settles by at most recordEvery and a batch,
//     far within the duplicate window.

// Position is a resuming source replica's position in this share: every
// item before it is settled.
type Position struct {
	key  string // its key in the position bucket
	lg   *Ledger
	mu   sync.Mutex
	next int64
	done map[int64]*Taken // settled past next
}

// Resume is the position of the source replica whose key in the position
// bucket is key, as its last settle recorded it (0 where none did).
func (lg *Ledger) Resume(ctx context.Context, key string) (*Position, error) {
	from := int64(0)
	if e, err := lg.env.Positions.Get(ctx, key); err == nil {
		if from, err = strconv.ParseInt(string(e.Value()), 10, 64); err != nil {
			return nil, fmt.Errorf("position %q: %w", e.Value(), err)
		}
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("reading where it was: %w", err)
	}
	return &Position{key: key, lg: lg, next: from, done: map[int64]*Taken{}}, nil
}

// Item is the receipt of the replica's k-th item (counted from 0): in
// hand while it is sent, settled once what was sent is stored, its id
// from its place (ident).
func (p *Position) Item(k int64) *Taken { return &Taken{pos: p, k: k, lg: p.lg} }

// settled notes item t (its t.k-th) settled, and returns the items the
// position passed with it (none where it did not move).
func (p *Position) settled(t *Taken) []*Taken {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.k != p.next {
		if t.k > p.next {
			p.done[t.k] = t
		}
		return nil
	}
	passed := []*Taken{t}
	for p.next++; p.done[p.next] != nil; p.next++ {
		passed = append(passed, p.done[p.next])
		delete(p.done, p.next)
	}
	return passed
}

// At is how many of the replica's items are settled, every one before.
func (p *Position) At() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// sourceItemID is the id of item k of the resuming source replica whose
// position key is key.
func sourceItemID(key string, k int64) string { return "s" + key + "." + strconv.FormatInt(k, 10) }

// record writes the positions that moved since the last record.
func (lg *Ledger) record() error {
	for p := range lg.moved {
		delete(lg.moved, p)
		ctx, cancel := context.WithTimeout(lg.env.Stop, 5*time.Second)
		_, err := lg.env.Positions.Put(ctx, p.key, []byte(strconv.FormatInt(p.At(), 10)))
		cancel()
		if err != nil && lg.env.Stop.Err() == nil {
			return fmt.Errorf("recording source position %s on worker %s: %w", p.key, lg.share.Worker(), err)
		}
	}
	return nil
}
