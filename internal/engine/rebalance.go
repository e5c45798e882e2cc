package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/hashicorp/hcl/v2"
)

// Moving replicas between the stages of a rebalance block while the run
// goes, in one process (Options.Rebalance).
//
// A rebalanced stage gets spare replicas at build, parked: wired to the
// stage's queues (its edges are all shared: one queue each) but not
// counted on them, not started, and left out of the report and the
// snapshots until they start. A move of a replica from stage A to stage
// B marks one running replica of A as leaving: its next Recv returns
// io.EOF, so it finishes the item in hand (its sends included) and
// returns like a replica whose input ended; its queues lose it as a
// producer and a consumer, while A's other replicas keep them open. Once
// it has returned, a parked replica of B starts on its device: counted
// on B's queues first (unless they have ended), then run. Nothing is
// lost or doubled: the items stay on the shared queues, whichever replica
// takes them.
//
// A move from the budget's spare replicas (a split that starts below the
// budget, From "") starts a parked replica at once, on the budget's
// device that the fewest replicas use (or the stage's own). The mover
// holds the run's wait group while a move may still start a replica, and
// lets it go once every replica has returned: a replica never starts
// after the run has ended.
//
// The stages that move are those whose kind keeps nothing between items
// (nodes.Spec Stateless), and group kinds whose state moves (Spec.Moves:
// drafter_train, lm_train), but not those that restart whole (Spec.Whole:
// a torch process group's world size is fixed), in one process and on a
// cluster, as the coordinator decides there (parked.go). Replicas that
// step together leave and join at a step boundary: the one that leaves leaves the group
// after its last step (its item in hand trained), and the others go on
// without it, their state as it was; the one that starts joins the
// group, and the next step waits for it too. Where the kind's state
// moves, the one that joins takes the group's state over first (its Keep,
// group.go): a member present marshals its own at its step boundary,
// and no step completes until the new member has it. Every item is
// trained once, in the step of the replica that took it, and the last
// member to leave holds them all.

// RebalanceFor is the policy of a run's rebalance: called at every
// sampling tick with a fresh snapshot, it returns the moves to make now
// (none: nil) and a function the engine calls with whether it made them,
// all at once, or none (a stage that has ended, no replica to spare).
type RebalanceFor func(*report.Snapshot) (moves []report.Move, done func(made bool))

// mover makes a run's moves.
type mover struct {
	policy RebalanceFor // nil on a cluster: the coordinator decides (parked.go)
	across bool         // on a cluster (parked.go)
	early  []string     // on a cluster, stages released before the run started here
	mu     sync.Mutex   // orders moves with replicas' starts
	// wg and ctx are execute's: a started replica is one more of the
	// run's goroutines, under the run's context. The mover holds one
	// count of wg until released: every replica has returned (settle).
	wg       *sync.WaitGroup
	ctx      context.Context
	released bool
	// made are the moves made so far, for the snapshots (under mu)
	made []report.Move
}

// madeSoFar returns the moves made so far (nil without a rebalance).
func (m *mover) madeSoFar() []report.Move {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]report.Move(nil), m.made...)
}

// Movable says why the replicas of g's rebalance block cannot move during
// a run in one process with reg's kinds, or returns nil when they can.
func Movable(g *graph.Graph, reg *nodes.Registry) error {
	if g.Rebalance == nil {
		return fmt.Errorf("the spec has no rebalance block")
	}
	if reg == nil {
		reg = nodes.Default
	}
	for _, name := range g.Rebalance.Stages {
		s := g.Stage(name)
		spec, ok := reg.Spec(s.Node)
		switch {
		case !ok:
			return fmt.Errorf("%sstage %q: node kind %q is not known", at(s.NodeRange), name, s.Node)
		case spec.Stateless:
		case spec.Moves && spec.Whole:
			return fmt.Errorf("%sstage %q: its group restarts whole (node kind %s: a torch process group cannot shrink or grow), so its members do not leave or join during a run", at(s.NodeRange), name, s.Node)
		case spec.Moves && steps(spec, s.Config):
			// A member leaves at a step boundary, and one joins by taking
			// the group's state over (group.go).
		default:
			return fmt.Errorf("%sstage %q: its replicas keep state between items (node kind %s), and only the replicas of a stateless kind, or of a group kind whose state moves, move during a run", at(s.NodeRange), name, s.Node)
		}
	}
	return nil
}

// at is "FILE:LINE:COL: " for a range of the spec, "" for none.
func at(r hcl.Range) string {
	if r.Filename == "" {
		return ""
	}
	return fmt.Sprintf("%s:%d:%d: ", r.Filename, r.Start.Line, r.Start.Column)
}

// steps reports whether a kind's replicas step together for a config.
func steps(spec *nodes.Spec, cfg *graph.Config) bool {
	if spec.Sync != nil && spec.Sync(cfg) {
		return true
	}
	if spec.Sim != nil {
		if m, err := spec.Sim(cfg); err == nil && m.Sync {
			return true
		}
	}
	return false
}

