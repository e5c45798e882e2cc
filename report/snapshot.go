package report

import (
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// Snapshot is the live state of a run at one instant, read from the
// runtime's atomics without stopping it. Figures are cumulative since the
// start; a reader that wants rates diffs two snapshots.
type Snapshot struct {
	Time    time.Time
	Elapsed time.Duration
	Stages  []StageSnapshot
	Edges   []EdgeSnapshot
	// Draining is true once a drain has begun: sources are stopped, so
	// progress no longer advances and an ETA would only climb.
	Draining bool
	// Moves are the moves of a rebalance made so far, in time order
	// (their gains not measured yet); none without one.
	Moves []Move `json:",omitempty"`
}

// StageSnapshot is one stage's state.
type StageSnapshot struct {
	Name     string
	Node     string
	Source   bool  // the stage has no inputs
	Total    int64 // items the stage will emit in all; 0 when unknown
	Replicas []ReplicaSnapshot
	Metrics  map[string]float64
	// Counters names the metrics that are counters (published with
	// Metrics().Add, summed over replicas); the others are gauges.
	Counters map[string]bool
	// Rebalanced: the stage is one of a rebalance's that moves replicas
	// during the run, so its size (Size) may change.
	Rebalanced bool `json:",omitempty"`
}

// ReplicaSnapshot is one replica's cumulative figures, a wait in progress
// included. Busy, Idle and Blocked add up to the replica's lifetime as of
// the snapshot, and none of them is ever less than in an earlier snapshot
// of the same run.
type ReplicaSnapshot struct {
	ItemsIn, ItemsOut   int64
	Busy, Idle, Blocked time.Duration
	Done                bool
	// Left: a rebalance moved the replica to another stage; it leaves
	// after the item in hand (Done once it has).
	Left bool `json:",omitempty"`
	// Parked: a rebalance's spare slot on a cluster that has not started
	// (its engine lists it, so that the replicas keep their places; the
	// coordinator's merged snapshots leave it out).
	Parked bool `json:",omitempty"`
	// Worker is the cluster worker the replica runs on ("a>b" once it
	// has restarted on b); empty in one process.
	Worker string `json:",omitempty"`
	// Metrics are the node metrics this replica published; the stage's
	// Metrics merge them (MergeMetrics).
	Metrics map[string]Metric `json:",omitempty"`
	// Waits are the replica's blocking waits that its engine cannot see
	// end, for a deadlock detector that sees the whole run (the
	// coordinator of a run across hosts): none while it works, or is in a
	// wait that may end (an item at hand, room on the queue, a wait its
	// engine cannot read); several only for a node that says it is
	// quiescent (nodes.Quiescer), which is stuck when all of them are.
	Waits []Wait `json:",omitempty"`
}

// Wait is one blocking wait of a replica, as its engine sees it.
type Wait struct {
	// Kind is "recv" (an item on one of Queues), "send" (room on the one
	// full queue in Queues) or "group" (the rest of the stage's group at
	// a collective).
	Kind   string
	Queues []QueueRef `json:",omitempty"`
	// For, of a group wait its engine judged (an in-process group), lists
	// the members it waits for; the coordinator judges a group across
	// hosts itself.
	For []int `json:",omitempty"`
}

// QueueRef names a queue a wait is on.
type QueueRef struct {
	Edge  string
	Queue int
	// Remote: a transport carries it, and the engine cannot tell whether
	// it is empty or full. Otherwise the engine saw it empty (recv) or
	// full (send), and For lists the replicas that could change that:
	// its live producers or consumers.
	Remote bool  `json:",omitempty"`
	For    []int `json:",omitempty"`
}

// EdgeSnapshot is one edge's state.
type EdgeSnapshot struct {
	Name               string
	Policy             graph.Policy
	Capacity           int
	From, To           string // stage names
	Produced, Consumed int64
	Queues             []QueueSnapshot
}

// QueueSnapshot is one queue's state. Open lists the producer replicas
// still holding it open: once it is empty, the queue ends when they
// finish.
type QueueSnapshot struct {
	Depth     int
	Producers []int
	Consumers []int
	Open      []int
}

// Stage returns the stage of that name; nil when there is none (or s is
// nil).
func (s *Snapshot) Stage(name string) *StageSnapshot {
	if s == nil {
		return nil
	}
	for i := range s.Stages {
		if s.Stages[i].Name == name {
			return &s.Stages[i]
		}
	}
	return nil
}

// Utilization returns each replica's busy share between prev and s (since
// the start when prev is nil).
func (s *Snapshot) Utilization(prev *Snapshot, stage int) []float64 {
	return s.share(prev, stage, func(r ReplicaSnapshot) time.Duration { return r.Busy })
}

// IdleShare returns each replica's share of time waiting for input
// between prev and s.
func (s *Snapshot) IdleShare(prev *Snapshot, stage int) []float64 {
	return s.share(prev, stage, func(r ReplicaSnapshot) time.Duration { return r.Idle })
}

// BlockedShare returns each replica's share of time blocked (on a full
// queue or its group) between prev and s.
func (s *Snapshot) BlockedShare(prev *Snapshot, stage int) []float64 {
	return s.share(prev, stage, func(r ReplicaSnapshot) time.Duration { return r.Blocked })
}

func (s *Snapshot) share(prev *Snapshot, stage int, of func(ReplicaSnapshot) time.Duration) []float64 {
	st := s.Stages[stage]
	out := make([]float64, len(st.Replicas))
	span := s.span(prev)
	if span <= 0 {
		return out
	}
	for i, r := range st.Replicas {
		d := of(r)
		// A replica that started since prev (a rebalance's) counts from
		// its start.
		if prev != nil && stage < len(prev.Stages) && i < len(prev.Stages[stage].Replicas) {
			d -= of(prev.Stages[stage].Replicas[i])
		}
		out[i] = min(max(float64(d)/float64(span), 0), 1)
	}
	return out
}

// Sample turns a snapshot into a point of the report's series.
func (s *Snapshot) Sample(prev *Snapshot) Sample {
	p := Sample{
		T:           s.Elapsed.Seconds(),
		Queues:      map[string][]int{},
		Utilization: map[string][]float64{},
		Idle:        map[string][]float64{},
		Items:       map[string]int64{},
	}
	for _, st := range s.Stages {
		if st.Rebalanced {
			if p.Replicas == nil {
				p.Replicas = map[string]int{}
			}
			p.Replicas[st.Name] = st.Size()
		}
	}
	for _, e := range s.Edges {
		depths := make([]int, len(e.Queues))
		for i, q := range e.Queues {
			depths[i] = q.Depth
		}
		p.Queues[e.Name] = depths
	}
	for i, st := range s.Stages {
		p.Utilization[st.Name] = s.Utilization(prev, i)
		p.Idle[st.Name] = s.IdleShare(prev, i)
		p.Items[st.Name] = st.Items()
		if len(st.Metrics) > 0 {
			if p.Metrics == nil {
				p.Metrics = map[string]map[string]float64{}
			}
			p.Metrics[st.Name] = st.Metrics // a fresh map per snapshot, read-only from here
		}
	}
	return p
}

// Items is the stage's items so far, summed over its replicas: received,
// or emitted when the stage is a source.
func (st *StageSnapshot) Items() int64 {
	var n int64
	for _, r := range st.Replicas {
		if st.Source {
			n += r.ItemsOut
		} else {
			n += r.ItemsIn
		}
	}
	return n
}

// Size is the stage's replicas as of the snapshot: those started, less
// those a rebalance moved to another stage. A replica whose input has
// ended still counts: the size is the split, not the work in progress.
func (st *StageSnapshot) Size() int {
	n := 0
	for _, r := range st.Replicas {
		if !r.Left {
			n++
		}
	}
	return n
}
