package settle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/nats-io/nats.go/jetstream"
)

// Chains: hops that need not cross, don't.
//
// An edge between stages that restart elsewhere and keep nothing past an
// item, each of whose queues is one producer's to one consumer on one
// worker, is a chain's (control.Queues): its items stay in process, on
// the engine's channels (engine.Chain: Ledger.Chain), and never ride a
// stream. What makes that exactly once:
//
//   - an item sent on a chain's edge carries a receipt of its own (a
//     child *Taken), with the id the edge's stream would have given it
//     (derived from the sender's delivery in hand, edge.DerivedID), so what
//     derives from it further on has the same ids whether a hop is
//     chained or not;
//   - a child counts as one publish under way of the delivery it derives
//     from (Taken.derive) until it is settled itself, by the same rule as
//     any input (Taken.Done): the input at the chain's head, a stream's
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
// their source positions moved), each write expecting the revision of
// the one before (recordChains). A lost share's part of a chained edge is
// its record's, not its last snapshot's; the coordinator seals the record
// as it counts the share lost (sealChain), so a share that was only slow
// writes no more of it and acks nothing more. A head the lost share
// recorded in its last settle whose ack did not reach the server comes
// back: a stream's to whichever share takes it, which records it as
// delivered before (Redone), and the run's figures count it once
// (chainTwice); a resuming source's to the source's restart, told the
// lost share's last ranges (Job.Recount), which counts it apart
// (Recounted).

// chainEdge is a chain's edge as the engine sees it (engine.Chain): its
// queues are the engine's channels, each item boxed with a child receipt.
type chainEdge struct {
	ei int // the edge's index
}

// Chain is the engine's chain (engine.Chain) of the edge of index ei
// (wire.EdgeIndex): what is sent on it carries a receipt derived from the
// sender's delivery in hand.
func (lg *Ledger) Chain(ei int) engine.Chain { return &chainEdge{ei: ei} }

// Derive gives an item sent from the sender's delivery in hand a receipt
// of its own (none where it has none: an item a stream gets under a
// sequence id is not derived either).
func (c *chainEdge) Derive(from engine.Origin) engine.Receipt {
	parent, _ := from.Receipt.(*Taken)
	if parent == nil {
		return nil
	}
	return parent.child(c.ei, from.Sent)
}

func (c *chainEdge) Unsent(rc engine.Receipt) { rc.(*Taken).unsent() }

// child is the receipt of an item sent from t on the chained edge of
// index ei, the k-th sent from t: counted under way from t until settled, and
// counted on its head.
func (t *Taken) child(ei, k int) *Taken {
	head := t
	if t.head != nil {
		head = t.head
	}
	c := &Taken{lg: t.lg, parent: t, head: head, ei: ei, sent: k}
	head.mu.Lock()
	if head.chain == nil {
		head.chain = make([]int64, len(t.lg.env.Graph.Edges))
	}
	head.chain[ei]++
	head.mu.Unlock()
	t.derive()
	return c
}

// ident is t's id. A chain's item's derives from its parent's (the id the
// edge's stream would have given it), and a resuming source's from its
// place; both are worked out when first asked: most never are, only those
// something is published from, or that a chain further on derives from.
func (t *Taken) ident() string {
	t.idOnce.Do(func() {
		switch {
		case t.parent != nil:
			t.id = edge.DerivedID(t.parent.ident(), t.sent, strconv.Itoa(t.ei))
		case t.pos != nil && t.id == "":
			t.id = sourceItemID(t.pos.key, t.k) // a resuming source's (resume.go)
		}
	})
	return t.id
}

// unsent takes back a child whose send failed.
func (c *Taken) unsent() {
	c.head.mu.Lock()
	c.head.chain[c.ei]--
	c.head.mu.Unlock()
	c.parent.answered()
}

// settled hands t, finished and with nothing it sent under way, on: a
// chain's item to the delivery it derives from, as one of its publishes
// answered; any other to the ledger's next settle.
func (t *Taken) settled() {
	if t.parent == nil {
		t.lg.done(t)
		return
	}
	if t.by != nil {
		t.by.SettledOne()
	}
	t.parent.answered()
}

// addHead adds head h to hs.
func addHead(hs *wire.ChainHeads, h *Taken) {
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

// chains is a share's side of its chains' figures.
type chains struct {
	mu  sync.Mutex
	rec wire.ChainRecord
	// rev is the record's revision as last written (0: none yet)
	rev uint64
	// sources are the ranges of resuming sources' heads lost shares
	// recorded last (Job.Recount)
	sources map[string][][2]int64
}

// recounts reports whether head h is a resuming source's that a lost
// share recorded last: a restart of the source, it emits it again.
func (ch *chains) recounts(h *Taken) bool {
	if h.pos == nil {
		return false
	}
	for _, r := range ch.sources[h.pos.key] {
		if r[0] <= h.k && h.k < r[1] {
			return true
		}
	}
	return false
}

// errSealed says the coordinator sealed the share's chain record: it was
// counted lost, and what it would settle now comes back elsewhere.
var errSealed = errors.New("the share was counted lost: its chains' record is sealed")

// recordChains adds the heads of a settle about to be acked to the
// share's chain record and writes it, before the acks go (or the source
// positions move): a head recorded whose ack is lost is in Last. The
// write expects the revision written before: once the coordinator has
// sealed the record (the share counted lost), it fails, and the settle
// acks nothing. Any failure stops the settle.
func (lg *Ledger) recordChains(heads []*Taken) error {
	ch := &lg.chains
	edges := lg.env.Graph.Edges
	// what the heads derived, by edge index: settled here, and counted
	// apart
	committed, recounted := make([]int64, len(edges)), make([]int64, len(edges))
	named := func(h *Taken) map[string]int64 {
		out := map[string]int64{}
		for ei, n := range h.chain {
			if n != 0 {
				out[edges[ei].Name] += n
			}
		}
		return out
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	rec := ch.rec   // written only once stored
	cloned := false // rec.Redone, before the first head it adds
	var last wire.ChainHeads
	for _, h := range heads {
		apart := ch.recounts(h)
		to := committed
		if apart {
			to = recounted
		}
		h.mu.Lock()
		for ei, n := range h.chain {
			to[ei] += n
		}
		if h.again && !apart {
			if !cloned {
				rec.Redone, cloned = maps.Clone(rec.Redone), true
				if rec.Redone == nil {
					rec.Redone = map[string]map[string]int64{}
				}
			}
			rec.Redone[h.id] = named(h)
		}
		h.mu.Unlock()
		if !apart {
			addHead(&last, h)
		}
	}
	add := func(to map[string]int64, by []int64) map[string]int64 {
		to = maps.Clone(to)
		for ei, n := range by {
			if n != 0 {
				if to == nil {
					to = map[string]int64{}
				}
				to[edges[ei].Name] += n
			}
		}
		return to
	}
	rec.Committed, rec.Recounted = add(rec.Committed, committed), add(rec.Recounted, recounted)
	rec.Last = last
	b, err := json.Marshal(&rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(lg.env.Stop, 5*time.Second)
	defer cancel()
	var rev uint64
	if ch.rev == 0 {
		rev, err = lg.env.Ends.Create(ctx, wire.KeyChain(lg.env.Instance), b)
	} else {
		rev, err = lg.env.Ends.Update(ctx, wire.KeyChain(lg.env.Instance), b, ch.rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyDeleted), wire.IsWrongRevision(err):
		return errSealed
	case err != nil:
		return fmt.Errorf("recording the chains' figures on worker %s: %w", lg.share.Worker(), err)
	}
	ch.rec, ch.rev = rec, rev
	return nil
}
