package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// worker, is a chain's (control.Queues): its items stay in process, on
// the engine's channels (engine.Chain: chainEdge), and never ride a
// stream. What makes that exactly once:
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

// chainEdge is a chain's edge as the engine sees it (engine.Chain): its
// queues are the engine's channels, each item boxed with a child receipt.
type chainEdge struct {
	name string
	ei   int
}

// ChainFor is the engine's ChainFor.
func (l *links) ChainFor(e *graph.Edge, qi int) engine.Chain {
	if !l.job.Chained[e.Name] {
		return nil
	}
	return &chainEdge{name: e.Name, ei: edgeIndex(l.g, e)}
}

// Derive gives an item sent from the sender's delivery in hand a receipt
// of its own (none where it has none: an item a stream gets under a
// sequence id is not derived either).
func (c *chainEdge) Derive(from engine.Origin) engine.Receipt {
	parent, _ := from.Receipt.(*taken)
	if parent == nil {
		return nil
	}
	return parent.child(c.name, c.ei, from.Sent)
}

func (c *chainEdge) Unsent(rc engine.Receipt) { rc.(*taken).unsent() }

// child is the receipt of an item sent from t on chained edge edge (index
// ei), the k-th sent from t: counted under way from t until settled, and
// counted on its head.
func (t *taken) child(edge string, ei, k int) *taken {
	head := t
	if t.head != nil {
		head = t.head
	}
	c := &taken{id: "f" + origin{id: t.id, k: k}.hash(strconv.Itoa(ei)), lg: t.lg, parent: t, head: head, ei: ei}
	head.mu.Lock()
	if head.chain == nil {
		head.chain = make([]int64, len(t.lg.l.g.Edges))
	}
	head.chain[ei]++
	head.mu.Unlock()
	t.derive()
	return c
}

// unsent takes back a child whose send failed.
func (c *taken) unsent() {
	c.head.mu.Lock()
	c.head.chain[c.ei]--
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

// chainRecord is a share's record of its chains' figures (keyChain).
type chainRecord struct {
	// Committed is what the heads it settled derived, by chained edge,
	// less what Recounted holds.
	Committed map[string]int64 `json:"committed,omitempty"`
	// Recounted is what the heads in the job's Recount derived here: a
	// lost share recorded them, and their acks (or its source's position)
	// may not have reached the server.
	Recounted map[string]int64 `json:"recounted,omitempty"`
	// Last are the heads of the latest settle recorded: recorded before
	// they were acked, they come back to a restart where the acks did not
	// reach the server.
	Last chainHeads `json:"last"`
}

// chainHeads names heads: a stream's items by id, a resuming source's by
// the ranges of its items (k from [0] up to [1]) that a position move
// passed, by the source's position key.
type chainHeads struct {
	IDs     []string              `json:"ids,omitempty"`
	Sources map[string][][2]int64 `json:"sources,omitempty"`
}

// add adds head h.
func (hs *chainHeads) add(h *taken) {
	if h.pos == nil {
		hs.IDs = append(hs.IDs, h.id)
		return
	}
	if hs.Sources == nil {
		hs.Sources = map[string][][2]int64{}
	}
	rs := hs.Sources[h.pos.key]
	if n := len(rs); n > 0 && rs[n-1][1] == h.k {
		rs[n-1][1]++
	} else {
		rs = append(rs, [2]int64{h.k, h.k + 1})
	}
	hs.Sources[h.pos.key] = rs
}

// merge adds o's heads.
func (hs *chainHeads) merge(o chainHeads) {
	hs.IDs = append(hs.IDs, o.IDs...)
	for k, rs := range o.Sources {
		if hs.Sources == nil {
			hs.Sources = map[string][][2]int64{}
		}
		hs.Sources[k] = append(hs.Sources[k], rs...)
	}
}

// chains is a share's side of its chains' figures.
type chains struct {
	mu  sync.Mutex
	rec chainRecord
	// again are the stream heads lost shares recorded last, and sources
	// the ranges of their sources' (Job.Recount)
	again   map[string]bool
	sources map[string][][2]int64
}

// setRecount takes the job's Recount.
func (ch *chains) setRecount(hs chainHeads) {
	ch.again = map[string]bool{}
	for _, id := range hs.IDs {
		ch.again[id] = true
	}
	ch.sources = hs.Sources
}

// recounts reports whether head h is one a lost share recorded last.
func (ch *chains) recounts(h *taken) bool {
	if h.pos == nil {
		if ch.again[h.id] {
			delete(ch.again, h.id)
			return true
		}
		return false
	}
	for _, r := range ch.sources[h.pos.key] {
		if r[0] <= h.k && h.k < r[1] {
			return true
		}
	}
	return false
}

// recordChains adds the heads of a settle about to be acked to the
// share's chain record and writes it, before the acks go (or the source
// positions move): a head recorded whose ack is lost is in Last for the
// restart to recount.
func (lg *ledger) recordChains(heads []*taken) error {
	ch := &lg.l.chains
	edges := lg.l.g.Edges
	add := func(to map[string]int64, h *taken) map[string]int64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		for ei, n := range h.chain {
			if n != 0 {
				if to == nil {
					to = map[string]int64{}
				}
				to[edges[ei].Name] += n
			}
		}
		return to
	}
	ch.mu.Lock()
	var last chainHeads
	for _, h := range heads {
		if ch.recounts(h) {
			ch.rec.Recounted = add(ch.rec.Recounted, h)
			continue
		}
		ch.rec.Committed = add(ch.rec.Committed, h)
		last.add(h)
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
	c.recount.merge(rec.Last)
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

func (hs chainHeads) clone() chainHeads {
	var out chainHeads
	out.merge(hs)
	return out
}
