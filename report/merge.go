package report

import (
	"slices"
	"time"
)

// Merging: the one place where figures become other figures. A run's
// figures are seen in several places (each replica of a stage, each share
// of a run across hosts, a lost share and the share that took over its
// replicas) and shown in several (the report, the live page, the
// diagnosis); these functions are how they combine, for the engine, the
// simulator, the page, the diagnosis and the cluster's coordinator alike.
//
// The rule: a counter (items, seconds, a node metric published with
// Metrics().Add) adds; a gauge (a queue's depth, a metric published with
// Set) keeps one reading: the one set last, or for a queue's depth the
// largest any share read.

// Shares are a replica's busy, idle and blocked times as shares of its
// lifetime, which the three add up to.
type Shares struct{ Busy, Idle, Blocked float64 }

// SharesOf divides busy, idle and blocked (in any one unit) by their sum,
// the replica's lifetime; all zero for a replica that did not live.
func SharesOf(busy, idle, blocked float64) Shares {
	life := busy + idle + blocked
	if life <= 0 {
		return Shares{}
	}
	return Shares{busy / life, idle / life, blocked / life}
}

// Utilization is a replica's busy share of its lifetime (SharesOf's Busy):
// the report's Replica.Utilization.
func Utilization(busy, idle, blocked float64) float64 {
	return SharesOf(busy, idle, blocked).Busy
}

// Shares are the replica's whole-run shares of its lifetime.
func (r Replica) Shares() Shares { return SharesOf(r.BusySeconds, r.IdleSeconds, r.BlockedSeconds) }

// Shares are the replica's shares of its lifetime so far.
func (r ReplicaSnapshot) Shares() Shares {
	return SharesOf(r.Busy.Seconds(), r.Idle.Seconds(), r.Blocked.Seconds())
}

// Utilization is the stage's mean utilization: its replicas' busy shares
// averaged (0 for a stage without replicas).
func (st Stage) Utilization() float64 {
	if len(st.Replicas) == 0 {
		return 0
	}
	var sum float64
	for _, r := range st.Replicas {
		sum += r.Utilization
	}
	return sum / float64(len(st.Replicas))
}

// Replica is the live figures as the report's replica index: items,
// seconds and utilization (no service times: a snapshot has none).
func (r ReplicaSnapshot) Replica(index int) Replica {
	return Replica{Index: index, Worker: r.Worker, ItemsIn: r.ItemsIn, ItemsOut: r.ItemsOut,
		BusySeconds: r.Busy.Seconds(), IdleSeconds: r.Idle.Seconds(), BlockedSeconds: r.Blocked.Seconds(),
		Utilization: Utilization(r.Busy.Seconds(), r.Idle.Seconds(), r.Blocked.Seconds())}
}

// Plus is r with what o counted of the same replica elsewhere (a share
// that ran it before it restarted) added: items and times add; the rest
// (done, worker, metrics, waits) is r's.
func (r ReplicaSnapshot) Plus(o ReplicaSnapshot) ReplicaSnapshot {
	r.ItemsIn += o.ItemsIn
	r.ItemsOut += o.ItemsOut
	r.Busy += o.Busy
	r.Idle += o.Idle
	r.Blocked += o.Blocked
	return r
}

// Plus is r with what o counted of the same replica elsewhere added:
// items and seconds add and the utilization is that of the sums; index,
// device, worker and service times are r's.
func (r Replica) Plus(o ReplicaSnapshot) Replica {
	r.ItemsIn += o.ItemsIn
	r.ItemsOut += o.ItemsOut
	r.BusySeconds += o.Busy.Seconds()
	r.IdleSeconds += o.Idle.Seconds()
	r.BlockedSeconds += o.Blocked.Seconds()
	r.Utilization = Utilization(r.BusySeconds, r.IdleSeconds, r.BlockedSeconds)
	return r
}

// Empty is e with nothing counted: its name, policy, ends and queues'
// wiring, no items, depths or open producers; what Plus starts from.
func (e EdgeSnapshot) Empty() EdgeSnapshot {
	e.Produced, e.Consumed = 0, 0
	e.Queues = slices.Clone(e.Queues)
	for i := range e.Queues {
		e.Queues[i].Depth, e.Queues[i].Open = 0, nil
	}
	return e
}

