package engine

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// Deadlock detection.
//
// Every blocking wait of a replica says what it needs to end (its
// waitSite): an item on one of a port's queues, room on a full queue, or
// the rest of its group at a collective. The run's sampler reads these as
// it samples the queues, and when every replica still running is inside
// exactly one such wait and no wait can end (each queue waited on for an
// item is empty and still has producers, each queue waited on for room is
// full and still has consumers, each group step lacks a member that is
// itself waiting), no replica can ever move again: the run is deadlocked.
// Each wait then waits on other waiting replicas, so following them from
// any replica closes a cycle, which the error names.
//
// The check reads live state without stopping the run, so a wait can look
// stuck for an instant after its channel operation completed. To be exact
// the detector also takes a progress mark (every port's published count,
// every group's completed steps, the replicas that have returned; counts
// are published before every blocking wait) and declares a deadlock only
// when the same stuck state, with the same mark, holds on every check for
// deadlockConfirm: nothing moved in between, and nothing can.
//
// What the detector cannot see it does not judge: a wait made with a
// context other than the one the replica's Run was given (the plugin host
// does this, as may any node that waits beside work of its own) may end by
// that context, so a replica in such a wait counts as able to move, and so
// does a replica with two waits in progress at once. A node that works in
// goroutines of its own while one of them waits should pass its waits a
// context derived from Run's.
const (
	deadlockCheckEvery = 100 * time.Millisecond
	deadlockConfirm    = time.Second
)

type waitKind int8

const (
	waitOpaque waitKind = iota // the engine cannot tell what ends it
	waitRecv                   // an item on one of a port's queues
	waitSend                   // room on a full queue
	waitBytes                  // room in a queue's capacity_bytes budget
	waitGroup                  // the rest of the group at a collective
)

// waitSite is what a blocking wait needs to end. Ports and groups hold
// theirs, so that beginning a wait stores a pointer and allocates nothing.
type waitSite struct {
	kind waitKind
	in   *input // waitRecv
	q    *queue // waitSend, waitBytes
	g    *group // waitGroup
}

// opaqueWait marks a wait made with a context other than the replica's
// own.
var opaqueWait = &waitSite{kind: waitOpaque}

// detector is the sampler's deadlock state.
type detector struct {
	next    int64 // nanotime of the next check
	since   int64 // nanotime the current stuck state was first seen; 0: none
	mark    int64 // the progress mark then
	confirm time.Duration
	// drainStuck is set when a drain could not complete: the run ends
	// aborted.
	drainStuck atomic.Bool
}

// checkDeadlock is called by the sampler at every tick; now is nanotime.
func (r *run) checkDeadlock(now int64) {
	d := &r.detect
	if r.stop.isSet() || now < d.next {
		return
	}
	d.next = now + int64(deadlockCheckEvery)
	mark := r.progressMark()
	stuck := r.stuckWaits()
	if stuck == nil {
		d.since = 0
		return
	}
	if d.since == 0 || mark != d.mark {
		d.since, d.mark = now, mark
		return
	}
	confirm := d.confirm
	if confirm == 0 {
		confirm = deadlockConfirm
	}
	if time.Duration(now-d.since) < confirm {
		return
	}
	err := newDeadlock(stuck, r.isDraining())
	if err.Draining {
		d.drainStuck.Store(true)
	}
	r.fail(err)
}

// progressMark adds up everything that moves when a replica makes
// progress; each part only grows, so an unchanged sum means nothing moved.
func (r *run) progressMark() int64 {
	var m int64
	for _, e := range r.edges {
		for _, q := range e.queues {
			m += q.produced() + q.consumed()
		}
	}
	for _, s := range r.stages {
		s.group.mu.Lock()
		m += s.group.rounds
		s.group.mu.Unlock()
		for _, rep := range s.replicas {
			if rep.ended.Load() != 0 {
				m++
			}
		}
	}
	return m
}

// stuckWait is one replica's wait that cannot end by itself.
type stuckWait struct {
	rep      *replica
	what     string     // "waits to send on hs[0] (full, 8 of 8), read by drafter[0]"
	waitsFor []*replica // the replicas that could end it, all waiting too
	edge     *graph.Edge
	full     bool // the wait is for room on a full queue
}

