package engine

import (
	"time"

	"github.com/dflow-dev/dflow/report"
)

// The live figures of a run are report.Snapshot values, built here from
// the runtime's atomics without stopping it.

func (r *run) snapshot(now time.Time) *report.Snapshot {
	s := &report.Snapshot{Time: now, Draining: r.isDraining()}
	startNs := r.startNs.Load()
	if startNs == 0 {
		return s
	}
	start := time.Unix(0, startNs)
	s.Elapsed = now.Sub(start)
	for _, st := range r.stages {
		ss := report.StageSnapshot{Name: st.g.Name, Node: st.g.Node, Source: len(st.g.Inputs) == 0, Total: st.total,
			Metrics: st.metrics.snapshot()}
		for _, rp := range st.replicas {
			ss.Replicas = append(ss.Replicas, rp.snapshot(start, now))
		}
		s.Stages = append(s.Stages, ss)
	}
	for _, e := range r.edges {
		es := report.EdgeSnapshot{Name: e.g.Name, Policy: e.g.Policy, Capacity: e.g.Capacity,
			From: e.g.From.Stage.Name, To: e.g.To.Stage.Name}
		for i, q := range e.queues {
			es.Produced += q.produced()
			es.Consumed += q.consumed()
			es.Queues = append(es.Queues, report.QueueSnapshot{
				Depth: len(q.ch), Open: q.Open(),
				Producers: e.g.Queues[i].Producers, Consumers: e.g.Queues[i].Consumers,
			})
		}
		s.Edges = append(s.Edges, es)
	}
	return s
}

// snapshot reads a replica; a wait in progress counts from its start.
func (rp *replica) snapshot(start, now time.Time) report.ReplicaSnapshot {
	idle, blocked, _ := rp.waits()
	out := report.ReplicaSnapshot{
		ItemsIn:  rp.itemsIn(),
		ItemsOut: rp.itemsOut(),
		Idle:     time.Duration(idle),
		Blocked:  time.Duration(blocked),
	}
	end := now
	if ns := rp.ended.Load(); ns != 0 {
		end, out.Done = time.Unix(0, ns), true
	}
	life := end.Sub(start)
	out.Idle, out.Blocked = fitWaits(out.Idle, out.Blocked, life)
	out.Busy = life - out.Idle - out.Blocked
	return out
}
