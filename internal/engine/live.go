package engine

import (
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/dflow-dev/dflow/report"
)

// The live figures of a run are report.Snapshot values, built here from
// the runtime's atomics without stopping it.
//
// Each replica's busy, idle and blocked add up to its lifetime and none of
// them goes down from one snapshot to the next, whoever takes them (the
// status line, a Prometheus scrape, the browser page), so that a counter
// built on them never resets. The raw figures alone cannot promise that: a
// wait timed on the coarse clock begins at the last tick, up to 10ms before
// it really began, and one in progress is counted up to the instant it is
// read, so its share of idle can run ahead of the lifetime read with it and
// fall back when the wait ends on a tick; busy, the rest of the lifetime,
// moves the other way. So each replica keeps the figures it last showed
// (its mark), and a new reading moves each of them forward only, sharing
// out the lifetime gained since the mark in proportion to how far each
// figure wants to move (mark.advance).

func (r *run) snapshot(now time.Time) *report.Snapshot {
	s := &report.Snapshot{Time: now, Draining: r.isDraining(), Moves: r.moves.madeSoFar()}
	if r.startNs.Load() == 0 {
		return s
	}
	// r.start is written before startNs is stored: reading it now is no
	// race, and its monotonic reading keeps lifetimes off the wall clock,
	// which can step between two reads.
	start := r.start
	s.Elapsed = now.Sub(start)
	for _, st := range r.stages {
		ss := report.StageSnapshot{Name: st.g.Name, Node: st.g.Node, Source: len(st.g.Inputs) == 0, Total: st.total}
		ss.Metrics, ss.Counters = st.merged()
		ss.Rebalanced = r.moves != nil && r.g.Rebalanced(st.g.Name)
		for _, rp := range st.replicas {
			if rp.parked.Load() {
				if r.moves.across { // listed in its place (parked.go)
					ss.Replicas = append(ss.Replicas, report.ReplicaSnapshot{Done: true, Parked: true})
				}
				continue // a rebalance's spare, not started (rebalance.go)
			}
			rs := rp.snapshot(start)
			rs.Left = rp.retiring.Load()
			if rp.freed.Load() {
				// Its node has returned, its runtime waits (a member of a
				// group across workers, for the group's final save): done,
				// as in one process, and counted in its stage's size.
				rs.Done = true
			}
			ss.Replicas = append(ss.Replicas, rs)
		}
		s.Stages = append(s.Stages, ss)
	}
	for _, e := range r.edges {
		es := report.EdgeSnapshot{Name: e.g.Name, Policy: e.g.Policy, Capacity: e.g.Capacity,
			From: e.g.From.Stage.Name, To: e.g.To.Stage.Name}
		from := r.stage(e.g.From.Stage.Name)
		for i, q := range e.queues {
			es.Produced += q.produced()
			es.Consumed += q.consumed()
			es.Queues = append(es.Queues, report.QueueSnapshot{
				Depth: q.depth(), Open: started(from, q, q.Open()),
				Producers: started(from, q, q.producers), Consumers: e.g.Queues[i].Consumers,
			})
		}
		s.Edges = append(s.Edges, es)
	}
	return s
}

// snapshot reads a replica; a wait in progress counts from its start.
func (rp *replica) snapshot(start time.Time) report.ReplicaSnapshot {
	f := rp.read(start)
	return report.ReplicaSnapshot{
		ItemsIn:  rp.itemsIn(),
		ItemsOut: rp.itemsOut(),
		Busy:     f.busy, Idle: f.idle, Blocked: f.blocked,
		Done:    f.done,
		Metrics: rp.metrics.read(),
		Waits:   rp.exportWaits(),
	}
}

// times is a replica's lifetime split into busy, idle and blocked.
type times struct {
	life, busy, idle, blocked time.Duration
	done                      bool
}

// read returns the replica's times as of one instant, read after its wait
// totals (so that a wait in progress is counted up to the same instant as
// the lifetime), moved forward from its mark: busy + idle + blocked is the
// lifetime and none of them is less than it was in an earlier read.
func (rp *replica) read(start time.Time) times {
	idleNs, blockedNs, _ := rp.waits()
	end := time.Now() // after the waits: none of them is counted past it
	var t times
	if ns := rp.ended.Load(); ns != 0 {
		end, t.done = time.Unix(0, ns), true
	}
	if b := rp.begun.Load(); b != nil {
		start = *b // started by a rebalance, after the run (rebalance.go)
	}
	if !start.IsZero() {
		t.life = end.Sub(start)
	}
	if o := rp.own.Load(); o != nil {
		ownIdle, ownBlocked := o.until(end)
		idleNs, blockedNs = int64(ownIdle), int64(ownBlocked)
	}
	t.idle, t.blocked = fitWaits(time.Duration(idleNs), time.Duration(blockedNs), t.life)
	t.busy = t.life - t.idle - t.blocked
	markOf(rp).advance(&t)
	return t
}

// mark is what a replica's reads last returned.
type mark struct {
	mu                  sync.Mutex
	busy, idle, blocked time.Duration
}

// advance moves the mark towards t and sets t to it. The lifetime gained
// since the mark (room) is shared between busy, idle and blocked: each
// gets the part of it t says it gained, and when those parts exceed room
// (one of t's figures is behind the mark, or the lifetime moved back with
// the wall clock), all are scaled down to fit. So the sum stays the
// lifetime whenever it is not less than the mark's, and no figure ever
// decreases.
func (m *mark) advance(t *times) {
	m.mu.Lock()
	defer m.mu.Unlock()
	room := max(t.life-(m.busy+m.idle+m.blocked), 0)
	dBusy, dIdle, dBlocked := max(t.busy-m.busy, 0), max(t.idle-m.idle, 0), max(t.blocked-m.blocked, 0)
	if sum := dBusy + dIdle + dBlocked; sum > room {
		scale := float64(room) / float64(sum)
		dIdle = time.Duration(float64(dIdle) * scale)
		dBlocked = time.Duration(float64(dBlocked) * scale)
		dBusy = max(room-dIdle-dBlocked, 0)
	}
	m.busy += dBusy
	m.idle += dIdle
	m.blocked += dBlocked
	t.busy, t.idle, t.blocked = m.busy, m.idle, m.blocked
}

// marks holds every live replica's mark, beside the replica rather than in
// it so that the replica's cache-line layout (replica.go) stays as the per-
// item path wants it; a mark goes when its replica is collected.
var marks sync.Map // weak.Pointer[replica] -> *mark

func markOf(rp *replica) *mark {
	k := weak.Make(rp)
	if v, ok := marks.Load(k); ok {
		return v.(*mark)
	}
	v, loaded := marks.LoadOrStore(k, &mark{})
	if !loaded {
		runtime.AddCleanup(rp, func(k weak.Pointer[replica]) { marks.Delete(k) }, k)
	}
	return v.(*mark)
}

// started are those of a queue's producers listed (the graph's, or the
// open ones) that its snapshot shows: where a rebalance gives the stage
// spares, every one that has started (a spare still parked neither holds
// the queue open, as a user sees it, nor has finished with it).
func started(from *stage, q *queue, list []int) []int {
	if from == nil || from.slots == 0 {
		return list
	}
	var ps []int
	for _, p := range list {
		if p < len(from.replicas) && from.replicas[p].parked.Load() {
			continue
		}
		ps = append(ps, p)
	}
	return ps
}