// stuckWaits returns every running replica's wait when none of them can
// end, nil as soon as one might.
func (r *run) stuckWaits() map[*replica]*stuckWait {
	stuck := map[*replica]*stuckWait{}
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.ended.Load() != 0 {
				continue
			}
			_, _, _, inIdle, inBlocked := rep.waitTotals()
			if inIdle+inBlocked != 1 {
				return nil // working, or waiting twice at once
			}
			w := rep.stuckWait(rep.waitOn.Load())
			if w == nil {
				return nil
			}
			stuck[rep] = w
		}
	}
	if len(stuck) == 0 {
		return nil
	}
	for _, w := range stuck {
		for _, o := range w.waitsFor {
			if stuck[o] == nil {
				return nil // one it waits for has just returned
			}
		}
	}
	return stuck
}

// stuckWait reads the replica's wait on site; nil if it may end.
func (rep *replica) stuckWait(site *waitSite) *stuckWait {
	if site == nil {
		return nil
	}
	w := &stuckWait{rep: rep}
	switch site.kind {
	case waitRecv:
		var names []string
		for _, iq := range site.in.all {
			q := iq.q
			if q.t != nil {
				return nil // in flight on a transport: not the engine's to see
			}
			if len(q.ch) > 0 {
				return nil // an item waits
			}
			if q.producersLeft.Load() == 0 {
				continue // ended; Recv moves on to the others
			}
			names = append(names, q.name())
			w.edge = q.edge.g
			w.waitsFor = append(w.waitsFor, q.liveProducers()...)
		}
		if len(names) == 0 {
			return nil // every queue has ended: Recv returns io.EOF
		}
		w.what = fmt.Sprintf("waits for input on %s (empty), fed by %s", strings.Join(names, ", "), replicaNames(w.waitsFor))
	case waitSend, waitBytes:
		q := site.q
		if q.consumersGone.isSet() || q.t != nil {
			return nil // Send fails, or a transport holds the wait
		}
		if site.kind == waitSend {
			if len(q.ch) < cap(q.ch) {
				return nil
			}
			w.what = fmt.Sprintf("waits to send on %s (full, %d of %d)", q.name(), len(q.ch), cap(q.ch))
		} else {
			if len(q.ch) == 0 {
				return nil
			}
			w.what = fmt.Sprintf("waits for room on %s (capacity_bytes %d, %d held)", q.name(), q.capBytes, q.bytes.Load())
		}
		w.edge, w.full = q.edge.g, true
		w.waitsFor = q.liveConsumers()
		w.what += fmt.Sprintf(", read by %s", replicaNames(w.waitsFor))
	case waitGroup:
		g := site.g
		g.mu.Lock()
		rd := g.round
		if rd == nil || !rd.in[rep.index] {
			g.mu.Unlock()
			return nil // not yet arrived, or released
		}
		for i, left := range g.left {
			if !left && !rd.in[i] {
				w.waitsFor = append(w.waitsFor, rep.stage.replicas[i])
			}
		}
		arrived, members := rd.arrived, g.members
		g.mu.Unlock()
		w.what = fmt.Sprintf("waits at stage %s's group step for %s (%d of %d there)",
			rep.stage.g.Name, replicaNames(w.waitsFor), arrived, members)
	default:
		return nil
	}
	if len(w.waitsFor) == 0 {
		return nil
	}
	return w
}

// name is the queue as the status line shows it: the edge's name, with
// the queue's index when the edge has several.
func (q *queue) name() string {
	if len(q.edge.queues) == 1 {
		return q.edge.g.Name
	}
	return fmt.Sprintf("%s[%d]", q.edge.g.Name, q.index)
}

// liveProducers returns the producer replicas still holding q open.
func (q *queue) liveProducers() []*replica {
	from := q.edge.run.stage(q.edge.g.From.Stage.Name)
	var out []*replica
	for _, p := range q.Open() {
		out = append(out, from.replicas[p])
	}
	return out
}