// parkSlots gives each rebalanced stage its parked replicas, wired to
// the stage's queues: as many as the budget, so that a run can move
// replicas there and back.
func (r *run) parkSlots() error {
	rb := r.g.Rebalance
	if rb == nil {
		return nil
	}
	if r.opts.Parked != nil {
		return r.parkAcross()
	}
	if r.opts.Rebalance == nil {
		return nil
	}
	if r.opts.Here != nil || r.opts.Transport != nil || r.opts.Chain != nil || r.opts.Group != nil {
		return fmt.Errorf("rebalance: a run across hosts moves replicas as its coordinator decides (Options.Parked), not by a policy of its own")
	}
	if err := Movable(r.g, r.opts.Registry); err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	r.moves = &mover{policy: r.opts.Rebalance}
	reg := r.opts.Registry
	if reg == nil {
		reg = nodes.Default
	}
	for _, name := range rb.Stages {
		s := r.stage(name)
		n := len(s.replicas)
		slots := n + rb.Replicas
		s.slots = slots
		_, quiescer := s.node.(nodes.Quiescer)
		grown := newGroup(slots)
		for i := n; i < slots; i++ {
			grown.left[i] = true
		}
		grown.members = n
		if spec, _ := reg.Spec(s.g.Node); spec != nil && spec.Moves && !spec.Stateless {
			grown.carryState() // its members hand their state to those that join
		}
		s.group = grown
		for i := n; i < slots; i++ {
			rep := &replica{
				stage: s, index: i, device: s.g.Device(i), countSites: quiescer, metrics: newMetrics(),
				remoteSite: waitSite{kind: waitRemoteGroup},
				inputs:     map[string]*input{}, outputs: map[string]*output{},
			}
			rep.parked.Store(true)
			for _, p := range s.g.Inputs {
				in := &input{r: rep}
				in.site = waitSite{kind: waitRecv, in: in}
				rep.inputs[p.Name] = in
			}
			for _, p := range s.g.Outputs {
				rep.outputs[p.Name] = &output{r: rep}
			}
			s.replicas = append(s.replicas, rep)
		}
		for _, e := range r.edges {
			q := e.queues[0] // a rebalanced stage's edges are shared: one queue
			if e.g.From.Stage == s.g {
				q.addProducers(n, slots)
				for _, rep := range s.replicas[n:] {
					oq := newOutQueue(q)
					q.senders = append(q.senders, oq)
					out := rep.outputs[e.g.From.Name]
					out.edges = append(out.edges, &outEdge{queues: []*outQueue{oq}})
					out.one = nil
					if len(out.edges) == 1 && q.chain == nil {
						out.one = oq
					}
				}
			}
			if e.g.To.Stage == s.g {
				for i, rep := range s.replicas[n:] {
					q.consumerIdx = append(q.consumerIdx, n+i)
					iq := newInQueue(q)
					q.receivers = append(q.receivers, iq)
					in := rep.inputs[e.g.To.Name]
					in.all = append(in.all, iq)
					in.live = append(in.live, iq)
					in.one = nil
					if len(in.all) == 1 {
						in.one = iq
					}
				}
			}
		}
	}
	return nil
}

// addProducers adds the parked producers from to upto-1 to the queue's
// list, not live (not counted) until they start.
func (q *queue) addProducers(from, upto int) {
	live := make([]atomic.Bool, len(q.live)+upto-from)
	for i := range q.live {
		live[i].Store(q.live[i].Load())
	}
	q.live = live
	for i := from; i < upto; i++ {
		q.producers = append(q.producers, i)
	}
}

// rebalance asks the policy at a sampling tick and makes its moves.
func (r *run) rebalance(now time.Time) {
	if r.stop.isSet() || r.isDraining() {
		return
	}
	moves, done := r.moves.policy(r.snapshot(now))
	if len(moves) == 0 {
		return
	}
	made := r.move(moves)
	if done != nil {
		done(made)
	}
}

// move marks the leaving replicas and the parked ones that start after
// them, and starts those that take the budget's spare replicas, for every
// move or none.
func (r *run) move(moves []report.Move) bool {
	m := r.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released {
		return false
	}
	type pair struct{ leave, start *replica } // leave nil: a spare replica
	var pairs []pair
	taken := map[*replica]bool{}
	for _, mv := range moves {
		to := r.stage(mv.To)
		if to == nil || mv.Replicas < 1 || !r.g.Rebalanced(mv.To) || (mv.From != "" && !r.g.Rebalanced(mv.From)) {
			return false
		}
		if to.ended() {
			return false
		}
		for range mv.Replicas {
			var leave *replica
			if mv.From != "" {
				if leave = r.stage(mv.From).leaver(taken); leave == nil {
					return false
				}
				taken[leave] = true
			}
			start := to.parked(taken)
			if start == nil {
				return false
			}
			taken[start] = true
			pairs = append(pairs, pair{leave, start})
		}
	}
	for _, p := range pairs {
		p.start.reserved = true
	}
	m.made = append(m.made, moves...)
	for _, p := range pairs {
		if p.leave == nil {
			// The reserved replica of lowest index, as succeed starts
			// them: the started ones keep contiguous indices.
			next := p.start.stage.firstReserved()
			r.startParked(next, r.spareDevice(next))
			continue
		}
		p.leave.successor.Store(p.start.stage)
		p.leave.retiring.Store(true)
		for _, in := range p.leave.inputs {
			in.retire.Store(true)
		}
	}
	return true
}

