package settle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Exactly once across a lost worker.
//
// A replica of a stage that restarts elsewhere (a restartable stage: its
// kind is stateless and it does not step with the others) reads only
// queues on JetStream (control.Queues) or a chain's queues, whose items
// derive from an input on JetStream or a resuming source's (chain.go), so
// whatever it has not finished is still in a stream, or comes back to
// the source, when its worker is lost. What it has finished must
// never come back, and what it sent must be there once. The worker settles
// its own inputs; no item goes through the coordinator:
//
//   - an item taken for a restartable stage comes with its receipt (a
//     *Taken: edge.Queue.take, Ledger.Take), which travels with it through
//     the engine (engine.Delivery): the engine keeps it as the receiving
//     replica's delivery in hand from its Recv to its next Recv (or the
//     return of its Run), whatever the item's type, and what the replica
//     sends in between derives from it (engine.Origin): its id on an edge
//     follows from the input's id (edge.DerivedID), so a restart, or
//     another replica that took the input over, sends it again under the
//     same id, and the edge's stream (every queue of the edge one
//     namespace of ids) drops the duplicate, whichever queue it is sent to;
//   - the input is settled by one rule (Taken.Done, as the engine lets it
//     go): once every publish of what its replica sent has the server's
//     answer (Taken.Finish, Taken.answered), or, where the replica's group
//     saves, once a save holds it (Holder.Keeps: package follow's tracked
//     keeps it until then); the ledger acks it then (Ledger.Settle), in
//     batches, and keeps it from redelivery until the server has the acks
//     (a flush); a worker lost before that has its input redelivered to
//     the share that takes over, which does it again: nothing is lost, and
//     what it sends again is dropped;
//   - a followed replica that has returned is recorded settled once all
//     it took is (package follow's recordSettled); a lost worker's replica
//     recorded so is not run again (package restarts, endedOn): nothing
//     of it can come back, and run again it could take another lost
//     replica's item from a shared input and send it after the end its
//     consumers ended on;
//   - on an edge of several queues that a restartable stage sends on,
//     every queue rides the stream (control.Queues), so a duplicate is
//     dropped even where the replica that sends it again feeds another
//     queue;
//   - the run's counts are the engines' and the streams' (package figures): an
//     edge whose queues all ride streams is counted by them (what was
//     stored, what is left), and a lost share's replicas of a restartable
//     stage get what the stage's edges say the stage did, less what the
//     live shares counted: an item done twice (its worker lost before it
//     was settled) is counted once.

// Env is what a share's ledger works with: the connection whose flush
// says the server has the acks, the graph (its edges name a chain's
// figures), the run's buckets, and the cancellation of the share's
// background group.
type Env struct {
	NC       *nats.Conn
	Graph    *graph.Graph
	Instance string             // the share's name: its chain record's key
	Ends     jetstream.KeyValue // the run's end bucket: chain records
	// Positions is the run's position bucket: how far resuming sources
	// have gone (resume.go)
	Positions jetstream.KeyValue
	// Recount are the ranges of resuming sources' chain heads that lost
	// shares recorded last (wire.Job's Recount.Sources)
	Recount map[string][][2]int64
	// Stop is done once the share's background work stops
	Stop context.Context
}

// Share is what the ledger asks of the worker's share it settles for.
type Share interface {
	// Worker is the name of the share's worker, for errors.
	Worker() string
	// Released says the share was counted lost: it settles nothing more.
	Released() bool
	// Fatal fails the share with err (a settle that failed).
	Fatal(err error)
}

// Ledger settles a share's finished inputs: acked in batches, kept from
// redelivery until the server has the acks, their bytes released then.
type Ledger struct {
	env    Env
	share  Share
	chains chains

	mu       sync.Mutex
	finished []*Taken
	wake     chan struct{}
	smu      sync.Mutex // one settle at a time
	// under smu: the positions settles moved since the last record, and
	// when that was
	moved    map[*Position]bool
	recorded time.Time
}

// New is the ledger of share sh.
func New(env Env, sh Share) *Ledger {
	return &Ledger{env: env, share: sh, wake: make(chan struct{}, 1),
		chains: chains{sources: env.Recount}, moved: map[*Position]bool{}}
}

// Take is the receipt of the item id that q hands a restartable stage
// (r: where its bytes are held, nil if in its message; again: the server
// had delivered it before): edge.Share's Take.
func (lg *Ledger) Take(q *edge.Queue, id string, r *dataplane.Ref, again bool) *Taken {
	return &Taken{q: q, id: id, ref: r, lg: lg, again: again}
}

