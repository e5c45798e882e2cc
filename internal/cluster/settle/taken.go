package settle

import (
	"sync"

	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
)

// Taken is the receipt of an item taken for a restartable stage and not
// yet acked, with the counts of its work so far: a queue's item
// (Ledger.Take), a resuming source's (Position.Item), or a chain's
// (Chain.Derive). It travels with its item through the engine as the
// receiving replica's delivery in hand (engine.Receipt), and what is sent
// from it derives from it (edge.Receipt).
type Taken struct {
	q   *edge.Queue
	id  string
	ref *dataplane.Ref // its bytes are on a data plane, released once acked
	by  Holder         // the replica that took it (nil: a source's)
	lg  *Ledger        // what settles it
	// a resuming source's item (q nil): its replica's position, its index
	pos *Position
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
	parent, head *Taken
	ei, sent     int
	idOnce       sync.Once // its id, derived when first asked (ID)

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

// Holder is the replica that took an item, as its runtime follows it
// (package follow's tracked): asked, as the item is done, whether it keeps
// it for a save, and told once it is settled.
type Holder interface {
	// Keeps takes t off the replica's hands, and reports whether it is
	// kept for a save: then the holder finishes it (Taken.Finish) once a
	// save holds it.
	Keeps(t *Taken) bool
	// SettledOne notes that an item the replica took is settled.
	SettledOne()
}

// HeldBy notes h as the replica that took t.
func (t *Taken) HeldBy(h Holder) { t.by = h }

// Drop notes that t's replica drops it, the state it restored having
// trained on it: in a save already, or (keep > 0) trained in round keep,
// which a save has yet to hold.
func (t *Taken) Drop(keep uint32) { t.dropped, t.keep = true, keep }

// Again says whether the server had delivered t before: its first
// delivery's share was lost, or let it go.
func (t *Taken) Again() bool { return t.again }

// Dropped says whether t's replica dropped it (Drop), and the round a
// save has yet to hold (0: none).
func (t *Taken) Dropped() (dropped bool, keep uint32) { return t.dropped, t.keep }

// Done is engine.Receipt's, called as the replica that received the item
// asks for its next or returns: the one rule by which an input is
// settled. It is settled once what the replica sent from it is stored
// (Finish), unless its replica keeps it for a save (Holder.Keeps): then
// once a save holds the round it was trained in.
func (t *Taken) Done() {
	if t.by != nil && t.by.Keeps(t) {
		return
	}
	t.Finish()
}

// derive notes a publish of an item sent from t, under way.
func (t *Taken) derive() {
	t.mu.Lock()
	t.under++
	t.mu.Unlock()
}

// answered notes a publish from t answered; t is settled if it was the
// last and t is finished.
func (t *Taken) answered() {
	t.mu.Lock()
	t.under--
	settle := t.under == 0 && t.finished && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled()
	}
}

// Finish notes that t's replica has done with it (or, kept for a save,
// that a save holds it); t is settled if nothing it sent is under way.
func (t *Taken) Finish() {
	t.mu.Lock()
	t.finished = true
	settle := t.under == 0 && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled()
	}
}

// ID is the id of the item: what is sent from it derives from (edge.Receipt).
func (t *Taken) ID() string { return t.ident() }

// Derived notes a publish from t under way (edge.Receipt, dataplane.Input).
func (t *Taken) Derived() { t.derive() }

// Answered notes a publish from t answered (edge.Receipt, dataplane.Input).
func (t *Taken) Answered() { t.answered() }
