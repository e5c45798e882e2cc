package finished

import (
	"context"
	"slices"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go/jetstream"
)

// Replica names one replica of a run.
type Replica struct {
	Stage string
	I     int
}

// Lost is a lost share as the rule reads it: the run's graph and how its
// queues are carried, where each replica runs, and what the share said
// last. The coordinator builds it under its lock; Replicas reads it after,
// and keeps nothing of it.
type Lost struct {
	Graph *graph.Graph
	// Place is where each replica runs: stage -> share per replica.
	Place map[string][]string
	// Remote says which queues ride a stream, Chained which edges are
	// chains' (control.Place).
	Remote  map[string][]bool
	Chained map[string]bool
	// Hosted says which stages have a group across workers, hosted by the
	// coordinator.
	Hosted map[string]bool
	// Restartable says whether a stage's replicas may restart elsewhere
	// (wire.Restartable).
	Restartable func(*graph.Stage) bool
	// Share is the lost share's name; Last its last snapshot (nil: none).
	Share string
	Last  *report.Snapshot
}

// Replicas reads, from the run's end bucket, which restartable replicas
// placed on the lost share had finished there: returned, with everything
// they took settled (wire.KeySettled, written by the share itself), so
// that nothing of theirs can come back to a restart, and either done in
// its last snapshot, so that the run's figures and its deadlock watch
// have what it did to the end, or with the end of every queue it feeds
// written: recorded settled after that snapshot (which comes once a
// second), its consumers may have ended on those ends, and run again it
// could take an item another lost replica held on a shared input and send
// it after them; the coordinator marks it done in that snapshot (MarkDone),
// and the run's figures settle what it did since. One recorded settled
// after that snapshot whose ends are not all written restarts. Not one
// that feeds a queue in process on the lost worker (its consumer is gone
// with it), nor a chain's replica unless the chain's every replica there
// had finished by this rule (a chain restarts whole), and, where a stage
// has no group across workers, none of its replicas there unless all of
// them had finished (those that stayed and those that moved would be a
// group spread over two workers, with no host). What cannot be read is not
// finished: restarted.
func Replicas(ctx context.Context, ends jetstream.KeyValue, l *Lost) map[Replica]bool {
	type rep struct {
		si, i int
		s     *graph.Stage
	}
	var reps []rep
	local := map[Replica]bool{} // feeds a queue in process
	seen := map[Replica]bool{}  // done in the lost share's last snapshot
	type queue struct{ ei, qi int }
	feeds := map[Replica][]queue{} // the remote queues each feeds
	for si, s := range l.Graph.Stages {
		if !l.Restartable(s) {
			continue
		}
		for i, p := range l.Place[s.Name] {
			if p == l.Share {
				reps = append(reps, rep{si, i, s})
				seen[Replica{s.Name, i}] = l.Last != nil && Done(l.Last, s.Name, i)
			}
		}
	}
	chain := map[Replica][]Replica{} // the replicas a chain's edge joins each to
	for _, e := range l.Graph.Edges {
		for qi, q := range e.Queues {
			switch {
			case l.Remote[e.Name][qi]:
			case l.Chained[e.Name]:
				p, cr := Replica{e.From.Stage.Name, q.Producers[0]}, Replica{e.To.Stage.Name, q.Consumers[0]}
				if l.Place[p.Stage][p.I] == l.Share && l.Place[cr.Stage][cr.I] == l.Share {
					chain[p], chain[cr] = append(chain[p], cr), append(chain[cr], p)
				}
			default:
				for _, p := range q.Producers {
					local[Replica{e.From.Stage.Name, p}] = true
				}
			}
		}
	}
	for ei, e := range l.Graph.Edges {
		for qi, q := range e.Queues {
			for _, p := range q.Producers {
				if k := (Replica{e.From.Stage.Name, p}); l.Remote[e.Name][qi] && l.Place[k.Stage][p] == l.Share {
					feeds[k] = append(feeds[k], queue{ei, qi})
				}
			}
		}
	}
	if len(reps) == 0 {
		return nil
	}
	ended := map[Replica]bool{}
	partial := map[string]bool{} // a stage with a replica there that had not finished
	for _, r := range reps {
		k := Replica{r.s.Name, r.i}
		e, err := ends.Get(ctx, wire.KeySettled(r.si, r.i))
		ended[k] = err == nil && string(e.Value()) == l.Share && !local[k] &&
			(seen[k] || l.Last != nil && len(feeds[k]) > 0 && !slices.ContainsFunc(feeds[k], func(q queue) bool {
				_, err := ends.Get(ctx, wire.KeyEnd(q.ei, q.qi, k.I))
				return err != nil
			}))
	}
	// A chain stays finished only whole: a member that restarts restarts
	// the chain (what its consumers had settled may come back to it).
	for again := true; again; {
		again = false
		for k, joined := range chain {
			for _, j := range joined {
				if !ended[k] && ended[j] {
					ended[j], again = false, true
				}
			}
		}
	}
	for _, r := range reps {
		partial[r.s.Name] = partial[r.s.Name] || !ended[Replica{r.s.Name, r.i}]
	}
	for k := range ended {
		if partial[k.Stage] && !l.Hosted[k.Stage] {
			ended[k] = false
		}
	}
	return ended
}

// WriteEnds writes, into the run's end bucket, the end keys of replica i
// of s, a replica that has finished, on every queue it feeds, and that it
// has gone on every queue it reads (its share wrote those only once all
// its consumers there had returned).
func WriteEnds(ctx context.Context, ends jetstream.KeyValue, g *graph.Graph, s *graph.Stage, i int) error {
	for ei, e := range g.Edges {
		for qi, q := range e.Queues {
			if e.To.Stage == s && slices.Contains(q.Consumers, i) {
				if _, err := ends.Put(ctx, wire.KeyGone(ei, qi, i), []byte("coordinator")); err != nil {
					return err
				}
			}
			if e.From.Stage == s && slices.Contains(q.Producers, i) {
				if _, err := ends.Put(ctx, wire.KeyEnd(ei, qi, i), []byte("coordinator")); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Done says whether snapshot s has replica i of stage done (nil: none).
func Done(s *report.Snapshot, stage string, i int) bool {
	if s == nil {
		return false
	}
	for _, st := range s.Stages {
		if st.Name == stage && i < len(st.Replicas) {
			return st.Replicas[i].Done
		}
	}
	return false
}

// MarkDone is snapshot s saying that replica i of stage is done, for a
// replica that stays finished where it was lost, recorded settled and its
// ends written after s: the deadlock watch waits for no more of it. s is
// copied, not changed: what was merged from it before keeps its figures.
func MarkDone(s *report.Snapshot, stage string, i int) *report.Snapshot {
	if s == nil || Done(s, stage, i) {
		return s
	}
	last := *s
	last.Stages = slices.Clone(last.Stages)
	for si := range last.Stages {
		if st := &last.Stages[si]; st.Name == stage && i < len(st.Replicas) {
			st.Replicas = slices.Clone(st.Replicas)
			st.Replicas[i].Done = true
		}
	}
	return &last
}
