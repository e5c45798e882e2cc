package follow

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/dflow-dev/dflow/internal/cluster/settle"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/testutil"
)

// testShare is a share as the replicas it follows and its ledger see it:
// a background group that starts nothing once it is stopping.
type testShare struct {
	stop   context.Context
	mu     sync.Mutex
	bg     sync.WaitGroup
	failed error // the first Fail's
}

func (s *testShare) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = err
	}
}

func (s *testShare) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *testShare) Worker() string                { return "w" }
func (s *testShare) Aborting() bool                { return false }
func (s *testShare) Released() bool                { return false }
func (s *testShare) Fatal(error)                   {}
func (s *testShare) Restartable(*graph.Stage) bool { return true }
func (s *testShare) Syncs(*graph.Stage) bool       { return false }
func (s *testShare) Summing(*graph.Stage) bool     { return false }
func (s *testShare) Log() io.Writer                { return io.Discard }
func (s *testShare) AfterSend(string)              {}

func (s *testShare) Go(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop.Err() == nil {
		s.bg.Go(f)
	}
}

// followed is instance's record of the replicas it follows in job, on a
// server of the test's own with job's streams and buckets, and the queue
// of g's first edge that they take from; its share's group is stopped
// and waited for at the test's end, before the streams are removed.
func followed(t *testing.T, job *wire.Job, g *graph.Graph, instance string) (*Replicas, *edge.Queue, *testShare) {
	t.Helper()
	_, nc := clustertest.Server(t)
	js, err := wire.NewJS(nc)
	if err != nil {
		t.Fatal(err)
	}
	ends := clustertest.SetupRun(t, js, job, g)
	job.Timings = job.Timings.WithDefaults()
	stop, cancel := context.WithCancel(context.Background())
	sh := &testShare{stop: stop}
	t.Cleanup(func() {
		sh.mu.Lock()
		cancel()
		sh.mu.Unlock()
		sh.bg.Wait()
	})
	ledger := settle.New(settle.Env{NC: nc, Graph: g, Instance: instance, Ends: ends, Stop: stop}, sh)
	f := New(Env{NC: nc, Job: job, Graph: g, Instance: instance, Ends: ends, Ledger: ledger, Stop: stop, Share: sh})
	e := g.Edges[0]
	in := edge.New(&edge.Env{NC: nc, JS: js, Job: job, Graph: g, Instance: instance, Ends: ends, Stop: stop, Go: sh.Go}, e, wire.EdgeIndex(g, e), 0)
	return f, in, sh
}

// TestSettledRecorded: a followed replica that has returned is recorded
// settled (wire.KeySettled, the instance that ran it) only once everything it
// took is settled, so that a lost worker's replica recorded so has nothing
// that could come back to a restart (package finished).
func TestSettledRecorded(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 1)
	job := &wire.Job{Run: "settle", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w3"}}}
	f, in, sh := followed(t, job, g, "w2")
	sh.Go(f.env.Ledger.Run) // the ledger settles
	tr := &tracked{f: f}
	tk := f.env.Ledger.Take(in, "in-1", nil, false)
	tk.HeldBy(tr)
	tr.open = 1 // taken, not yet finished
	tr.returned(wire.KeySettled(1, 0))
	ctx := context.Background()
	settled := func() string {
		e, err := f.env.Ends.Get(ctx, wire.KeySettled(1, 0))
		if err != nil {
			return ""
		}
		return string(e.Value())
	}
	if testutil.Within(500*time.Millisecond, func() bool { return settled() != "" }) {
		t.Fatalf("recorded settled (%q) with an item unsettled", settled())
	}
	tk.Finish() // settled now: acked, flushed
	if !testutil.Within(10*time.Second, func() bool { return settled() == "w2" }) {
		t.Fatalf("not recorded settled by w2 once its item was: %q", settled())
	}
}
