package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/nats-io/nats.go/jetstream"
)

// Chains: hops that need not cross, don't.
//
// An edge between stages that restart elsewhere and keep nothing past an
// item, each of whose queues is one producer's to one consumer on one
// worker, is a chain's (control.Queues): its items stay in process, on a
// chainQueue, and never ride a stream. What makes that exactly once:
//
//   - an item sent on a chain's edge carries a receipt of its own (a
//     child *taken), with the id the edge's stream would have given it
//     (derived from the sender's delivery in hand, origin.hash), so what
//     derives from it further on has the same ids whether a hop is
//     chained or not;
//   - a child counts as one publish under way of the delivery it derives
//     from (taken.derive) until it is settled itself, by the same rule as
//     any input (taken.Done): the input at the chain's head, a stream's
//     item or a resuming source's, is settled only once everything the
//     chain sent on from it is stored;
//   - a lost worker's chains restart whole (Coordinator.endedOn counts no
//     replica on a chain's edge finished), from their heads' inputs, which
//     come back; what the chain had sent on is sent again under the same
//     ids, and dropped.
//
// A chain's edge has no stream to count it, so its figures follow its
// heads: each head counts what was derived from it on each chained edge,
// and the share's chain record (keyChain, in the end bucket) holds what
// its settled heads derived, written before those heads are acked (or
// their source positions moved). A lost share's part of a chained edge is
// its record's, not its last snapshot's; a head it recorded whose ack did
// not reach the server comes back to the restart, which, told the lost
// shares' last heads (Job.Recount), counts what it derives from them
// apart (Recounted), and the run's figures take that off (chainFigures).

// chainQueue is a queue of a chain's edge: a channel of deliveries.
type chainQueue struct {
	l    *links
	edge *graph.Edge
	ei   int
	ch   chan engine.Delivery
	once sync.Once
}

func (l *links) chainQueue(e *graph.Edge) *chainQueue {
	return &chainQueue{l: l, edge: e, ei: edgeIndex(l.g, e), ch: make(chan engine.Delivery, max(e.Capacity, 1))}
}

// Send queues item with a receipt derived from the sender's delivery in
// hand (none where it has none: a sequence id's item on a stream is not
// derived either).
func (q *chainQueue) Send(ctx context.Context, item any, from engine.Origin) error {
	d := engine.Delivery{Item: item}
	parent, _ := from.Receipt.(*taken)
	var c *taken
	if parent != nil {
		c = parent.child(q.edge.Name, q.ei, from.Sent)
		d.Receipt = c
	}
	select {
	case q.ch <- d:
		return nil
	case <-ctx.Done():
		if c != nil {
			c.unsent()
		}
		return ctx.Err()
	}
}

func (q *chainQueue) Recv(ctx context.Context) (engine.Delivery, bool, error) {
	select {
	case d, ok := <-q.ch:
		return d, ok, nil
	case <-ctx.Done():
		return engine.Delivery{}, false, ctx.Err()
	}
}

func (q *chainQueue) Close()     { q.once.Do(func() { close(q.ch) }) }
func (q *chainQueue) Depth() int { return len(q.ch) }

// Held is engine.Holder's: what its consumers never took, once they have
// all returned.
func (q *chainQueue) Held() int { return len(q.ch) }

// child is the receipt of an item sent from t on chained edge edge (index
// ei), the k-th sent from t: counted under way from t until settled, and
// counted on its head.
func (t *taken) child(edge string, ei, k int) *taken {
	head := t
	if t.head != nil {
		head = t.head
	}
	c := &taken{id: "f" + origin{id: t.id, k: k}.hash(strconv.Itoa(ei)), lg: t.lg, parent: t, head: head, edge: edge}
	head.mu.Lock()
	if head.chain == nil {
		head.chain = map[string]int64{}
	}
	head.chain[edge]++
	head.mu.Unlock()
	t.derive()
	return c
}

// unsent takes back a child whose send failed.
func (c *taken) unsent() {
	c.head.mu.Lock()
	c.head.chain[c.edge]--
	c.head.mu.Unlock()
	c.parent.answered(c.lg)
}

