package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/dflow-dev/dflow/nodes"
)

// group is a stage's replica group. A collective completes when every
// member still present has arrived and waits in it; a member that leaves
// (its Run returned, or it called Leave) is no longer waited for, and its
// leaving can itself complete a round the others are waiting in. So
// uneven ends never hang, in any order. A member whose wait ends on its
// context before the round completes is out of that round (its arrival
// and its vector withdrawn: withdrawLocked), so every member present
// takes every step that completes, and the last member to leave holds
// the last step any member took.
type group struct {
	mu      sync.Mutex
	members int
	left    []bool
	round   *round
	rounds  int64 // completed, for the deadlock detector
	// sites: member i's waits at a collective, for the deadlock detector
	// (one per member, so that each counts its own waits in progress)
	sites []waitSite

	// A rebalanced stage's group whose kind's state moves (nodes.Spec
	// Moves, rebalance.go): states are what each member's Keep recorded;
	// fresh marks a member that joined during the run and has not yet
	// taken the group's state over (nfresh of them); hand is the state
	// handed to them, made by a member at a step boundary (nil: none
	// wanted since the last step).
	moves  bool
	states []nodes.State
	fresh  []bool
	nfresh int
	hand   *handover
}

// handover is the group's state as of one step boundary, for the members
// that join there: one member present marshals it (its next collective,
// or its leaving), and every member that joined takes the same bytes.
// While a member that joined has not taken it, no step completes (that
// member counts in every round and has not arrived), so the state of
// every member present stays the one handed.
type handover struct {
	ready chan struct{} // closed once b or err is set
	b     []byte
	err   error
	from  int // the member that marshals it; -1: none yet
}

// round is one collective in progress: a barrier or an all-reduce.
type round struct {
	arrived int
	in      []bool    // in[i]: member i has arrived, and waits in the round
	sum     nodes.Sum // nil for a barrier
	length  int       // of the vectors summed
	n       int       // contributors to sum
	// xs[i] is member i's vector while it waits, and order the members
	// summed, in arrival order: the sum made again without a member that
	// is out of the round (withdrawLocked)
	xs    []nodes.Reducible
	order []int
	done  chan struct{}
	err   error
	// ask, in a group whose state moves, is closed when a member joins
	// during the round and no member has been asked for the state yet:
	// the members waiting in the round wake, and one of them marshals it
	ask   chan struct{}
	asked bool
}

func newGroup(n int) *group {
	g := &group{members: n, left: make([]bool, n), sites: make([]waitSite, n)}
	for i := range g.sites {
		g.sites[i] = waitSite{kind: waitGroup, g: g}
	}
	return g
}

// carryState makes g a group whose state moves: a member that joins takes
// it over (Keep).
func (g *group) carryState() {
	g.moves = true
	g.states, g.fresh = make([]nodes.State, len(g.left)), make([]bool, len(g.left))
}

// errLeft is returned to a replica that calls a collective after leaving.
var errLeft = errors.New("replica has left its group")

// arrive joins the current round, contributing x when it is an
// all-reduce (x's Sum adds the members' vectors in arrival order), and
// returns the round to wait on. Where a member that joined waits for the
// group's state and none has been asked for it, replica (at its step
// boundary: it has applied its last step and not the next) is: it gives
// the handover returned (nil: none) once out of the lock, the round
// unable to complete until the members that joined have taken it.
func (g *group) arrive(replica int, x nodes.Reducible, reduce bool) (*round, *handover, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left[replica] {
		return nil, nil, errLeft
	}
	if g.moves && g.fresh[replica] {
		return nil, nil, errNoState
	}
	if g.round == nil {
		g.round = &round{done: make(chan struct{}), in: make([]bool, len(g.left))}
		if reduce {
			g.round.sum, g.round.length = x.NewSum(), x.Len()
			g.round.xs = make([]nodes.Reducible, len(g.left))
		}
		if g.moves {
			g.round.ask = make(chan struct{})
		}
	}
	rd := g.round
	switch {
	case reduce != (rd.sum != nil):
		rd.err = fmt.Errorf("replicas mixed Barrier and AllReduceSum in one step")
	case reduce && x.Len() != rd.length:
		rd.err = fmt.Errorf("AllReduceSum buffers differ in length: %d and %d", x.Len(), rd.length)
	case reduce:
		if err := rd.sum.Add(x); err != nil {
			rd.err = fmt.Errorf("AllReduceSum: %w", err)
		}
		rd.n++
		rd.xs[replica], rd.order = x, append(rd.order, replica)
	}
	rd.arrived++
	rd.in[replica] = true
	h := g.donorLocked(replica)
	g.completeLocked()
	return rd, h, nil
}