// spareDevice is where a replica of the budget's spare starts: the
// budget's device that the fewest running replicas of the rebalanced
// stages use, or the stage's own without a devices list.
func (r *run) spareDevice(rep *replica) string {
	devs := r.g.Rebalance.Devices
	if len(devs) == 0 {
		return rep.stage.g.Device(rep.index)
	}
	use := map[string]int{}
	for _, name := range r.g.Rebalance.Stages {
		for _, o := range r.stage(name).replicas {
			if o.running() {
				use[o.device]++
			}
		}
	}
	best := devs[0]
	for _, d := range devs {
		if use[d] < use[best] {
			best = d
		}
	}
	return best
}

// leaver is the stage's running replica of highest index that is not
// leaving, if another such one stays.
func (s *stage) leaver(taken map[*replica]bool) *replica {
	var pick *replica
	running := 0
	for _, rep := range s.replicas {
		if rep.running() && !rep.retiring.Load() && !taken[rep] {
			running++
			pick = rep
		}
	}
	if running < 2 {
		return nil
	}
	return pick
}

// parked is the stage's parked replica of lowest index not yet reserved.
func (s *stage) parked(taken map[*replica]bool) *replica {
	for _, rep := range s.replicas {
		if rep.parked.Load() && !rep.reserved && !taken[rep] {
			return rep
		}
	}
	return nil
}

// ended reports whether the stage has no running replica: its input has
// ended (or it failed), and a replica started now would have nothing to
// do.
func (s *stage) ended() bool {
	for _, rep := range s.replicas {
		if rep.running() && !rep.retiring.Load() {
			return false
		}
	}
	return true
}

// running: started (not parked) and not yet returned, nor freed (its
// node has returned: Free).
func (rep *replica) running() bool {
	return !rep.parked.Load() && rep.ended.Load() == 0 && !rep.freed.Load()
}

// succeed starts the parked replica that takes over rep's device, once
// rep has returned from a move, unless the run is ending or the
// successor's queues have.
func (r *run) succeed(rep *replica) {
	to := rep.successor.Load()
	if to == nil || r.moves == nil || !rep.handedOver.CompareAndSwap(false, true) {
		return
	}
	m := r.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.stop.isSet() || r.isDraining() || m.ctx.Err() != nil {
		return
	}
	// The reserved replica of lowest index starts first, whichever
	// leaver returns first: the stage's started replicas keep contiguous
	// indices, as the snapshots list them.
	if next := to.firstReserved(); next != nil {
		r.startParked(next, rep.device)
	}
}

// firstReserved is the stage's parked replica of lowest index chosen to
// start, or nil.
func (s *stage) firstReserved() *replica {
	for _, c := range s.replicas {
		if c.parked.Load() && c.reserved {
			return c
		}
	}
	return nil
}

// startParked starts a parked replica on device, counted first on its
// queues, unless they have ended. The caller holds the mover's lock.
func (r *run) startParked(next *replica, device string) {
	m := r.moves
	if m.across {
		r.startParkedAcross(next, device)
		return
	}
	// Count it on its queues while they are open: a queue none of
	// whose producers is left has closed, and none of whose consumers is
	// left has gone.
	var outs, ins []*queue
	ok := true
	for _, out := range next.outputs {
		for _, oe := range out.edges {
			q := oe.queues[0].q
			if !addIfAny(&q.producersLeft) {
				ok = false
				break
			}
			outs = append(outs, q)
		}
	}
	for _, in := range next.inputs {
		if !ok {
			break
		}
		for _, iq := range in.all {
			if !addIfAny(&iq.q.consumersLeft) {
				ok = false
				break
			}
			ins = append(ins, iq.q)
		}
	}
	// A group whose state moves takes the replica only while a member is
	// present to take the state from.
	if !ok || !next.stage.group.join(next.index) {
		for _, q := range outs {
			q.producerDone(next.index)
		}
		for _, q := range ins {
			q.consumerDone()
		}
		return
	}
	for _, q := range outs {
		for i, p := range q.producers {
			if p == next.index {
				q.live[i].Store(true)
			}
		}
	}
	next.device = device
	now := time.Now()
	next.begun.Store(&now)
	// Shown, and counted as running, once everything above is written.
	r.launch(next, m.ctx, m.wg, func() {
		next.ended.Store(0)
		next.parked.Store(false)
	})
}

// settle lets the run's wait group go once every replica has returned:
// no move can start one after that.
func (r *run) settle() {
	m := r.moves
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released {
		return
	}
	if m.wg == nil {
		return // the run has not started
	}
	ending := m.ctx.Err() != nil || r.stop.isSet()
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.running() || m.across && !ending && rep.waiting() {
				return
			}
		}
	}
	m.released = true
	m.wg.Done()
}

// addIfAny adds one to n unless it is 0.
func addIfAny(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}
