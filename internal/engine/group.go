package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dflow-dev/dflow/nodes"
)

// group is a stage's replica group. A collective completes when every
// member still present has arrived; a member that leaves (its Run
// returned, or it called Leave) is no longer waited for, and its leaving
// can itself complete a round the others are waiting in. So uneven ends
// never hang, in any order.
type group struct {
	mu      sync.Mutex
	members int
	left    []bool
	round   *round
	rounds  int64 // completed, for the deadlock detector
	// sites: member i's waits at a collective, for the deadlock detector
	// (one per member, so that each counts its own waits in progress)
	sites []waitSite
}

// round is one collective in progress: a barrier or an all-reduce.
type round struct {
	arrived int
	in      []bool    // in[i]: member i has arrived
	sum     nodes.Sum // nil for a barrier
	length  int       // of the vectors summed
	n       int       // contributors to sum
	done    chan struct{}
	err     error
}

func newGroup(n int) *group {
	g := &group{members: n, left: make([]bool, n), sites: make([]waitSite, n)}
	for i := range g.sites {
		g.sites[i] = waitSite{kind: waitGroup, g: g}
	}
	return g
}

// errLeft is returned to a replica that calls a collective after leaving.
var errLeft = errors.New("replica has left its group")

// arrive joins the current round, contributing x when it is an
// all-reduce (x's Sum adds the members' vectors in arrival order), and
// returns the round to wait on.
func (g *group) arrive(replica int, x nodes.Reducible, reduce bool) (*round, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left[replica] {
		return nil, errLeft
	}
	if g.round == nil {
		g.round = &round{done: make(chan struct{}), in: make([]bool, len(g.left))}
		if reduce {
			g.round.sum, g.round.length = x.NewSum(), x.Len()
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
	}
	rd.arrived++
	rd.in[replica] = true
	g.completeLocked()
	return rd, nil
}

// completeLocked releases the current round if every present member has
// arrived.
func (g *group) completeLocked() {
	if g.round != nil && g.round.arrived >= g.members {
		close(g.round.done)
		g.round = nil
		g.rounds++
	}
}

// leave takes replica out of the group and reports whether it was the
// last member present (false when it had left already).
func (g *group) leave(replica int) (last bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left[replica] {
		return false
	}
	g.left[replica] = true
	g.members--
	g.completeLocked()
	return g.members == 0
}

// member is one replica's handle on its group; it implements nodes.Group
// and charges waits to the replica's blocked time.
type member struct {
	g *group
	r *replica
}

func (m *member) wait(ctx context.Context, rd *round) error {
	select {
	case <-rd.done:
		return rd.err
	case <-ctx.Done():
		// A round that completed as ctx ended stands, for this member as
		// for the others: left to the select's chance, one member of a
		// step's all-reduce took the update and another did not, and the
		// last to leave saved its model a step behind the run's
		// (TestSavesOnAbort, once).
		select {
		case <-rd.done:
			return rd.err
		default:
			return ctx.Err()
		}
	}
}

// begin begins the wait of a collective with ctx: on the member's site,
// which the deadlock detector reads if ctx is the replica's own (or the
// node says it is quiescent).
func (m *member) begin(ctx context.Context) wait {
	return m.r.beginWaitOn(&m.r.blocked, &m.g.sites[m.r.index], ctx == m.r.ctx)
}

func (m *member) Barrier(ctx context.Context) error {
	defer m.r.endWait(m.begin(ctx))
	rd, err := m.g.arrive(m.r.index, nil, false)
	if err != nil {
		return err
	}
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
	rd, err := m.g.arrive(m.r.index, x, true)
	if err != nil {
		return 0, err
	}
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

// Keep implements nodes.Group.Keep: in one process no member restarts by
// itself, so there is nothing to take over and nothing to record (a
// plugin's group restarts whole, told its save by plugins/host).
func (m *member) Keep(context.Context, nodes.State) error { return nil }

// Saves and Saved implement nodes.Group's: in one process no input
// waits for a save (a plugin's group that restarts whole keeps what its
// members took until a save holds it: plugins/host).
func (m *member) Saves(context.Context) error      { return nil }
func (m *member) Saved(context.Context, int) error { return nil }
