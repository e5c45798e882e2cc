package sim

import (
	"container/heap"
	"time"
)

// This file moves replicas between the stages of a rebalance as its
// policy (Rebalancer) decides, in virtual time: a replica of the stage
// that gives finishes its item in hand and leaves (one waiting for input
// leaves at once), and a replica of the stage that gains starts after the
// block's move_cost, on the stage's shared queues (a rebalanced stage's
// edges are all shared: graph.Rebalance).

// firstLookEvery is how often a look is checked for before the first:
// the first comes as soon as every replica has served a few items.
const firstLookEvery = 10 * time.Millisecond

// scheduleLook schedules the next check for a look: often until the
// first look, then every the block's Every after the last.
func (s *sim) scheduleLook() {
	at := s.now + min(firstLookEvery, s.g.Rebalance.Every)
	if s.rb.looked {
		at = max(s.rb.last+s.g.Rebalance.Every, s.now+1)
	}
	s.seq++
	heap.Push(&s.events, event{at: at, seq: s.seq, look: true})
}

// rebalanceLook looks when a look is due, and makes the moves decided.
func (s *sim) rebalanceLook() {
	snap := s.snapshot()
	if !s.rb.Due(snap) {
		return
	}
	d := s.rb.Look(snap)
	if !d.Move {
		return
	}
	for _, t := range d.Transfers {
		if to := s.stageNamed(t.To); to == nil || to.ended() {
			return // its input has ended: nothing left to gain
		}
	}
	for _, t := range d.Transfers {
		if t.From != "" {
			for range t.Replicas {
				s.retire(s.stageNamed(t.From))
			}
		}
		for range t.Replicas {
			s.start(s.stageNamed(t.To))
		}
	}
	s.rb.Moved(d)
	s.moves = append(s.moves, d.Transfers...)
	if s.opts.Moved != nil {
		s.opts.Moved(s.now, d)
	}
}

func (s *sim) stageNamed(name string) *sstage {
	for _, st := range s.stages {
		if st.g.Name == name {
			return st
		}
	}
	return nil
}

// ended reports whether the stage's input has ended: one of its replicas
// finished other than by leaving for a rebalance.
func (st *sstage) ended() bool {
	for _, p := range st.procs {
		if p.state == done && !p.retired {
			return true
		}
	}
	return false
}

// retire makes one replica of st leave: one waiting for input at once,
// else the last one still working once its item in hand is done.
func (s *sim) retire(st *sstage) {
	var pick *proc
	for i := len(st.procs) - 1; i >= 0; i-- {
		p := st.procs[i]
		if p.state == done || p.retiring {
			continue
		}
		if pick == nil {
			pick = p
		}
		if p.waitsEmpty() {
			pick = p
			break
		}
	}
	if pick == nil {
		return
	}
	pick.retiring = true
	if pick.waitsEmpty() {
		s.stopWaiting(pick)
		s.startOrLeave(pick)
	}
}

// waitsEmpty: the replica waits for input with no item in hand.
func (p *proc) waitsEmpty() bool {
	return p.phase == phaseRecv && len(p.waiting) > 0 && !p.handoff
}

// start adds a replica to st, wired to the stage's shared queues; it
// starts move_cost from now.
func (s *sim) start(st *sstage) {
	p, err := st.newProc(len(st.procs))
	if err != nil {
		s.err = err
		return
	}
	st.procs = append(st.procs, p)
	for _, e := range s.edges {
		q := e.queues[0] // shared: the edge's one queue
		if e.g.To.Stage == st.g {
			p.inputs = append(p.inputs, q)
			q.consumers = append(q.consumers, p.idx)
		}
		if e.g.From.Stage == st.g {
			p.outs = append(p.outs, &sout{queues: []*squeue{q}})
			q.producers = append(q.producers, p.idx)
			q.live = append(q.live, true)
			q.producersLeft++
		}
	}
	p.state, p.since, p.phase, p.joining = idle, s.now, phaseStart, true
	if cost := s.g.Rebalance.MoveCost; cost > 0 {
		s.schedule(s.now+cost, p, false)
	} else {
		s.runnable = append(s.runnable, p)
	}
}

// startOrLeave is a replica's first step after a move: a retiring one
// leaves its group and its stage (its queues lose a producer), a joining
// one joins its stage's group. It reports whether the replica goes on.
func (s *sim) startOrLeave(p *proc) bool {
	if p.retiring {
		if p.joining {
			p.left = true // it never joined the group
		}
		p.retired = true
		s.leave(p)
		s.finish(p)
		return false
	}
	p.joining = false
	if p.st.sync {
		p.st.members++
	}
	return true
}