// completeLocked releases the current round if every present member has
// arrived. A member that joined and has not taken the state over has not
// arrived, so a round that completes leaves none: the state handed is
// that of a step now past.
func (g *group) completeLocked() {
	if g.round != nil && g.round.arrived >= g.members {
		close(g.round.done)
		g.round = nil
		g.rounds++
		if g.nfresh == 0 {
			g.hand = nil
		}
	}
}

// withdrawLocked takes replica's arrival out of rd, the round in
// progress: a member whose wait ended on its context before the round
// completed, or that leaves while in it, takes no part in it. The round
// then completes only once every member present is waiting in it, and
// sums only their vectors (made again, in arrival order, without
// replica's); a round that no member is left waiting in ends.
func (g *group) withdrawLocked(replica int, rd *round) {
	if g.round != rd || !rd.in[replica] {
		return
	}
	rd.in[replica] = false
	rd.arrived--
	if rd.arrived == 0 {
		g.round = nil
		close(rd.done) // for a member that left while it waited: errLeft (member.result)
		return
	}
	if i := slices.Index(rd.order, replica); i >= 0 {
		rd.order = slices.Delete(rd.order, i, i+1)
		rd.xs[replica], rd.n = nil, len(rd.order)
		if len(rd.order) == 0 {
			return // those left in the round mixed kinds or lengths: rd.err says so
		}
		// The sum on the first member's, as an arrival makes it.
		rd.sum = rd.xs[rd.order[0]].NewSum()
		for _, j := range rd.order {
			if err := rd.sum.Add(rd.xs[j]); err != nil && rd.err == nil {
				rd.err = fmt.Errorf("AllReduceSum: %w", err)
			}
		}
	}
}

// leave takes replica out of the group and reports whether it was the
// last member present (false when it had left already). A member leaves
// at a step boundary (its last step done, or its Run returned): where a
// member that joined waits for the group's state and none has been asked
// for it, the one leaving marshals its own first.
func (g *group) leave(replica int) (last bool) {
	g.mu.Lock()
	if g.left[replica] {
		g.mu.Unlock()
		return false
	}
	h := g.donorLocked(replica)
	if g.moves && g.fresh[replica] {
		g.fresh[replica] = false
		g.nfresh--
	}
	if g.round != nil {
		g.withdrawLocked(replica, g.round)
	}
	g.left[replica] = true
	g.members--
	if hd := g.hand; hd != nil && hd.from < 0 && g.nfresh > 0 && !g.canGiveLocked() {
		// No member present holds a state to give: those that joined
		// cannot take one over.
		hd.from = replica
		hd.err = fmt.Errorf("no member that holds the group's state is left to give it (the kind gave none: nodes.Group.Keep)")
		close(hd.ready)
	}
	g.completeLocked()
	last = g.members == 0
	g.mu.Unlock()
	g.give(h, replica)
	return last
}

// errNoState is returned to a member that joined a group whose state
// moves and calls a collective without having taken the state over.
var errNoState = errors.New("a replica that joined its group during the run calls a collective before taking the group's state over (nodes.Group.Keep, before its first step)")

