package engine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
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
// Options.DeadlockConfirm: nothing moved in between, and nothing can.
//
// What the detector cannot see it does not judge: a wait made with a
// context other than the one the replica's Run was given may end by that
// context, so a replica in such a wait counts as able to move, and so
// does a replica with two waits in progress at once. A node that works in
// goroutines of its own while one of them waits should pass its waits a
// context derived from Run's.
//
// Unless the node says it is quiescent (nodes.Quiescer). Every wait site
// (a port's, a queue's as one producer sees it, a member's at its group)
// counts the waits in progress on it, whatever their context: one atomic
// add as a blocking wait begins and one as it ends, nothing on the fast
// path. While the node's Quiescent(replica) reports true, the detector
// reads every site of the replica that has waits in progress, and the
// replica is stuck iff each of those waits cannot end (the conditions
// above, per site) and the sites' counts add up to the waits in progress
// in the replica's idle and blocked totals: a wait of the replica on
// anything else (a site the engine cannot read) keeps it able to move. A
// goroutine of the node working outside any wait is invisible to both
// counts; keeping the replica movable then is Quiescent's part of the
// contract: it reports true only when every goroutine of the node for
// that replica is in such a wait or blocked on what only another
// replica's progress, through one of those waits, can bring.
//
// The plugin host (plugins/host) is such a node. A plugin replica is a
// plugin process running the node and, in dflow, goroutines that pump its
// stream: a feeder per input port (wait for the plugin's credit, Recv on
// the port, send the item), an outlet per output port (take an item the
// plugin sent from the port's buffer, Send it on, grant the plugin credit
// again) and the stream's reader (items into the outlets' buffers, credit
// to the feeders). The plugin's SDK says Waiting{seen} when its node is
// in exactly one SDK call and that call is blocked (a Recv on a port with
// nothing received and not ended, a Send without credit), after every
// message the node's calls made (items, credit for its inputs) is on the
// stream, with seen the number of dflow's messages it had received when
// it found the call blocked. The host's Quiescent is true iff its latest
// Waiting said waiting, seen equals the messages dflow has sent on the
// stream (so the plugin has everything dflow ever sent it, and nothing
// since), no item from the plugin is in an outlet's buffer or the
// reader's hands, and no feeder holds an item or end-of-input taken from
// its port and not yet sent. Then each goroutine is in one of these:
//   - the plugin's node: blocked, and only a message from dflow can
//     release it (its stream is in order: every item and grant it made
//     came before Waiting). Any message dflow sends makes the counts
//     differ, so Quiescent turns false before the node can move.
//   - the reader: blocked on the stream, which carries nothing while the
//     node is blocked (the plugin sends only what its node's calls make).
//   - a feeder waiting for credit: only the plugin grants it, and the
//     plugin's grants all came before Waiting (then the feeder has it and
//     is not waiting for it). A feeder in Recv on its port: a wait on the
//     port's site, which the detector reads (an empty queue with live
//     producers is one that cannot end). A feeder that has taken an item
//     and not yet sent it counts as holding one: Quiescent is false.
//   - an outlet with an empty buffer: waits for the reader, which waits
//     for the plugin. An outlet in Send: a wait on the queue's site,
//     read by the detector (a full queue with live consumers cannot end).
//   - the replica's Run goroutine: in the reader (it is the reader).
//
// So while Quiescent is true the replica can move only through a wait on
// one of its sites, which the detector judges exactly; the few
// instructions between a goroutine's state and its accounting (a Recv
// that has just returned, a credit just granted) are covered by the
// confirm window and the progress mark, as for every other replica. An
// older plugin, which does not say Waiting, is never quiescent.
const deadlockCheckEvery = 100 * time.Millisecond

// DefaultDeadlockConfirm is how long a stuck state must hold, unchanged,
// before the run fails, unless Options.DeadlockConfirm says otherwise.
const DefaultDeadlockConfirm = time.Second

// Deadlocked reports whether the run's replicas are, right now, all in
// waits that cannot end (before the detector has confirmed it): for
// tests that must act between a deadlock forming and its being declared.
func (p *Pipeline) Deadlocked() bool { return p.r.stuckWaits() != nil }

type waitKind int8

const (
	waitOpaque waitKind = iota // the engine cannot tell what ends it
	waitRecv                   // an item on one of a port's queues
	waitSend                   // room on a full queue
	waitBytes                  // room in a queue's capacity_bytes budget
	waitGroup                  // the rest of the group at a collective
	// waitRemoteGroup: the rest of a group across hosts, which the
	// coordinator hosts and judges (waits.go); the engine's own detector
	// counts it as able to end
	waitRemoteGroup
)

// waitSite is what a blocking wait needs to end. Ports and groups hold
// theirs, so that beginning a wait stores a pointer and allocates nothing.
type waitSite struct {
	// active counts the waits in progress on the site, with any context
	// (not kept for opaqueWait).
	active atomic.Int32
	kind   waitKind
	in     *input // waitRecv
	q      *queue // waitSend, waitBytes
	g      *group // waitGroup
}

// opaqueWait marks a wait that the engine cannot read: made with a
// context other than the replica's own, or on nothing the engine knows.
// It counts no waits (it is shared).
var opaqueWait = &waitSite{kind: waitOpaque}

