package share

import (
	"sync"

	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
)

// taken is an item taken from a queue for a restartable stage and not
// yet acked, with the counts of its work so far.
type taken struct {
	q   *edge.Queue
	id  string
	ref *dataplane.Ref // its bytes are on a data plane, released once acked
	by  *tracked       // the replica that took it (nil: a source's)
	lg  *ledger        // what settles it
	// a resuming source's item (q nil): its replica's position, its index
	pos *sourcePos
	k   int64
	// dropped: its replica dropped it, the state it restored having
	// trained on it; in a save already unless keep (the round it was
	// trained in, a save of which still has to come)
	dropped bool
	// again: the server had delivered it before (a stream's item)
	again bool
	keep  uint32
	// a chain's item (chain.go): parent is the delivery it derives from,
	// head the input at its chain's head, ei the index of the chained
	// edge it was sent on, sent how many its parent's replica had sent
	// from it before
	parent, head *taken
	ei, sent     int
	idOnce       sync.Once // its id, derived when first asked (ident)

	// settled: once its replica has done with it and every publish of
	// what it sent has its answer, it joins the ledger's next settle
	mu       sync.Mutex
	finished bool // its replica has asked for the next item, or returned
	queued   bool // handed to the ledger: once, whatever a node does
	under    int  // publishes derived from it, unanswered
	// chain counts, on a chain's head, what was derived from it on each
	// chained edge, by edge index
	chain []int64
}

// derive notes a publish of an item sent from t, under way.
func (t *taken) derive() {
	t.mu.Lock()
	t.under++
	t.mu.Unlock()
}

// answered notes a publish from t answered; t is settled if it was the
// last and t is finished.
func (t *taken) answered(lg *ledger) {
	t.mu.Lock()
	t.under--
	settle := t.under == 0 && t.finished && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled(lg)
	}
}

// finish notes that t's replica has done with it; t is settled if nothing
// it sent is under way.
func (t *taken) finish(lg *ledger) {
	t.mu.Lock()
	t.finished = true
	settle := t.under == 0 && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled(lg)
	}
}

// ID is the id of the item: what is sent from it derives from (edge.Receipt).
func (t *taken) ID() string { return t.ident() }

// Derived notes a publish from t under way (edge.Receipt, dataplane.Input).
func (t *taken) Derived() { t.derive() }

// Answered notes a publish from t answered (edge.Receipt, dataplane.Input).
func (t *taken) Answered() { t.answered(t.lg) }