// join makes a parked replica a member of its stage's group, and reports
// whether it did: a group whose state moves takes a member only while one
// is present to take the state from (a group whose members have all left
// has ended). In a round in progress, the new member is waited for too;
// in a group whose state moves, it is fresh until its Keep has taken the
// state over, and the members waiting in the round are asked for it.
func (g *group) join(replica int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.left[replica] {
		return true
	}
	if g.moves {
		if g.members == 0 {
			return false
		}
		g.fresh[replica] = true
		g.nfresh++
		if g.hand == nil {
			g.hand = &handover{ready: make(chan struct{}), from: -1}
		}
		if rd := g.round; rd != nil && g.hand.from < 0 && !rd.asked {
			rd.asked = true
			close(rd.ask)
		}
	}
	g.left[replica] = false
	g.members++
	return true
}

// donorLocked makes replica the member that marshals the state handed to
// the members that joined, if one is wanted and replica holds a state to
// give (it is present, not fresh itself, and its Keep recorded one), and
// returns the handover it is to give (nil: none).
func (g *group) donorLocked(replica int) *handover {
	h := g.hand
	if !g.moves || h == nil || h.from >= 0 || g.nfresh == 0 || g.left[replica] || g.fresh[replica] || g.states[replica] == nil {
		return nil
	}
	h.from = replica
	return h
}

// canGiveLocked reports whether a member present can give the state.
func (g *group) canGiveLocked() bool {
	for i, left := range g.left {
		if !left && !g.fresh[i] && g.states[i] != nil {
			return true
		}
	}
	return false
}

// give marshals replica's state into h, at a step boundary of replica's,
// in its own goroutine (nothing to do for a nil h). The caller holds no
// lock: no step completes until the members that joined have taken it.
func (g *group) give(h *handover, replica int) {
	if h == nil {
		return
	}
	g.mu.Lock()
	st := g.states[replica]
	g.mu.Unlock()
	b, err := st.MarshalBinary()
	if err != nil {
		err = fmt.Errorf("replica %d marshalled the group's state: %w", replica, err)
	}
	g.mu.Lock()
	h.b, h.err = b, err
	close(h.ready)
	g.mu.Unlock()
}

// donateInRound is the wake of a member waiting in round rd whose ask
// has closed: it gives the state if no other member has been asked yet
// and rd is still in progress (its state is then the group's).
func (g *group) donateInRound(replica int, rd *round) {
	g.mu.Lock()
	var h *handover
	if g.round == rd {
		h = g.donorLocked(replica)
	}
	g.mu.Unlock()
	g.give(h, replica)
}

// member is one replica's handle on its group; it implements nodes.Group
// and charges waits to the replica's blocked time.
type member struct {
	g *group
	r *replica
}

// wait waits in rd, which the member has arrived in, until it completes
// or ctx ends. A member takes part in a round only as long as it waits in
// it: the round completes with every member present waiting, and each of
// them gets its result, so every member present takes every step. A
// round that completed as ctx ended stands for this member as for the
// others; one that has not is left (its arrival withdrawn, its vector out
// of the sum), so that it completes without this member or when it comes
// again. Before, one member of a pair gave up a step's all-reduce on the
// run's abort while its arrival stayed, the other arrived and took the
// step, and the one a step behind was the last to leave, which saves
// (TestSavesOnAbort, once; TestGroupGaveUpWithdraws).
func (m *member) wait(ctx context.Context, rd *round) error {
	ask := rd.ask // nil outside a group whose state moves: never ready
	for {
		select {
		case <-rd.done:
			return m.result(rd)
		case <-ask:
			// A member joined during the round: this one, waiting at its
			// step boundary, may be the one to give it the state.
			ask = nil
			m.g.donateInRound(m.r.index, rd)
		case <-ctx.Done():
			g := m.g
			g.mu.Lock()
			gaveUp := g.round == rd && rd.in[m.r.index]
			if gaveUp {
				g.withdrawLocked(m.r.index, rd)
			}
			g.mu.Unlock()
			if !gaveUp && isClosed(rd.done) {
				return m.result(rd)
			}
			return ctx.Err()
		}
	}
}

