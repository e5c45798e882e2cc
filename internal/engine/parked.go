package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// Moves on a cluster (Options.Parked).
//
// On a cluster the coordinator decides the moves, from every worker's
// figures, and each worker's engine makes its part of one. The graph every
// worker builds has each rebalanced stage's spare slots as replicas of
// their own (the last Parked[stage] of the stage), placed on the workers
// whose devices they may take and wired to the stage's queues as any
// replica is. Parked, a slot counts as a producer and a consumer of its
// queues, so that no engine's side of a queue closes, and no end of it is
// written, while the slot may still start; but it takes nothing: a queue
// on a transport whose consumers in this engine have never started pulls
// nothing until one of them starts. (Once one has, one stays until the
// input ends: the coordinator never moves the last replica of a stage
// away from a worker, for what that worker's side of the queue fetched
// would wait there unread; takeOut fails the run if it ever did.)
//
// Move marks a running replica here as leaving and a parked slot here as
// the one that starts on its device once it has returned, as a move in
// one process does. Release takes a stage's slots that have not started
// out of their queues, as if they had returned at once: the coordinator
// lets them go once every replica that feeds the stage's inputs has
// finished (a slot started now would find nothing), or the run drains or
// fails; one asked for before the run started here is made as it starts.
// The engine's run does not end while a slot here is parked and not
// released, unless it is stopped. A share taking over a lost worker's
// replicas runs the slots a move had started (Options.Started) and not
// the replicas a move took away (Options.Left).
//
// A group stage moves on a cluster as in one process (MovableAcross):
// the member that leaves leaves the group at a step boundary, and a slot
// that starts joins it (Joiner), taking the group's state over where it
// moves, as a member restarted elsewhere does (package host's Host.Park,
// internal/cluster/group/host, and group.OpJoin).

// MovableAcross says why the replicas of g's rebalance block cannot move
// during a run across hosts with reg's kinds, or returns nil when they
// can: those that move in one process (Movable).
func MovableAcross(g *graph.Graph, reg *nodes.Registry) error {
	return Movable(g, reg)
}

// A Joiner is a RemoteGroup told that a parked replica joins: it takes
// the group's state over, as a member restarted elsewhere does.
type Joiner interface {
	Joins(replica int)
}

// parkAcross marks the last Options.Parked[stage] replicas of each
// rebalanced stage parked, but those a move has started already
// (Options.Started); and the replicas a move took away (Options.Left),
// which do not run again here.
func (r *run) parkAcross() error {
	if err := MovableAcross(r.g, r.opts.Registry); err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	r.moves = &mover{across: true}
	for name, p := range r.opts.Parked {
		s := r.stage(name)
		switch {
		case s == nil:
			return fmt.Errorf("rebalance: spare slots for stage %q, which is not in the graph", name)
		case !r.g.Rebalanced(name):
			return fmt.Errorf("rebalance: spare slots for stage %q, which the rebalance block does not name", name)
		case p < 0 || p >= len(s.replicas):
			return fmt.Errorf("rebalance: %d spare slots for stage %q, which has %d replicas with them", p, name, len(s.replicas))
		}
		s.slots = len(s.replicas)
		g := newGroup(s.slots)
		for i := s.slots - p; i < s.slots; i++ {
			if !slices.Contains(r.opts.Started[name], i) {
				g.left[i] = true
				g.members--
				s.replicas[i].parked.Store(true)
			}
		}
		s.group = g
	}
	for name, left := range r.opts.Left {
		s := r.stage(name)
		if s == nil {
			return fmt.Errorf("rebalance: replicas of stage %q left, which is not in the graph", name)
		}
		for _, i := range left {
			// Left names the run's replicas a move took away, on every
			// worker: only those of this engine are gone here. (Placement
			// marks the others away only after this: one counted out of
			// its queues here would end this engine's side of a queue
			// before its last consumer here returned.)
			if i >= 0 && i < len(s.replicas) && (r.opts.Here == nil || r.opts.Here(s.g, i)) {
				s.replicas[i].gone = true
			}
		}
	}
	return nil
}

// releaseAtStart takes out of their queues, once the run has started
// here, the replicas a move took away before (Options.Left: they ran on a
// worker since lost) and the slots of the stages released before
// (Options.Released), and those a Release asked for before the run
// started.
func (r *run) releaseAtStart() {
	m := r.moves
	if m == nil || !m.across {
		return
	}
	var gone []*replica
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.gone {
				gone = append(gone, rep)
			}
		}
	}
	r.takeOut(gone)
	m.mu.Lock()
	stages := append(slices.Clone(r.opts.Released), m.early...)
	m.early = nil
	m.mu.Unlock()
	for _, name := range stages {
		r.release(name)
	}
	r.settle()
}

// waiting reports whether rep is a parked replica that may still start
// (on a cluster: not released).
func (rep *replica) waiting() bool {
	return rep.parked.Load() && !rep.away && !rep.released
}

