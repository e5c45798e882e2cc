package engine

import (
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// report assembles the run report from the live counters.
func (r *run) report(now time.Time, status string, err error) *report.Report {
	rep := &report.Report{
		Spec:        r.g.Filename,
		Status:      status,
		Stages:      map[string]report.Stage{},
		Edges:       map[string]report.Edge{},
		Series:      append([]report.Sample{}, r.series...),
		Diagnosis:   []string{},
		WallSeconds: seconds(now.Sub(r.start)),
	}
	if r.start.IsZero() {
		rep.WallSeconds = 0
	} else {
		rep.Started = r.start.Round(0) // wall clock only: no monotonic reading in the report
	}
	if err != nil {
		rep.Error = err.Error()
	}
	for _, s := range r.stages {
		st := report.Stage{Node: s.g.Node}
		st.Metrics, _ = s.merged()
		for _, rp := range s.replicas {
			if rp.parked.Load() {
				if r.moves.across { // listed in its place (parked.go)
					st.Replicas = append(st.Replicas, report.Replica{Index: rp.index, Device: rp.device})
				}
				continue // a rebalance's spare, never started (rebalance.go)
			}
			st.Replicas = append(st.Replicas, rp.figures(r.start))
		}
		rep.Stages[s.g.Name] = st
	}
	for _, e := range r.edges {
		re := report.Edge{From: e.g.From.Stage.Name, To: e.g.To.Stage.Name, Policy: string(e.g.Policy), Capacity: e.g.Capacity, CapacityBytes: e.g.CapacityBytes}
		for i, q := range e.queues {
			re.Produced += q.produced()
			re.Consumed += q.consumed()
			rq := report.Queue{
				Producers: e.g.Queues[i].Producers,
				Consumers: e.g.Queues[i].Consumers,
				MaxDepth:  q.maxDepth(),
			}
			if n := q.samples.Load(); n > 0 {
				rq.MeanDepth = float64(q.depthSum.Load()) / float64(n)
			}
			re.Queues = append(re.Queues, rq)
		}
		rep.Edges[e.g.Name] = re
	}
	unbuilt(rep, r.g)
	rep.SetOrder(r.g.Names())
	return rep
}

// unbuilt adds the stages and edges a failed construction did not reach,
// with nothing counted, so a failed report still lists the whole graph.
func unbuilt(rep *report.Report, g *graph.Graph) {
	for _, gs := range g.Stages {
		if _, ok := rep.Stages[gs.Name]; ok {
			continue
		}
		st := report.Stage{Node: gs.Node, Metrics: map[string]float64{}}
		for i := range gs.Replicas {
			st.Replicas = append(st.Replicas, report.Replica{Index: i, Device: gs.Device(i)})
		}
		rep.Stages[gs.Name] = st
	}
	for _, ge := range g.Edges {
		if _, ok := rep.Edges[ge.Name]; ok {
			continue
		}
		re := report.Edge{From: ge.From.Stage.Name, To: ge.To.Stage.Name, Policy: string(ge.Policy), Capacity: ge.Capacity, CapacityBytes: ge.CapacityBytes}
		for _, q := range ge.Queues {
			re.Queues = append(re.Queues, report.Queue{Producers: q.Producers, Consumers: q.Consumers})
		}
		rep.Edges[ge.Name] = re
	}
}

// figures reads one replica's counters. Busy is the lifetime less idle and
// blocked, so the three add up exactly, and none is less than a live
// snapshot showed (replica.read).
func (rp *replica) figures(start time.Time) report.Replica {
	t := rp.read(start) // a replica stuck past the grace period is still waiting
	busy, idle, blocked := t.busy, t.idle, t.blocked
	service := &rp.clock.service
	if o := rp.own.Load(); o != nil {
		service = &o.service // the node's own (own.go)
	}
	out := report.Replica{
		Index:          rp.index,
		Device:         rp.device,
		ItemsIn:        rp.itemsIn(),
		ItemsOut:       rp.itemsOut(),
		BusySeconds:    seconds(busy),
		IdleSeconds:    seconds(idle),
		BlockedSeconds: seconds(blocked),
		Utilization:    report.Utilization(seconds(busy), seconds(idle), seconds(blocked)),
		ServiceSeconds: report.Summary{
			Mean: seconds(service.mean()),
			P50:  seconds(service.quantile(0.5)),
			P99:  seconds(service.quantile(0.99)),
		},
	}
	return out
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// fitWaits scales idle and blocked down to fit in life when they exceed
// it: waits timed on the coarse clock are right on average but can add up
// to a tick more than the time they took, and busy, idle and blocked must
// add up to the replica's lifetime.
func fitWaits(idle, blocked, life time.Duration) (time.Duration, time.Duration) {
	if w := idle + blocked; w > life {
		life = max(life, 0)
		idle = time.Duration(float64(idle) * float64(life) / float64(w))
		blocked = life - idle
	}
	return idle, blocked
}
