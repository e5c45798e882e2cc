package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	site    waitSite
}

// round is one collective in progress: a barrier or an all-reduce.
type round struct {
	arrived int
	in      []bool    // in[i]: member i has arrived
	sum     []float32 // nil for a barrier
	n       int       // contributors to sum
	done    chan struct{}
	err     error
}

func newGroup(n int) *group {
	g := &group{members: n, left: make([]bool, n)}
	g.site = waitSite{kind: waitGroup, g: g}
	return g
}

// errLeft is returned to a replica that calls a collective after leaving.
var errLeft = errors.New("replica has left its group")

// arrive joins the current round, contributing buf when it is an
// all-reduce, and returns the round to wait on.
func (g *group) arrive(replica int, buf []float32, reduce bool) (*round, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left[replica] {
		return nil, errLeft
	}
	if g.round == nil {
		g.round = &round{done: make(chan struct{}), in: make([]bool, len(g.left))}
		if reduce {
			g.round.sum = make([]float32, len(buf))
		}
	}
	rd := g.round
	switch {
	case reduce != (rd.sum != nil):
		rd.err = fmt.Errorf("replicas mixed Barrier and AllReduceSum in one step")
	case reduce && len(buf) != len(rd.sum):
		rd.err = fmt.Errorf("AllReduceSum buffers differ in length: %d and %d", len(buf), len(rd.sum))
	case reduce:
		for i, v := range buf {
			rd.sum[i] += v
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

func (g *group) leave(replica int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left[replica] {
		return
	}
	g.left[replica] = true
	g.members--
	g.completeLocked()
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
		return ctx.Err()
	}
}

// site is what a collective with ctx waits on, for the deadlock detector.
func (m *member) site(ctx context.Context) *waitSite {
	if ctx != m.r.ctx {
		return opaqueWait
	}
	return &m.g.site
}

func (m *member) Barrier(ctx context.Context) error {
	defer m.r.endWait(m.r.beginWait(&m.r.blocked, m.site(ctx)))
	rd, err := m.g.arrive(m.r.index, nil, false)
	if err != nil {
		return err
	}
	return m.wait(ctx, rd)
}

func (m *member) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	defer m.r.endWait(m.r.beginWait(&m.r.blocked, m.site(ctx)))
	rd, err := m.g.arrive(m.r.index, buf, true)
	if err != nil {
		return 0, err
	}
	if err := m.wait(ctx, rd); err != nil {
		return 0, err
	}
	copy(buf, rd.sum)
	return rd.n, nil
}

func (m *member) Leave() { m.g.leave(m.r.index) }