// liveConsumers returns the consumer replicas of q still running.
func (q *queue) liveConsumers() []*replica {
	to := q.edge.run.stage(q.edge.g.To.Stage.Name)
	var out []*replica
	for _, c := range q.edge.g.Queues[q.index].Consumers {
		if rep := to.replicas[c]; rep.ended.Load() == 0 {
			out = append(out, rep)
		}
	}
	return out
}

func (rep *replica) name() string { return fmt.Sprintf("%s[%d]", rep.stage.g.Name, rep.index) }

func replicaNames(reps []*replica) string {
	names := make([]string, len(reps))
	for i, r := range reps {
		names[i] = r.name()
	}
	return strings.Join(names, ", ")
}

// Deadlock is the error of a run in which no replica can move: each one
// waits on a full queue, an empty queue or its group's step, for replicas
// that wait too.
type Deadlock struct {
	// Cycle is the loop of waits, each "STAGE[I] waits ...": the replica
	// of each line waits for the one on the next, the last for the first.
	Cycle []string
	// Others are the other replicas' waits, in stage order.
	Others []string
	// Fix says what would break the cycle.
	Fix string
	// Draining is set when the deadlock stopped a drain (the run then
	// ends aborted).
	Draining bool
}

func (d *Deadlock) Error() string {
	var b strings.Builder
	if d.Draining {
		b.WriteString("drain cannot complete: ")
	}
	b.WriteString("deadlock: no replica can move; each waits for the next, round a cycle:")
	for _, c := range d.Cycle {
		b.WriteString("\n    " + c)
	}
	if len(d.Others) > 0 {
		b.WriteString("\n  also waiting:")
		for _, o := range d.Others {
			b.WriteString("\n    " + o)
		}
	}
	if d.Fix != "" {
		b.WriteString("\n  " + d.Fix)
	}
	return b.String()
}

// newDeadlock names a cycle of the stuck waits.
func newDeadlock(stuck map[*replica]*stuckWait, draining bool) *Deadlock {
	d := &Deadlock{Draining: draining}
	// Start from the first replica in stage order, follow the first
	// replica each waits for until one repeats: every stuck replica waits
	// for another stuck one, so this closes a cycle.
	var order []*replica
	for rep := range stuck {
		order = append(order, rep)
	}
	slices.SortFunc(order, func(a, b *replica) int {
		return cmp.Or(cmp.Compare(a.stage.index, b.stage.index), cmp.Compare(a.index, b.index))
	})
	pos := map[*replica]int{}
	var path []*replica
	for rep := order[0]; ; rep = stuck[rep].waitsFor[0] {
		if i, seen := pos[rep]; seen {
			path = path[i:]
			break
		}
		pos[rep] = len(path)
		path = append(path, rep)
	}
	inCycle := map[*replica]bool{}
	var rr, full []string
	for _, rep := range path {
		inCycle[rep] = true
		w := stuck[rep]
		d.Cycle = append(d.Cycle, rep.name()+" "+w.what)
		if w.edge != nil && w.edge.Policy == graph.RoundRobin && !slices.Contains(rr, w.edge.Name) {
			rr = append(rr, w.edge.Name)
		}
		if w.full && !slices.Contains(full, w.edge.Name) {
			full = append(full, w.edge.Name)
		}
	}
	for _, rep := range order {
		if !inCycle[rep] {
			d.Others = append(d.Others, rep.name()+" "+stuck[rep].what)
		}
	}
	switch {
	case len(rr) > 0:
		d.Fix = fmt.Sprintf("fix: round_robin ties each queue of %s to fixed replicas, so one starved replica holds up the rest; "+
			"policy = \"shared\" lets any replica take any item (--set edge.%s.policy=shared)", quoteList(rr), rr[len(rr)-1])
	case len(full) > 0:
		d.Fix = fmt.Sprintf("fix: a larger capacity on %s gives the replicas room to get out of step (--set edge.%s.capacity=N)",
			quoteList(full), full[0])
	}
	return d
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, " and ")
}
