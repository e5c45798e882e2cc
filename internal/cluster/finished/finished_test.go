package finished

import (
	"context"
	"maps"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go/jetstream"
)

// endsOf sets up job's streams, consumers and buckets on a server of the
// test's own, removed once the test has ended, and returns its end
// bucket, where shares write their ends and records.
func endsOf(t *testing.T, job *wire.Job, g *graph.Graph) jetstream.KeyValue {
	t.Helper()
	_, nc := clustertest.Server(t)
	js, err := wire.NewJS(nc)
	if err != nil {
		t.Fatal(err)
	}
	return clustertest.SetupRun(t, js, job, g)
}

// TestFinishedReplicaStays: a lost worker's replica of a restartable
// stage stays finished only where that worker recorded it settled and its
// last snapshot had it done; one
// that feeds a queue in process there, or recorded by another instance
// (an earlier incarnation's, on a worker only slow), is restarted, and so
// is every replica on the worker of a stage with no group across workers
// unless all of them had finished.
func TestFinishedReplicaStays(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 3)
	job := &wire.Job{Run: "stays", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2", "w2", "w2"}, "sink": {"w3"}}}
	ends := endsOf(t, job, g)
	ctx := context.Background()
	for i, by := range []string{"", "w2", "w9"} { // work[0] not settled, work[2] by another
		if by != "" {
			if _, err := ends.Put(ctx, wire.KeySettled(1, i), []byte(by)); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := &Lost{Graph: g, Remote: job.Remote, Place: job.Place, Hosted: map[string]bool{"work": true},
		Restartable: func(s *graph.Stage) bool { return wire.Restartable(nodes.Default, s) }, Share: "w2"}
	want := map[Replica]bool{{"work", 0}: false, {"work", 1}: true, {"work", 2}: false, {"sink", 0}: false}
	l.Place["sink"] = []string{"w2"}
	endedOn := func(last *report.Snapshot) map[Replica]bool { l.Last = last; return Replicas(ctx, ends, l) }
	done := func(work ...bool) *report.Snapshot { // w2's last, as it had its work replicas
		var reps []report.ReplicaSnapshot
		for _, d := range work {
			reps = append(reps, report.ReplicaSnapshot{Done: d})
		}
		return &report.Snapshot{Stages: []report.StageSnapshot{{Name: "work", Replicas: reps}}}
	}
	if got := endedOn(done(true, true, true)); !maps.Equal(got, want) {
		t.Errorf("ended on w2: %v, want %v", got, want)
	}
	// recorded settled after the last snapshot, its end not written: the
	// figures and the deadlock watch would not have its end
	if got := endedOn(done(true, false, true)); got[Replica{"work", 1}] {
		t.Errorf("ended on w2, not done in its last snapshot: %v, want work[1] restarted", got)
	}
	// its end written too: its consumer may have ended on it, so it stays
	// (recover marks it done), unless w2 was never seen at all
	if _, err := ends.Put(ctx, wire.KeyEnd(1, 0, 1), []byte("w2")); err != nil {
		t.Fatal(err)
	}
	if got := endedOn(done(true, false, true)); !maps.Equal(got, want) {
		t.Errorf("ended on w2 with its end written, not done in its last snapshot: %v, want %v", got, want)
	}
	if got := endedOn(nil); got[Replica{"work", 1}] {
		t.Errorf("ended on w2, never seen: %v, want work[1] restarted", got)
	}
	l.Hosted = nil // no group across workers: work[1] would be one apart from work[0] and [2]
	if got := endedOn(done(true, true, true)); got[Replica{"work", 1}] {
		t.Errorf("ended on w2 with no group host: %v, want every work replica restarted", got)
	}
	l.Hosted = map[string]bool{"work": true}
	l.Remote = map[string][]bool{"a": {true}, "b": {false}} // b in process on the lost worker
	if got := endedOn(done(true, true, true)); got[Replica{"work", 1}] {
		t.Errorf("ended on w2 with its output in process: %v, want work[1] restarted", got)
	}
}

// TestFinishedChainStaysWhole: a lost worker's chain (work feeding the
// sink in process, a chain's edge) stays finished only when every replica
// of it had finished by the rule for one replica; one that had not
// restarts the chain whole.
func TestFinishedChainStaysWhole(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 1)
	job := &wire.Job{Run: "chainstays", Remote: map[string][]bool{"a": {true}, "b": {false}}, Chained: map[string]bool{"b": true},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w2"}}}
	ends := endsOf(t, job, g)
	ctx := context.Background()
	if _, err := ends.Put(ctx, wire.KeySettled(1, 0), []byte("w2")); err != nil { // work[0] settled, the sink not
		t.Fatal(err)
	}
	l := &Lost{Graph: g, Remote: job.Remote, Chained: job.Chained, Place: job.Place,
		Restartable: func(s *graph.Stage) bool { return wire.Restartable(nodes.Default, s) }, Share: "w2",
		Last: &report.Snapshot{Stages: []report.StageSnapshot{
			{Name: "work", Replicas: []report.ReplicaSnapshot{{Done: true}}},
			{Name: "sink", Replicas: []report.ReplicaSnapshot{{Done: true}}}}}}
	if got := Replicas(ctx, ends, l); got[Replica{"work", 0}] || got[Replica{"sink", 0}] {
		t.Errorf("ended on w2 with the sink unsettled: %v, want the chain restarted whole", got)
	}
	if _, err := ends.Put(ctx, wire.KeySettled(2, 0), []byte("w2")); err != nil {
		t.Fatal(err)
	}
	if got := Replicas(ctx, ends, l); !got[Replica{"work", 0}] || !got[Replica{"sink", 0}] {
		t.Errorf("ended on w2 with the whole chain settled: %v, want both to stay", got)
	}
}