// startParkedAcross starts a parked replica on device, unless it was
// released. The caller holds the mover's lock.
func (r *run) startParkedAcross(next *replica, device string) {
	m := r.moves
	if next.released || !next.stage.group.join(next.index) {
		return
	}
	if j, ok := next.stage.remote.(Joiner); ok {
		j.Joins(next.index)
	}
	next.device = device
	now := time.Now()
	next.begun.Store(&now)
	r.launch(next, m.ctx, m.wg, func() {
		next.ended.Store(0)
		next.parked.Store(false)
	})
	for _, in := range next.inputs {
		for _, iq := range in.all {
			r.startPump(iq.q)
		}
	}
}

// Move is a move the coordinator of a run across hosts decided, this
// engine's part of it: replica leave of stage from leaves after its item
// in hand, and the parked replica start of stage to starts on its device
// once it has returned.
func (p *Pipeline) Move(from string, leave int, to string, start int) error {
	r := p.r
	m := r.moves
	if m == nil || !m.across {
		return errors.New("this run does not move replicas")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	fs, ts := r.stage(from), r.stage(to)
	switch {
	case m.released:
		return errors.New("the run has ended")
	case fs == nil || ts == nil || !r.g.Rebalanced(from) || !r.g.Rebalanced(to) || from == to:
		return fmt.Errorf("no move from stage %q to %q: both must be rebalanced stages", from, to)
	case leave < 0 || leave >= len(fs.replicas) || start < 0 || start >= len(ts.replicas):
		return fmt.Errorf("no replica %s[%d] or %s[%d]", from, leave, to, start)
	}
	lv, st := fs.replicas[leave], ts.replicas[start]
	switch {
	case lv.away || st.away:
		return fmt.Errorf("replicas %s[%d] and %s[%d] are not both in this engine", from, leave, to, start)
	case !lv.running() || lv.retiring.Load():
		return fmt.Errorf("replica %s[%d] is not running", from, leave)
	case !st.parked.Load() || st.reserved || st.released:
		return fmt.Errorf("replica %s[%d] is not parked", to, start)
	}
	st.reserved = true
	lv.successor.Store(ts)
	lv.retiring.Store(true)
	for _, in := range lv.inputs {
		in.retire.Store(true)
	}
	return nil
}

// Release takes the parked replicas of stage in this engine that have not
// started out of their queues, as if they had returned at once: a move
// will not start them. It returns how many it released.
func (p *Pipeline) Release(stage string) int { return p.r.release(stage) }

func (r *run) release(stage string) int {
	m := r.moves
	s := r.stage(stage)
	if m == nil || !m.across || s == nil {
		return 0
	}
	m.mu.Lock()
	if m.wg == nil { // before the run started here: at its start
		m.early = append(m.early, stage)
		m.mu.Unlock()
		return 0
	}
	var gone []*replica
	for _, rep := range s.replicas {
		if rep.waiting() {
			rep.released, rep.reserved = true, false
			gone = append(gone, rep)
		}
	}
	m.mu.Unlock()
	r.takeOut(gone)
	r.settle()
	return len(gone)
}

// takeOut takes replicas that will not run out of their queues, as if
// they had returned at once. A consumer side left with items taken and
// no replica to read them fails the run (it cannot happen: a move leaves
// a replica of its stage running on its worker, coordinator's pick).
func (r *run) takeOut(reps []*replica) {
	for _, rep := range reps {
		for _, out := range rep.outputs {
			for _, oe := range out.edges {
				for _, oq := range oe.queues {
					oq.q.producerDone(rep.index)
				}
			}
		}
		for _, in := range rep.inputs {
			for _, iq := range in.all {
				q := iq.q
				if _, unread := q.consumerDone(); unread > 0 {
					r.fail(fmt.Errorf("edge %q: %d items taken for stage %q in this engine, and no replica of it left here to read them", q.edge.g.Name, unread, q.edge.g.To.Stage.Name))
				}
			}
		}
	}
}

// pumps are the run's transport pumps: started with the run for every
// queue with a consumer here that is not parked, and for the others as
// a parked consumer starts (startPump).
type pumps struct {
	ctx context.Context
	wg  sync.WaitGroup
	mu  sync.Mutex
	on  map[*queue]bool
	// stopped: the run is over, no pump starts
	stopped bool
}

// startPump starts q's pump, unless it runs or q has no transport.
func (r *run) startPump(q *queue) {
	ps := r.pumps
	if q.t == nil || ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.stopped || ps.on[q] {
		return
	}
	ps.on[q] = true
	ps.wg.Go(func() {
		if err := q.pump(ps.ctx); err != nil {
			r.fail(fmt.Errorf("edge %q: %s: transport: %w", q.edge.g.Name, q.name(), err))
		}
	})
}

// Free says that the replica's node has returned, though a runtime
// around it still waits before it returns in turn (a member of a group
// across workers that saves waits for the group's final save to settle
// what it trained): a move that takes its device starts the replica that
// takes over now, not at the run's end.
//
// A replica freed is no longer running (Move refuses it): under the
// mover's lock, so that a Move either sees it freed or has named the
// successor that succeed starts.
func (rep *replica) Free() {
	r := rep.stage.run
	if m := r.moves; m != nil {
		m.mu.Lock()
		rep.freed.Store(true)
		m.mu.Unlock()
	}
	r.succeed(rep)
}
