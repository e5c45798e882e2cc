package engine

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/dflow-dev/dflow/graph"
)

// Transports: the seam between the engine and what carries an edge's
// items.
//
// A queue of an edge is in process by default: one Go channel that its
// producer replicas send on and its consumer replicas receive from, with
// the ports' fast paths reading and writing that channel directly (an
// interface call per item would cost more than the rest of an edge). A
// queue may instead be carried by a transport (a message broker between
// hosts, say). Then:
//
//   - the producers' sends go to Transport.Send (the producer side of the
//     queue has no channel, so the fast path falls through to the wait
//     path, which calls the transport);
//   - a pump goroutine of the engine's moves what Transport.Recv returns
//     into the consumers' side of the queue, a local channel of one item,
//     so the consumers' ports, fan-in and monitoring work unchanged;
//   - when the last producer replica wired to the queue has finished, the
//     engine calls Transport.Close (termination from the topology); Recv
//     returns the items still in flight, then io.EOF-like ok = false, and
//     the pump closes the local channel: the consumers see end-of-input
//     once, as in process.
//
// Node code and monitoring do not change: a node sees the same ports, and
// a snapshot's queue depth is the transport's depth. The deadlock
// detector does not judge waits on a transport (what is in flight there
// is not the engine's to see); the engine's snapshots say what they wait
// on, for a detector that sees every host (waits.go).
type Transport interface {
	// Send delivers item, blocking while the queue is full (its capacity
	// bounds what is in flight), until ctx is done (its error then). from
	// is what the item derives from: the sending replica's delivery in
	// hand, so that a transport can give the item an id that the same
	// input, handled again after a loss, gives again.
	Send(ctx context.Context, item any, from Origin) error
	// Recv returns the next delivery, blocking while none is in flight; ok
	// is false once the queue is closed and drained. It returns ctx's
	// error when ctx is done.
	Recv(ctx context.Context) (d Delivery, ok bool, err error)
	// Close ends the queue; called once, after the last Send.
	Close()
	// Depth is how many items the transport holds, for monitoring; at
	// most the queue's capacity.
	Depth() int
}

// A Delivery is an item as a transport hands it to the engine: the item
// and its receipt. The engine keeps the receipt with the replica that
// receives the item (its delivery in hand) until the replica has done
// with it, whatever the item's Go type: nothing follows an item by its
// value or its pointer.
type Delivery struct {
	Item any
	// Receipt acknowledges the item; nil where nothing is owed (the
	// transport settled it as it handed it over).
	Receipt Receipt
}

// A Receipt acknowledges one delivered item to its transport.
type Receipt interface {
	// Done says that the replica that received the item has done with it:
	// it asked for its next item (on any port), or its Run returned
	// without an error while its context was live. Called once (by the
	// engine, or through Hands by a runtime around the node), before the
	// replica waits for anything else; never for an item in hand when its
	// Run fails or was stopped (a failed run, an abort, a drained source):
	// that one comes back to whatever takes over, if anything.
	Done()
}

// Origin is what an item a replica sends derives from.
type Origin struct {
	// Receipt is the sender's delivery in hand; nil where it has none (a
	// source, or a replica whose inputs are all in process).
	Receipt Receipt
	// Sent is how many items the replica sent on transports and chains'
	// queues since it received that delivery (since it started, with
	// none): a node that handles the same item the same way sends the same
	// sequence again.
	Sent int
}

// Hands is the engine's replica as a runtime around a node sees it (a
// wrapper the embedder registers between the engine and a node):
// Delivered returns the delivery in hand (nil: none), and Hand makes
// rc the delivery in hand, settling the one before (Done), as a receive
// does. Hand(nil) settles the delivery in hand and leaves none; a source
// that resumes hands each item it emits a receipt of its own, so that
// what it sends derives from its place in what it emits.
type Hands interface {
	Delivered() Receipt
	Hand(rc Receipt)
}

// ConsumersGoner is a Transport that wants to know when every consumer
// replica of its queue in this engine has returned, so that producers in
// other engines can be told: its Send then fails with an error wrapping
// nodes.ErrNoConsumers once every consumer replica, wherever it ran, has
// gone, as a local Send does.
type ConsumersGoner interface {
	ConsumersGone()
}

// Holder is a Transport that can say how many items it has taken for
// this engine's consumers and not yet handed on: when they all return,
// those are unread, as a local queue's items are.
type Holder interface {
	Held() int
}