// settled hands t, finished and with nothing it sent under way, on: a
// chain's item to the delivery it derives from, as one of its publishes
// answered; any other to the ledger's next settle.
func (t *taken) settled(lg *ledger) {
	if t.parent == nil {
		lg.done(t)
		return
	}
	if t.by != nil {
		t.by.settledOne()
	}
	t.parent.answered(lg)
}

// chainCounts is what was derived from head t on each chained edge.
func (t *taken) chainCounts() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.chain)
}

// chainRecord is a share's record of its chains' figures (keyChain).
type chainRecord struct {
	// Committed is what the heads it settled derived, by chained edge,
	// less those in Recount.
	Committed map[string]int64 `json:"committed,omitempty"`
	// Recounted is what the heads in the job's Recount derived here: they
	// were recorded by a lost share, whose ack may not have reached the
	// server.
	Recounted map[string]int64 `json:"recounted,omitempty"`
	// Last is the latest batch of heads recorded, by id, each with what it
	// derived: recorded before they were acked, they come back to a
	// restart where the acks did not reach the server.
	Last map[string]map[string]int64 `json:"last,omitempty"`
}

// chains is a share's side of its chains' figures.
type chains struct {
	mu  sync.Mutex
	rec chainRecord
	// recount are lost shares' last heads (Job.Recount)
	recount map[string]map[string]int64
}

// record adds the heads of a settle about to be acked to the share's
// chain record and writes it, before the acks go: a head recorded whose
// ack is lost is in Last for the restart to recount.
func (lg *ledger) recordChains(heads []*taken) error {
	ch := &lg.l.chains
	ch.mu.Lock()
	last := map[string]map[string]int64{}
	for _, h := range heads {
		counts := h.chainCounts()
		if _, again := ch.recount[h.id]; again {
			delete(ch.recount, h.id)
			ch.rec.Recounted = addCounts(ch.rec.Recounted, counts)
			continue
		}
		ch.rec.Committed = addCounts(ch.rec.Committed, counts)
		last[h.id] = counts
	}
	ch.rec.Last = last
	b, err := json.Marshal(&ch.rec)
	ch.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(lg.l.stopCtx, 5*time.Second)
	defer cancel()
	if _, err := lg.l.ends.Put(ctx, keyChain(lg.l.instance), b); err != nil && lg.l.stopCtx.Err() == nil {
		return fmt.Errorf("recording the chains' figures on worker %s: %w", lg.l.worker, err)
	}
	return nil
}

func addCounts(to, from map[string]int64) map[string]int64 {
	if len(from) == 0 {
		return to
	}
	if to == nil {
		to = map[string]int64{}
	}
	for k, v := range from {
		to[k] += v
	}
	return to
}

// keyChain is a share's chain record.
func keyChain(instance string) string { return "chain." + token(instance) }

// readChain reads the chain record of share inst (none: it recorded
// nothing, or the read failed).
func (c *Coordinator) readChain(inst string) (chainRecord, error) {
	var rec chainRecord
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, bucketEnds(c.run))
	if err != nil {
		return rec, err
	}
	e, err := kv.Get(ctx, keyChain(inst))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, nil
	}
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(e.Value(), &rec)
}

// recountFrom adds the heads lost share in recorded last to those a
// restart counts apart (Job.Recount).
func (c *Coordinator) recountFrom(in *instance) error {
	if len(c.chained) == 0 {
		return nil
	}
	rec, err := c.readChain(in.name)
	if err != nil {
		return fmt.Errorf("reading the chains' record of the share %s: %w", in.name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recount == nil {
		c.recount = map[string]map[string]int64{}
	}
	maps.Copy(c.recount, rec.Last)
	return nil
}

// readChains reads every share's chain record, for the figures of a run
// that completed (mergedEdge): a lost share's part of a chained edge is
// what it recorded settled, and a live share counted apart what it did
// again of a lost one's.
func (c *Coordinator) readChains() {
	if len(c.chained) == 0 {
		return
	}
	recs := map[string]chainRecord{}
	for _, in := range c.sortedInstances() {
		rec, err := c.readChain(in.name)
		if err != nil {
			fmt.Fprintf(c.o.Log, "dflow: the chains' record of the share %s could not be read (%v): its figures are the engines'\n", in.name, err)
			continue
		}
		recs[in.name] = rec
	}
	c.mu.Lock()
	c.chainRecs = recs
	c.mu.Unlock()
}