// Plus is e with another share's reading of the same edge: produced and
// consumed add; each queue's depth is the larger reading (the shares read
// one queue) and its open producers those of either. Queues of o that e
// lacks are left out.
func (e EdgeSnapshot) Plus(o EdgeSnapshot) EdgeSnapshot {
	e.Produced += o.Produced
	e.Consumed += o.Consumed
	e.Queues = slices.Clone(e.Queues)
	for i, q := range o.Queues {
		if i >= len(e.Queues) {
			break
		}
		mq := &e.Queues[i]
		mq.Depth = max(mq.Depth, q.Depth)
		open := append(slices.Clone(mq.Open), q.Open...)
		slices.Sort(open)
		mq.Open = slices.Compact(open)
	}
	return e
}

// Plus is e with another share's report of the same edge: produced and
// consumed add; each queue's mean and max depth are the larger (the
// shares read one queue). Queues of o that e lacks are left out.
func (e Edge) Plus(o Edge) Edge {
	e.Produced += o.Produced
	e.Consumed += o.Consumed
	e.Queues = slices.Clone(e.Queues)
	for i, q := range o.Queues {
		if i >= len(e.Queues) {
			break
		}
		e.Queues[i].MaxDepth = max(e.Queues[i].MaxDepth, q.MaxDepth)
		e.Queues[i].MeanDepth = max(e.Queues[i].MeanDepth, q.MeanDepth)
	}
	return e
}

// Merge is one metric's two readings (of one replica by two shares, or of
// two replicas) made one: a counter's values add; a gauge keeps the
// reading set last. The counter-versus-gauge rule, written once.
func (m Metric) Merge(o Metric) Metric {
	switch {
	case o.Counter || m.Counter:
		m.Value += o.Value
		m.Counter = true
	case o.Set.After(m.Set):
		return o
	}
	return m
}

// statusRank orders the statuses by how badly a run ended.
var statusRank = map[string]int{OK: 0, Interrupted: 1, Aborted: 2, Failed: 3}

// Worst is the status of a run whose parts ended a and b: the worse of
// the two (ok, interrupted, aborted, failed, in that order).
func Worst(a, b string) string {
	if statusRank[b] > statusRank[a] {
		return b
	}
	return a
}

// Report is the run's report so far, as the diagnosis reads it (status
// "running"): each replica's figures to this instant, each stage's node
// metrics, each edge's counts; meanDepth, when it has them, gives each
// queue's mean depth so far by edge name (the snapshot has only the
// depth now).
func (s *Snapshot) Report(meanDepth map[string][]float64) *Report {
	rep := &Report{Status: "running", WallSeconds: s.Elapsed.Seconds(), Stages: map[string]Stage{}, Edges: map[string]Edge{}}
	for _, st := range s.Stages {
		rs := Stage{Node: st.Node, Metrics: st.Metrics}
		for i, r := range st.Replicas {
			rs.Replicas = append(rs.Replicas, r.Replica(i))
		}
		rep.Stages[st.Name] = rs
	}
	for _, e := range s.Edges {
		re := Edge{From: e.From, To: e.To, Policy: string(e.Policy), Capacity: e.Capacity, Produced: e.Produced, Consumed: e.Consumed}
		for i, q := range e.Queues {
			rq := Queue{Producers: q.Producers, Consumers: q.Consumers}
			if i < len(meanDepth[e.Name]) {
				rq.MeanDepth = meanDepth[e.Name][i]
			}
			re.Queues = append(re.Queues, rq)
		}
		rep.Edges[e.Name] = re
	}
	rep.SetOrder(s.names())
	return rep
}

// names are the snapshot's stage and edge names in its order.
func (s *Snapshot) names() (stages, edges []string) {
	for _, st := range s.Stages {
		stages = append(stages, st.Name)
	}
	for _, e := range s.Edges {
		edges = append(edges, e.Name)
	}
	return stages, edges
}

// span is the time between prev and s (since the start when prev is nil).
func (s *Snapshot) span(prev *Snapshot) time.Duration {
	if prev == nil {
		return s.Elapsed
	}
	return s.Elapsed - prev.Elapsed
}