// done queues a finished item for the next settle.
func (lg *Ledger) done(t *Taken) {
	lg.mu.Lock()
	lg.finished = append(lg.finished, t)
	lg.mu.Unlock()
	select {
	case lg.wake <- struct{}{}:
	default:
	}
}

// Run settles whatever is finished, one batch after another, until the
// share stops (Env.Stop) or a settle fails (Share.Fatal); a position a
// settle moved is recorded within recordEvery. It runs in the share's
// background group.
func (lg *Ledger) Run() {
	var later <-chan time.Time // a position moved and not yet recorded
	var last time.Time         // the last settle began
	for {
		select {
		case <-lg.env.Stop.Done():
			return
		case <-lg.wake:
		case <-later:
		}
		// What finishes within settleEvery of the last settle waits for
		// the rest: one flush for them all.
		if wait := settleEvery - time.Since(last); wait > 0 {
			select {
			case <-lg.env.Stop.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		if err := lg.settle(false); err != nil {
			lg.share.Fatal(err)
			return
		}
		later = nil
		if lg.unrecorded() {
			later = time.After(recordEvery)
		}
	}
}

// settleEvery is how often the ledger settles, at most: each settle ends
// with a flush, a round trip to the server, which where items come a few
// at a time cost a round trip for every few items.
const settleEvery = 2 * time.Millisecond

// recordEvery is how often a settle that moves a resuming source's
// position records it, at most: a write to the position bucket per settle
// cost the server as much as the items' own messages where items come a
// few at a time. A restart takes up from the last record, and what was
// stored after it is sent again and dropped (resume.go).
const recordEvery = 20 * time.Millisecond

// Settle settles what is finished, as Run does, and records every
// position it and the settles before it moved.
func (lg *Ledger) Settle() error { return lg.settle(true) }

// settle acks every finished item's latest delivery, then waits until the
// server has the acks (a flush: it has read everything sent before), then
// stops keeping those messages from redelivery and releases their bytes;
// then it records the positions moved (all of them where record is true,
// else at most every recordEvery). A share counted lost settles nothing
// more: what it holds goes to the share that took over.
func (lg *Ledger) settle(record bool) error {
	lg.smu.Lock()
	defer lg.smu.Unlock()
	lg.mu.Lock()
	batch := lg.finished
	lg.finished = nil
	lg.mu.Unlock()
	if lg.share.Released() {
		return nil
	}
	// A chain's heads are recorded before they are acked (chain.go); a
	// source's item is a head once its position passes it.
	var heads []*Taken
	acks := 0
	for _, t := range batch {
		if t.q == nil {
			passed := t.pos.settled(t)
			if len(passed) > 0 {
				lg.moved[t.pos] = true
			}
			for _, p := range passed {
				if p.chain != nil {
					heads = append(heads, p)
					// a chain's record counts it settled: its position
					// goes with the record, else a restart does again
					// what the record counted (Recount)
					record = true
				}
			}
			continue
		}
		acks++
		if t.chain != nil {
			heads = append(heads, t)
		}
	}
	if len(heads) > 0 {
		if err := lg.recordChains(heads); err != nil {
			return err
		}
	}
	if acks > 0 {
		if err := lg.ack(batch); err != nil {
			return err
		}
	}
	if len(lg.moved) == 0 || !record && time.Since(lg.recorded) < recordEvery {
		return nil
	}
	lg.recorded = time.Now()
	return lg.record()
}

// ack acks the batch's items from queues, waits until the server has the
// acks, then lets them go.
func (lg *Ledger) ack(batch []*Taken) error {
	for _, t := range batch {
		if t.q == nil {
			continue // a source's item: nothing to ack
		}
		if m := t.q.HeldMsg(t.id); m != nil {
			if err := m.Ack(); err != nil {
				return fmt.Errorf("%s: acking item %s on worker %s: %w", t.q.Name(), t.id, lg.share.Worker(), err)
			}
		}
	}
	var err error
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		if err = lg.env.NC.FlushTimeout(2 * time.Second); err == nil {
			break
		}
		select {
		case <-lg.env.Stop.Done():
			return nil
		case <-time.After(wait):
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("settling %d items on worker %s: %w", len(batch), lg.share.Worker(), err)
		}
	}
	for _, t := range batch {
		if t.q == nil {
			continue
		}
		t.q.Committed(t.id)
		t.q.Release(t.id, t.ref) // acked: its bytes' holder may drop them
		if t.by != nil {
			t.by.SettledOne()
		}
	}
	return nil
}

// unrecorded says a settle moved a position not yet recorded.
func (lg *Ledger) unrecorded() bool {
	lg.smu.Lock()
	defer lg.smu.Unlock()
	return len(lg.moved) > 0
}