// A Chain keeps a queue in process, the engine's channel, while its items
// carry receipts as a transport's do: each item sent on it goes boxed
// with the receipt Derive gives for the sender's origin, and the replica
// that takes it keeps that receipt as its delivery in hand. A runtime
// that restarts a chain of replicas elsewhere from the input at its head
// settles that input once every receipt derived from it is.
type Chain interface {
	// Derive returns the receipt of an item sent from from (nil: none is
	// owed, and the item goes unboxed).
	Derive(from Origin) Receipt
	// Unsent takes back a receipt whose item was never queued: its send
	// failed.
	Unsent(rc Receipt)
}

// ChainFor, when set in Options, returns the chain of in-process queue i
// of edge e, or nil for a plain channel.
type ChainFor func(e *graph.Edge, i int) Chain

// TransportFor, when set in Options, returns the transport of queue i of
// edge e, or nil to keep it in process.
type TransportFor func(e *graph.Edge, i int) Transport

// remoteSend sends item on q's transport for replica r, failing with
// ErrNoConsumers once every consumer has gone.
func (q *queue) remoteSend(ctx context.Context, r *replica, item any) error {
	if q.consumersGone.isSet() {
		return q.noConsumers()
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(q.goneCtx, cancel)
	defer stop()
	err := q.t.Send(sctx, item, r.origin())
	if err != nil && q.consumersGone.isSet() && ctx.Err() == nil {
		return q.noConsumers()
	}
	return err
}

// pump moves q's deliveries from its transport into the consumers'
// channel until the transport ends (then it closes the channel, as the
// last producer would in process), every consumer has gone, or ctx is
// done. A delivery with a receipt travels boxed (*Delivery): the port
// that takes it unboxes it and keeps the receipt with its replica.
func (q *queue) pump(ctx context.Context) error {
	for {
		d, ok, err := q.t.Recv(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) || ctx.Err() != nil {
				return nil // the run is over: its own error says why
			}
			return err
		}
		if !ok {
			q.closeLocal()
			return nil
		}
		var item any = &d
		if d.Receipt == nil {
			item = d.Item
		}
		select {
		case q.ch <- item:
		case <-q.gone:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// inHand is a replica's delivery in hand: its receipt, and how many items
// the replica has sent on transports and chains' queues since it took it.
type inHand struct {
	rc   Receipt
	sent atomic.Int64
}

// Delivered is Hands'.
func (r *replica) Delivered() Receipt {
	if h := r.hand.Load(); h != nil {
		return h.rc
	}
	return nil
}

// Hand is Hands'.
func (r *replica) Hand(rc Receipt) {
	var h *inHand
	if rc != nil {
		h = &inHand{rc: rc}
	}
	if old := r.hand.Swap(h); old != nil { // an inHand always has its receipt
		old.rc.Done()
	}
}

// settleHand settles the replica's delivery in hand, if any: it has done
// with it (a receive, or its return).
func (r *replica) settleHand() {
	if r.hand.Load() != nil {
		r.Hand(nil)
	}
}

// dropHand lets the delivery in hand go unsettled: the replica failed,
// or was stopped (its context done, a drained source's too), with it in
// hand.
func (r *replica) dropHand() {
	r.hand.Store(nil)
}

// origin is what the replica's next send on a transport derives from.
func (r *replica) origin() Origin {
	h := r.hand.Load()
	if h == nil {
		return Origin{Sent: int(r.sentBare.Add(1) - 1)}
	}
	return Origin{Receipt: h.rc, Sent: int(h.sent.Add(1) - 1)}
}

// closeLocal closes the consumers' channel.
func (q *queue) closeLocal() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
}

// depth is how many items the queue holds: its channel's, or, for a
// queue on a transport, what the transport says it holds (within the
// capacity: an item at hand in the consumers' channel is not counted).
func (q *queue) depth() int {
	if q.t != nil {
		return q.t.Depth()
	}
	return len(q.ch)
}

// startPumps starts a pump for every queue carried by a transport; stop
// cancels them and waits until they have returned.
func (r *run) startPumps(ctx context.Context) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	ps := &pumps{ctx: pctx, on: map[*queue]bool{}}
	r.pumps = ps
	// Every queue with a consumer here that has started (a parked one's
	// starts with it, parked.go), not one a move took away before a
	// restart (Options.Left: what the pump fetched for it would wait
	// here unread).
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.away || rep.parked.Load() || rep.gone {
				continue
			}
			for _, in := range rep.inputs {
				for _, iq := range in.all {
					r.startPump(iq.q)
				}
			}
		}
	}
	return func() {
		ps.mu.Lock()
		ps.stopped = true
		ps.mu.Unlock()
		cancel()
		ps.wg.Wait()
	}
}