// detector is the sampler's deadlock state.
type detector struct {
	next    int64         // nanotime of the next check
	since   int64         // nanotime the current stuck state was first seen; 0: none
	mark    int64         // the progress mark then
	confirm time.Duration // Options.DeadlockConfirm
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
	if time.Duration(now-d.since) < d.confirm {
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
	full     bool         // the wait is for room on a full queue
	also     []*stuckWait // a quiescent replica's other waits, in what and waitsFor too
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
			var w *stuckWait
			if q, ok := s.node.(nodes.Quiescer); ok && q.Quiescent(rep.index) {
				w = rep.stuckSites()
			} else {
				_, _, _, inIdle, inBlocked := rep.waitTotals()
				if inIdle+inBlocked != 1 {
					return nil // working, or waiting twice at once
				}
				w = rep.stuckWait(rep.waitOn.Load())
			}
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

// stuckSites reads every wait in progress on the replica's sites, for a
// quiescent node: nil unless there is one, each cannot end, and they are
// all the waits in progress of the replica.
func (rep *replica) stuckSites() *stuckWait {
	sites, ok := rep.waitingSites()
	if !ok {
		return nil
	}
	var all *stuckWait
	for _, site := range sites {
		w := rep.stuckWait(site)
		if w == nil {
			return nil
		}
		if all == nil {
			all = w
			continue
		}
		all.what += "; and " + w.what
		for _, o := range w.waitsFor {
			if !slices.Contains(all.waitsFor, o) {
				all.waitsFor = append(all.waitsFor, o)
			}
		}
		all.also = append(all.also, w)
	}
	return all
}

// waitingSites are the replica's sites with waits in progress; ok is
// false unless there is one and they hold all the replica's waits in
// progress (not so for a wait on something the engine cannot read, or one
// just begun or ended).
func (rep *replica) waitingSites() (sites []*waitSite, ok bool) {
	_, _, _, inIdle, inBlocked := rep.waitTotals()
	waits := inIdle + inBlocked
	if waits == 0 {
		return nil, false
	}
	seen := 0
	for _, site := range rep.sites() {
		if n := int(site.active.Load()); n > 0 {
			seen += n
			sites = append(sites, site)
		}
	}
	return sites, seen == waits
}

// sites are the replica's wait sites, sends before receives (a stuck
// replica's message then leads with what it holds up), each in port
// order.
func (rep *replica) sites() []*waitSite {
	var sites []*waitSite
	for _, name := range slices.Sorted(maps.Keys(rep.outputs)) {
		for _, oe := range rep.outputs[name].edges {
			for _, oq := range oe.queues {
				sites = append(sites, &oq.full, &oq.bytesFull)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rep.inputs)) {
		sites = append(sites, &rep.inputs[name].site)
	}
	if rep.stage.remote != nil {
		sites = append(sites, &rep.remoteSite)
	} else if g := rep.stage.group; g != nil {
		sites = append(sites, &g.sites[rep.index])
	}
	return sites
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
	for _, c := range q.consumerIdx {
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

// Deadlock is the error of a run in which no replica can move (defined in
// package report, so that the public run package gives callers the very
// type, not a copy).
type Deadlock = report.Deadlock

// newDeadlock names a cycle of the stuck waits.
func newDeadlock(stuck map[*replica]*stuckWait, draining bool) *Deadlock {
	var order []*replica
	for rep := range stuck {
		order = append(order, rep)
	}
	slices.SortFunc(order, func(a, b *replica) int {
		return cmp.Or(cmp.Compare(a.stage.index, b.stage.index), cmp.Compare(a.index, b.index))
	})
	pos := map[*replica]int{}
	for i, rep := range order {
		pos[rep] = i
	}
	waits := make([]StuckWait, len(order))
	for i, rep := range order {
		w := stuck[rep]
		sw := StuckWait{Name: rep.name(), What: w.what}
		for _, o := range w.waitsFor {
			sw.WaitsFor = append(sw.WaitsFor, pos[o])
		}
		for _, w := range append([]*stuckWait{w}, w.also...) {
			if w.edge != nil {
				sw.Edges = append(sw.Edges, w.edge)
				if w.full {
					sw.Full = append(sw.Full, w.edge)
				}
			}
		}
		waits[i] = sw
	}
	return NewDeadlock(waits, draining)
}

// StuckWait is one replica's wait that cannot end, as a deadlock names
// it: in one engine, or across hosts (internal/cluster).
type StuckWait struct {
	Name string // "drafter[0]", or "drafter[0] on worker2"
	What string // "waits to send on hs[0] (full, 8 of 8), read by drafter[0]"
	// WaitsFor are the waits (indices in the slice given to NewDeadlock)
	// of the replicas that could end this one.
	WaitsFor []int
	// Edges are the edges the wait is on; Full those it waits for room on.
	Edges, Full []*graph.Edge
}

// NewDeadlock names a cycle of waits, each waiting for others of them,
// given in stage order, and the fix that would break it.
func NewDeadlock(waits []StuckWait, draining bool) *Deadlock {
	d := &Deadlock{Draining: draining}
	// Start from the first replica in stage order, follow the first
	// replica each waits for until one repeats: every stuck replica waits
	// for another stuck one, so this closes a cycle.
	pos := map[int]int{}
	var path []int
	for i := 0; ; i = waits[i].WaitsFor[0] {
		if at, seen := pos[i]; seen {
			path = path[at:]
			break
		}
		pos[i] = len(path)
		path = append(path, i)
	}
	inCycle := map[int]bool{}
	var rr, full []string
	for _, i := range path {
		inCycle[i] = true
		w := waits[i]
		d.Cycle = append(d.Cycle, w.Name+" "+w.What)
		for _, e := range w.Edges {
			if e.Policy == graph.RoundRobin && !slices.Contains(rr, e.Name) {
				rr = append(rr, e.Name)
			}
		}
		for _, e := range w.Full {
			if !slices.Contains(full, e.Name) {
				full = append(full, e.Name)
			}
		}
	}
	for i, w := range waits {
		if !inCycle[i] {
			d.Others = append(d.Others, w.Name+" "+w.What)
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