// result is what a round that is done answers a member that arrived in
// it: its error, or errLeft where the member was taken out of it before
// it completed (it left while it waited). rd.in changes only under the
// group's lock before rd.done closes, so reading it after needs no lock.
func (m *member) result(rd *round) error {
	if !rd.in[m.r.index] {
		return errLeft
	}
	return rd.err
}

// begin begins the wait of a collective with ctx: on the member's site,
// which the deadlock detector reads if ctx is the replica's own (or the
// node says it is quiescent).
func (m *member) begin(ctx context.Context) wait {
	return m.r.beginWaitOn(&m.r.blocked, &m.g.sites[m.r.index], ctx == m.r.ctx)
}

func (m *member) Barrier(ctx context.Context) error {
	defer m.r.endWait(m.begin(ctx))
	rd, h, err := m.g.arrive(m.r.index, nil, false)
	if err != nil {
		return err
	}
	m.g.give(h, m.r.index)
	return m.wait(ctx, rd)
}

func (m *member) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	return m.AllReduce(ctx, nodes.Floats(buf))
}

// AllReduce implements nodes.Group.AllReduce: the round's Sum, made by the first
// member to arrive from its vector, adds each member's vector as it
// arrives, and each member stores the total into its own once all have.
func (m *member) AllReduce(ctx context.Context, x nodes.Reducible) (int, error) {
	defer m.r.endWait(m.begin(ctx))
	rd, h, err := m.g.arrive(m.r.index, x, true)
	if err != nil {
		return 0, err
	}
	m.g.give(h, m.r.index)
	if err := m.wait(ctx, rd); err != nil {
		return 0, err
	}
	if err := rd.sum.Store(x); err != nil {
		return 0, fmt.Errorf("AllReduceSum: %w", err)
	}
	return rd.n, nil
}

func (m *member) Leave() { m.g.leave(m.r.index) }

// Finish implements nodes.Group.Finish.
func (m *member) Finish(context.Context) (bool, error) { return m.g.leave(m.r.index), nil }

// RejoinAll brings every member back into the group, with no round in
// progress: a plugin group kind's restart whole in one process
// (plugins/host), once every member has stopped (none is in a
// collective, nor will be until it has started again). A round some
// members had arrived in is dropped with them.
func (m *member) RejoinAll() {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.round = nil
	clear(g.left)
	g.members = len(g.left)
}

// Keep implements nodes.Group.Keep: in one process no member restarts,
// but a rebalance may add a member to a group whose state moves (a
// replica started by a move, rebalance.go). Keep records st; a member
// that joined so takes the group's state over first, from the member
// present that marshals it at its step boundary, and its first step is
// the group's next.
func (m *member) Keep(ctx context.Context, st nodes.State) error {
	g, i := m.g, m.r.index
	g.mu.Lock()
	if !g.moves {
		g.mu.Unlock()
		return nil
	}
	g.states[i] = st
	h := g.hand
	if !g.fresh[i] || h == nil {
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	// A wait the deadlock detector does not read: what ends it is
	// another member's next step or leaving, not a wait of its own.
	w := m.r.beginWaitOn(&m.r.blocked, opaqueWait, false)
	select {
	case <-h.ready:
	case <-ctx.Done():
	}
	m.r.endWait(w)
	select {
	case <-h.ready:
	default:
		return ctx.Err()
	}
	if h.err != nil {
		return fmt.Errorf("replica %d joined its group during the run and could not take its state over: %w", i, h.err)
	}
	if err := st.UnmarshalBinary(h.b); err != nil {
		return fmt.Errorf("replica %d joined its group during the run and could not take its state over (from replica %d): %w", i, h.from, err)
	}
	g.mu.Lock()
	if g.fresh[i] {
		g.fresh[i] = false
		g.nfresh--
	}
	g.mu.Unlock()
	return nil
}

// Saves and Saved implement nodes.Group's: in one process no input
// waits for a save (a plugin's group that restarts whole keeps what its
// members took until a save holds it: plugins/host).
func (m *member) Saves(context.Context) error      { return nil }
func (m *member) Saved(context.Context, int) error { return nil }
