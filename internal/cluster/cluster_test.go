package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// loader is the workers' and the test's way to build a job's graph with
// the kinds of reg.
func loader(reg *nodes.Registry) func(*wire.Job) (*graph.Graph, error) {
	return func(job *wire.Job) (*graph.Graph, error) {
		l := &graph.Loader{Catalog: reg, Vars: job.Vars, Sets: job.Sets}
		g, diags := l.Load(job.Filename, job.Src)
		if diags.HasErrors() {
			return nil, diags
		}
		return g, nil
	}
}

// serverConn starts an embedded server for the test and connects to it.
func serverConn(t *testing.T) *nats.Conn {
	t.Helper()
	_, nc := testServer(t)
	return nc
}

// testServer starts an embedded server and connects to it, both ended
// with the test.
func testServer(t *testing.T) (*Server, *nats.Conn) {
	t.Helper()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

// setUp makes job's streams and consumers, removed once the test and its
// shares (shareOf) have ended.
func setUp(t *testing.T, js jetstream.JetStream, job *wire.Job, g *graph.Graph) {
	t.Helper()
	if err := wire.SetupRun(context.Background(), js, job.Run, g, job.Remote, job.Chained, wire.DefaultAckWait, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.TeardownRun(js, job.Run, g, job.Remote) })
}

// shareOf is instance's share of job (its links), closed at the test's
// end, before the streams are removed.
func shareOf(t *testing.T, nc *nats.Conn, js jetstream.JetStream, job *wire.Job, g *graph.Graph, instance string) *links {
	t.Helper()
	l, err := newLinks(context.Background(), nc, js, job, g, instance, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.close)
	return l
}

// writeSpec writes a spec into the test's folder and returns its path.
func writeSpec(t *testing.T, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cluster is an embedded server and n in-process workers, each with a
// connection of its own.
type testCluster struct {
	srv    *Server
	reg    *nodes.Registry // the workers' and the coordinator's kinds
	creds  string          // a credentials file, for a server that takes them
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	return startClusterWith(t, n, nodes.Default)
}

// startClusterWith is startCluster with the kinds of reg.
func startClusterWith(t *testing.T, n int, reg *nodes.Registry) *testCluster {
	t.Helper()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{srv: srv, reg: reg}
	t.Cleanup(srv.Shutdown) // after the workers' cleanup
	tc.startWorkers(t, n)
	return tc
}

// connect opens a connection to the test's server.
func (tc *testCluster) connect(t *testing.T, name string) *nats.Conn {
	t.Helper()
	nc, err := Connect(ConnOptions{URL: tc.srv.URL, Token: tc.srv.Token, Creds: tc.creds, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// startWorkers starts n in-process workers, w1 to wn.
func (tc *testCluster) startWorkers(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tc.cancel = cancel
	for i := range n {
		nc := tc.connect(t, fmt.Sprintf("w%d", i+1))
		tc.wg.Add(1)
		go func() {
			defer tc.wg.Done()
			defer nc.Close()
			if err := RunWorker(ctx, WorkerOptions{Name: fmt.Sprintf("w%d", i+1), Conn: nc, Registry: tc.reg, Load: loader(tc.reg)}); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		tc.wg.Wait()
	})
}

func (tc *testCluster) run(t *testing.T, file string, workers int, sets ...string) (*report.Report, *Coordinator, error) {
	t.Helper()
	return tc.runWith(t, file, workers, nil, sets...)
}

// runWith is run with the coordinator's options set by opt.
func (tc *testCluster) runWith(t *testing.T, file string, workers int, opt func(*CoordOptions), sets ...string) (*report.Report, *Coordinator, error) {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	job := wire.Job{Filename: file, Src: src, Sets: sets}
	g, err := loader(tc.reg)(&job)
	if err != nil {
		t.Fatal(err)
	}
	nc := tc.connect(t, "coordinator")
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := CoordOptions{Conn: nc, Graph: g, Job: job, Workers: workers, Interval: 200 * time.Millisecond, Registry: tc.reg}
	if opt != nil {
		opt(&o)
	}
	c, err := NewCoordinator(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the cluster run hung: %v", err)
	}
	return rep, c, err
}

// TestSeedOnThreeWorkers: the seed's 5-on-3 spec over three in-process
// workers, under both policies of hs: every edge carries the 300 items
// once, and every replica names its worker.
func TestSeedOnThreeWorkers(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, 3)
	for _, policy := range []string{"round_robin", "shared"} {
		t.Run(policy, func(t *testing.T) {
			rep, c, err := tc.run(t, "../../specs/seed.hcl", 3, "edge.hs.policy="+policy,
				"stage.target.config.service_time=5ms", "stage.drafter.config.service_time=2ms")
			if err != nil {
				t.Fatal(err)
			}
			if rep.Status != report.OK {
				t.Fatalf("status %s: %s", rep.Status, rep.Error)
			}
			for _, name := range []string{"tokens", "hs", "trained"} {
				e := rep.Edges[name]
				if e.Produced != 300 || e.Consumed != 300 {
					t.Errorf("edge %s: produced %d, consumed %d, want 300", name, e.Produced, e.Consumed)
				}
			}
			workers := map[string]bool{}
			for name, st := range rep.Stages {
				for _, r := range st.Replicas {
					if r.Worker == "" {
						t.Errorf("%s[%d] names no worker", name, r.Index)
					}
					workers[r.Worker] = true
				}
			}
			if len(workers) != 3 {
				t.Errorf("replicas ran on %v, want 3 workers (placement %s)", workers, c.Placement())
			}
			if len(rep.Series) == 0 {
				t.Error("no series")
			}
			if d := rep.Edges["tokens"].Queues[0].MaxDepth; d == 0 {
				t.Error("tokens: max depth 0 (the remote queue's depth is sampled)")
			}
			var in int64
			for _, r := range rep.Stages["done"].Replicas {
				in += r.ItemsIn
			}
			if in != 300 {
				t.Errorf("sink got %d items, want 300", in)
			}
			// The run's last snapshot (its last status line) shows the
			// queues as they are at the end: empty.
			for _, e := range c.Snapshot().Edges {
				for qi, q := range e.Queues {
					if q.Depth != 0 {
						t.Errorf("the last snapshot: edge %s queue %d holds %d, want 0", e.Name, qi, q.Depth)
					}
				}
			}
			_ = strings.Join
		})
	}
}

// TestKeyHashAfterRemoteEdge: items keep their keys across a remote edge,
// so a key_hash edge after it routes them.
func TestKeyHashAfterRemoteEdge(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, 3)
	spec := t.TempDir() + "/kh.hcl"
	os.WriteFile(spec, []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 200
    keys  = 5
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 3
}
stage "sink" {
  node     = "sink"
  replicas = 2
}
edge "a" {
  from   = src.out
  to     = work.in
  policy = "shared"
}
edge "b" {
  from   = work.out
  to     = sink.in
  policy = "key_hash"
}
`), 0o600)
	rep, _, err := tc.run(t, spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	for name, e := range rep.Edges {
		if e.Produced != 200 || e.Consumed != 200 {
			t.Errorf("edge %s: produced %d, consumed %d", name, e.Produced, e.Consumed)
		}
	}
}

// TestLargeItems: items past the payload limit cross in chunks, in a run
// (TestChunksIntact checks their bytes).
func TestLargeItems(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, 2)
	spec := t.TempDir() + "/big.hcl"
	os.WriteFile(spec, []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count      = 6
    size_bytes = 3145728
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 2
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = work.in
  capacity = 2
}
edge "b" {
  from = work.out
  to   = sink.in
}
`), 0o600)
	rep, _, err := tc.run(t, spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	for name, e := range rep.Edges {
		if e.Produced != 6 || e.Consumed != 6 {
			t.Errorf("edge %s: produced %d, consumed %d", name, e.Produced, e.Consumed)
		}
	}
}

// TestLargeItemsIntact: a 5 MiB item and a small one cross a remote edge
// in order, byte for byte, the large one's bytes over the data plane: held
// by the producer's share until the consumer has acked it, released then.
func TestLargeItemsIntact(t *testing.T) {
	t.Parallel()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	send, recv, _, cleanup := edgePair(t, srv, "large")
	defer cleanup()
	dp := send.(*jsQueue).l.dp
	ctx := context.Background()
	big := &items.Blob{Data: make([]byte, 5<<20+123)}
	for i := range big.Data {
		big.Data[i] = byte(i * 7)
	}
	small := &items.Blob{Data: []byte("small")}
	for _, it := range []*items.Blob{big, small} {
		if err := send.Send(ctx, it, engine.Origin{}); err != nil {
			t.Fatal(err)
		}
	}
	send.Close()
	if n, size := dp.Holding(); n != 1 || size < int64(len(big.Data)) {
		t.Errorf("the producer holds %d items (%d bytes) before the consumer has them; want the large one", n, size)
	}
	for _, want := range []*items.Blob{big, small} {
		got, ok, err := recv.Recv(ctx)
		if err != nil || !ok {
			t.Fatalf("recv: %v %v", ok, err)
		}
		if !bytes.Equal(got.Item.(*items.Blob).Data, want.Data) {
			t.Fatalf("an item of %d bytes arrived changed (%d bytes)", len(want.Data), len(got.Item.(*items.Blob).Data))
		}
	}
	if _, ok, err := recv.Recv(ctx); ok || err != nil {
		t.Fatalf("after the last: %v %v", ok, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := dp.Drained(dctx); err != nil {
		n, _ := dp.Holding()
		t.Errorf("the producer still holds %d items' bytes after the consumer acked them", n)
	}
}

// TestHolderGone: when the share holding a large item's bytes is gone
// before its consumer has them, the consumer fails at once, naming the
// worker, instead of waiting for bytes that are nowhere else.
func TestHolderGone(t *testing.T) {
	t.Parallel()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	send, recv, _, cleanup := edgePair(t, srv, "gone")
	defer cleanup()
	pl := send.(*jsQueue).l
	pl.worker = "gpu3"
	if err := send.Send(context.Background(), &items.Blob{Data: make([]byte, 1<<20)}, engine.Origin{}); err != nil {
		t.Fatal(err)
	}
	pl.dp.Close() // the holder's host dies
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err = recv.Recv(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "held by worker gpu3") {
		t.Errorf("err = %v, want one naming worker gpu3 before the deadline", err)
	}
}

// TestSlowConsumer: a producer may wait for room on a remote queue longer
// than one request to the server may take (Timings.Answer, made short
// here: 1 s, against waits of 2.5 s for the items past those the
// consumer's worker has fetched ahead; at 100 ms and at 300 ms a request
// itself took longer beside the whole suite, and failed the run: "reading
// its room: context deadline exceeded"): the wait has no bound, as in
// process, and nothing fails.
func TestSlowConsumer(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, 2)
	spec := writeSpec(t, "slow.hcl", `
stage "src" {
  node = "synthetic_source"
  config {
    count = 4
  }
}
stage "sink" {
  node = "sink"
  config {
    service_time = "2500ms"
  }
}
edge "a" {
  from     = src.out
  to       = sink.in
  capacity = 1
}
`)
	rep, _, err := tc.runWith(t, spec, 2, func(o *CoordOptions) { o.Timings.Answer = time.Second })
	if err != nil {
		t.Fatal(err)
	}
	if e := rep.Edges["a"]; e.Produced != 4 || e.Consumed != 4 {
		t.Errorf("produced %d, consumed %d, want 4", e.Produced, e.Consumed)
	}
}

// TestConsumersGoneAcrossHosts: a consumer on another worker that returns
// at once (before any item reaches it, so its engine sees nothing unread)
// must not leave its producer waiting for room on the full remote queue
// for ever: the producer's Send fails with nodes.ErrNoConsumers once every
// consumer replica has recorded that it has gone, naming the edge and the
// stage, as in process.
func TestConsumersGoneAcrossHosts(t *testing.T) {
	t.Parallel()
	reg := nodes.Default.Clone()
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "take_none", Doc: "returns at once",
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(context.Context, nodes.Replica) error { return nil }), nil
		}})
	tc := startClusterWith(t, 2, reg)
	spec := writeSpec(t, "early.hcl", `
stage "src" {
  node      = "synthetic_source"
  placement = ["w1"]
  config {
    count        = 50
    service_time = "100ms"
  }
}
stage "one" {
  node      = "take_none"
  placement = ["w2"]
}
edge "a" {
  from     = src.out
  to       = one.in
  capacity = 2
}
`)
	_, _, err := tc.run(t, spec, 2)
	if err == nil || !strings.Contains(err.Error(), nodes.ErrNoConsumers.Error()) ||
		!strings.Contains(err.Error(), `edge "a"`) || !strings.Contains(err.Error(), `stage "one"`) {
		t.Fatalf("err = %v, want no consumer left, naming the edge and the stage", err)
	}
}

// TestPlacedOnce: an item derived from one input, sent on an edge of
// three queues by two shares (a replica restarted, whose rotation starts
// afresh, or another replica of a shared input feeding another queue,
// which took the input over after a loss), goes where the first sent it,
// with the same id, and JetStream keeps it once: one message on the edge,
// not two.
func TestPlacedOnce(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g, err := loader(nodes.Default)(&wire.Job{Filename: "rr.hcl", Src: []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 1
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 3
}
stage "sink" {
  node     = "sink"
  replicas = 3
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from   = work.out
  to     = sink.in
  policy = "round_robin"
}
`)})
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.Job{Run: "rr", Remote: map[string][]bool{"a": {false}, "b": {true, true, true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w1", "w2", "w2"}, "sink": {"w3", "w3", "w3"}}}
	ctx := context.Background()
	setUp(t, js, job, g)
	first, second := shareOf(t, nc, js, job, g, "w1"), shareOf(t, nc, js, job, g, "w2")
	e := g.Edges[1]
	send := func(l *links, qi, k int) {
		t.Helper()
		item := &items.Blob{Data: []byte{byte(k)}}
		q := l.For(e, qi).(*jsQueue)
		in := &taken{id: "in-1", lg: l.ledger}
		if err := q.Send(ctx, item, engine.Origin{Receipt: in, Sent: k}); err != nil {
			t.Fatal(err)
		}
		if err := q.flush(); err != nil {
			t.Fatal(err)
		}
	}
	send(first, 0, 0)  // the first share sends the input's item 0 to queue 0
	send(second, 2, 0) // and another, taking the input over, to queue 2
	send(second, 1, 1) // the input's item 1, first sent by the second share
	msgs := func(qi int) int {
		n, err := wire.QueueMsgs(ctx, js, job.Run, 1, qi)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := []int{msgs(0), msgs(1), msgs(2)}; got[0] != 1 || got[1] != 1 || got[2] != 0 {
		t.Errorf("messages on the three queues: %v, want [1 1 0] (item 0 once, where it went first)", got)
	}
}

// chain is the graph src -> work (replicas of synthetic_work) -> sink,
// over edges a and b.
func chain(t *testing.T, replicas int) *graph.Graph {
	t.Helper()
	g, err := loader(nodes.Default)(&wire.Job{Filename: "chain.hcl", Src: []byte(fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 1
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = %d
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}
`, replicas))})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEndWaitsForLocalRestart: a producer replica whose end an earlier
// incarnation wrote restarts (its worker was lost after that end but
// before the replica was recorded settled and seen done:
// TestFinishedReplicaStays), here beside its consumer. The end key its first incarnation wrote does not end the
// queue for that consumer while the restart runs: it ends once the
// restart returns. (Taken from the earlier key, the consumer returned
// first and the engine failed the run: "stage sink returned while stage
// work still produces"; TestDFlashLost's "two lost" met it.)
func TestEndWaitsForLocalRestart(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := chain(t, 1)
	job := &wire.Job{Run: "end", Remote: map[string][]bool{"a": {false}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w2"}}}
	ctx := context.Background()
	setUp(t, js, job, g)
	share := func(job *wire.Job, name string) *jsQueue {
		l := shareOf(t, nc, js, job, g, name)
		l.started = time.Now().Add(-time.Hour) // past a restart's guard
		return l.For(g.Edges[1], 0).(*jsQueue)
	}
	share(job, "w2").Close() // work's first incarnation finished: its end is written
	restart := *job          // w2 lost: work and sink restart on w2-r1
	restart.Restart = true
	restart.Place = map[string][]string{"src": {"w1"}, "work": {"w2-r1"}, "sink": {"w2-r1"}}
	q := share(&restart, "w2-r1")
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, ok, err := q.Recv(wait); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("while the restarted producer runs, the consumer's Recv gave ok=%v err=%v; want it to wait", ok, err)
	}
	q.Close() // the restart returns
	end, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, ok, err := q.Recv(end); ok || err != nil {
		t.Fatalf("once the restarted producer returned, Recv gave ok=%v err=%v; want the queue's end", ok, err)
	}
}

// TestSettledRecorded: a followed replica that has returned is recorded
// settled (keySettled, the instance that ran it) only once everything it
// took is settled, so that a lost worker's replica recorded so has nothing
// that could come back to a restart (endedOn).
func TestSettledRecorded(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := chain(t, 1)
	job := &wire.Job{Run: "settle", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w3"}}}
	setUp(t, js, job, g)
	l := shareOf(t, nc, js, job, g, "w2")
	l.start() // the ledger settles
	in := l.For(g.Edges[0], 0).(*jsQueue)
	tr := &tracked{l: l}
	tk := &taken{q: in, id: "in-1", by: tr}
	tr.open = 1 // taken, not yet finished
	tr.returned(wire.KeySettled(1, 0))
	ctx := context.Background()
	settled := func() string {
		e, err := l.ends.Get(ctx, wire.KeySettled(1, 0))
		if err != nil {
			return ""
		}
		return string(e.Value())
	}
	if testutil.Within(500*time.Millisecond, func() bool { return settled() != "" }) {
		t.Fatalf("recorded settled (%q) with an item unsettled", settled())
	}
	tk.finish(l.ledger) // settled now: acked, flushed
	if !testutil.Within(10*time.Second, func() bool { return settled() == "w2" }) {
		t.Fatalf("not recorded settled by w2 once its item was: %q", settled())
	}
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
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := chain(t, 3)
	job := &wire.Job{Run: "stays", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2", "w2", "w2"}, "sink": {"w3"}}}
	setUp(t, js, job, g)
	l := shareOf(t, nc, js, job, g, "w2")
	ctx := context.Background()
	for i, by := range []string{"", "w2", "w9"} { // work[0] not settled, work[2] by another
		if by != "" {
			if _, err := l.ends.Put(ctx, wire.KeySettled(1, i), []byte(by)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := &Coordinator{o: CoordOptions{Registry: nodes.Default}, g: g, js: js, run: job.Run, remote: job.Remote, place: job.Place,
		groups: map[string]*group.Host{"work": {}}}
	want := map[replicaKey]bool{{"work", 0}: false, {"work", 1}: true, {"work", 2}: false, {"sink", 0}: false}
	c.place["sink"] = []string{"w2"}
	done := func(work ...bool) *instance { // w2, as its last snapshot had its work replicas
		var reps []report.ReplicaSnapshot
		for _, d := range work {
			reps = append(reps, report.ReplicaSnapshot{Done: d})
		}
		return &instance{name: "w2", last: &report.Snapshot{Stages: []report.StageSnapshot{{Name: "work", Replicas: reps}}}}
	}
	if got := c.endedOn(done(true, true, true)); !maps.Equal(got, want) {
		t.Errorf("ended on w2: %v, want %v", got, want)
	}
	// recorded settled after the last snapshot, its end not written: the
	// figures and the deadlock watch would not have its end
	if got := c.endedOn(done(true, false, true)); got[replicaKey{"work", 1}] {
		t.Errorf("ended on w2, not done in its last snapshot: %v, want work[1] restarted", got)
	}
	// its end written too: its consumer may have ended on it, so it stays
	// (recover marks it done), unless w2 was never seen at all
	if _, err := l.ends.Put(ctx, wire.KeyEnd(1, 0, 1), []byte("w2")); err != nil {
		t.Fatal(err)
	}
	if got := c.endedOn(done(true, false, true)); !maps.Equal(got, want) {
		t.Errorf("ended on w2 with its end written, not done in its last snapshot: %v, want %v", got, want)
	}
	if got := c.endedOn(&instance{name: "w2"}); got[replicaKey{"work", 1}] {
		t.Errorf("ended on w2, never seen: %v, want work[1] restarted", got)
	}
	c.groups = nil // no group across workers: work[1] would be one apart from work[0] and [2]
	if got := c.endedOn(done(true, true, true)); got[replicaKey{"work", 1}] {
		t.Errorf("ended on w2 with no group host: %v, want every work replica restarted", got)
	}
	c.groups = map[string]*group.Host{"work": {}}
	c.remote = map[string][]bool{"a": {true}, "b": {false}} // b in process on the lost worker
	if got := c.endedOn(done(true, true, true)); got[replicaKey{"work", 1}] {
		t.Errorf("ended on w2 with its output in process: %v, want work[1] restarted", got)
	}
}

// TestFinishedChainStaysWhole: a lost worker's chain (work feeding the
// sink in process, a chain's edge) stays finished only when every replica
// of it had finished by the rule for one replica; one that had not
// restarts the chain whole.
func TestFinishedChainStaysWhole(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := chain(t, 1)
	job := &wire.Job{Run: "chainstays", Remote: map[string][]bool{"a": {true}, "b": {false}}, Chained: map[string]bool{"b": true},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w2"}}}
	setUp(t, js, job, g)
	l := shareOf(t, nc, js, job, g, "w2")
	ctx := context.Background()
	if _, err := l.ends.Put(ctx, wire.KeySettled(1, 0), []byte("w2")); err != nil { // work[0] settled, the sink not
		t.Fatal(err)
	}
	c := &Coordinator{o: CoordOptions{Registry: nodes.Default}, g: g, js: js, run: job.Run, remote: job.Remote,
		chained: job.Chained, place: job.Place}
	in := &instance{name: "w2", last: &report.Snapshot{Stages: []report.StageSnapshot{
		{Name: "work", Replicas: []report.ReplicaSnapshot{{Done: true}}},
		{Name: "sink", Replicas: []report.ReplicaSnapshot{{Done: true}}}}}}
	if got := c.endedOn(in); got[replicaKey{"work", 0}] || got[replicaKey{"sink", 0}] {
		t.Errorf("ended on w2 with the sink unsettled: %v, want the chain restarted whole", got)
	}
	if _, err := l.ends.Put(ctx, wire.KeySettled(2, 0), []byte("w2")); err != nil {
		t.Fatal(err)
	}
	if got := c.endedOn(in); !got[replicaKey{"work", 0}] || !got[replicaKey{"sink", 0}] {
		t.Errorf("ended on w2 with the whole chain settled: %v, want both to stay", got)
	}
}

// TestSettledAfterLastSnapshot: a worker lost after its replicas had
// returned, settled everything (their record written) and written their
// ends, but before a snapshot showed them done (snapshots come once a
// second). Their consumer may have ended on those ends: run again, a
// replica could take an item another lost replica held on a shared input
// and send it after that end (TestWorkerKilled's "two a second apart",
// about 1 run in 10 under load: 'stage "drafter" returned with 1 items of
// stage "target" unread'). They stay finished, and w2's last snapshot now
// has them done, for the deadlock watch and the report. No worker is
// live here: a restart would fail the recover.
func TestSettledAfterLastSnapshot(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := chain(t, 3)
	job := &wire.Job{Run: "settled-late", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2", "w2", "w2"}, "sink": {"w3"}}}
	setUp(t, js, job, g)
	l := shareOf(t, nc, js, job, g, "w2")
	ctx := context.Background()
	for i := range 3 {
		if _, err := l.ends.Put(ctx, wire.KeySettled(1, i), []byte("w2")); err != nil {
			t.Fatal(err)
		}
		if _, err := l.ends.Put(ctx, wire.KeyEnd(1, 0, i), []byte("w2")); err != nil {
			t.Fatal(err)
		}
	}
	var log strings.Builder // written by recover, in this goroutine
	c := &Coordinator{o: CoordOptions{Registry: nodes.Default, Conn: nc, Log: &log, Timings: wire.Timings{Lease: time.Minute}},
		g: g, js: js, run: job.Run, remote: job.Remote, place: job.Place}
	last := &report.Snapshot{Stages: []report.StageSnapshot{{Name: "work", Replicas: []report.ReplicaSnapshot{{Done: true}, {}, {}}}}}
	in := &instance{name: "w2", worker: "w2", lost: true, last: last}
	c.instances = map[string]*instance{"w2": in}
	if err := c.recover(in); err != nil {
		t.Fatalf("recover: %v\n%s", err, log.String())
	}
	if out := log.String(); !strings.Contains(out, "its replicas had finished (work[0], work[1], work[2])") {
		t.Errorf("log:\n%s", out)
	}
	if got := c.place["work"]; !slices.Equal(got, []string{"w2", "w2", "w2"}) {
		t.Errorf("work placed on %v, want it left on w2", got)
	}
	for i := range 3 {
		if !replicaDone(in.last, "work", i) {
			t.Errorf("work[%d] not done in w2's last snapshot", i)
		}
	}
	if last.Stages[0].Replicas[1].Done {
		t.Error("the snapshot merged before was changed")
	}
}

// TestRoomWithinBound: what a consumer's worker has delivered and not
// acked is out of a queue's room, but the stream's own bound (backstop,
// 52 here) counts it: a producer keeps within the bound whatever the room
// says. The server applies acks on its own time, so a consumer that takes
// fast leaves dozens of acked messages the stream still stores and counts
// delivered; a producer that took that room was refused ("the stream
// refused an item for room past its bound of 52", BenchmarkRemoteEdge's
// 64B case, most runs). Here a consumer holds every message unacked: the
// producer stops at the bound, unrefused, and goes on once they are acked.
func TestRoomWithinBound(t *testing.T) {
	t.Parallel()
	srv, _ := testServer(t)
	send, _, js, cleanup := edgePairCap(t, srv, "bound", 16)
	defer cleanup()
	q := send.(*jsQueue)
	bound := wire.Backstop(q.edge, q.l.job.Chained)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := bound + 8
	errs := sendSmall(ctx, send, n, q.flush)
	cons, err := js.Consumer(ctx, wire.StreamEdge("bound", 0), wire.ConsumerQueue(0))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	take := func(max int) {
		b, err := cons.Fetch(max, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			held = append(held, m)
		}
	}
	if !testutil.Within(30*time.Second, func() bool {
		take(bound - len(held))
		return len(held) >= bound
	}) {
		t.Fatalf("the consumer holds %d messages, want the bound, %d", len(held), bound)
	}
	select {
	case err := <-errs:
		t.Fatalf("the producer, at the bound: %v", err)
	case <-time.After(500 * time.Millisecond): // it waits for room
	}
	for _, m := range held {
		m.Ack()
	}
	for len(held) < n {
		take(n - len(held))
	}
	if err := <-errs; err != nil {
		t.Fatalf("the producer, once the consumer acked: %v", err)
	}
}

// TestSettleLost: a lost share's replicas of a restartable stage are
// counted so that the stage adds up to what its edges' streams say: an
// item the lost share took and had not settled was done again by the
// share that took over (counted twice by the shares' own figures), and one
// it settled after its last snapshot is in no snapshot. The difference
// goes to the lost share's part, never below nothing.
func TestSettleLost(t *testing.T) {
	t.Parallel()
	g := chain(t, 2)
	c := &Coordinator{g: g}
	edges := map[string]report.Edge{"a": {Produced: 20, Consumed: 20}, "b": {Produced: 20, Consumed: 20}}
	for _, tc := range []struct {
		name         string
		live, lost   [2]int64 // replica 0 was lost once and restarted; replica 1 never was
		want0, want1 int64
	}{
		{"done twice", [2]int64{6, 8}, [2]int64{10, 0}, 12, 8},     // 4 of the lost share's 10 were done again
		{"settled late", [2]int64{6, 8}, [2]int64{3, 0}, 12, 8},    // 3 of its 6 settled after its last snapshot
		{"all done again", [2]int64{12, 8}, [2]int64{5, 0}, 12, 8}, // none of its 5 settled: nothing left to it
	} {
		reps := []report.Replica{
			{ItemsIn: tc.live[0] + tc.lost[0], ItemsOut: tc.live[0] + tc.lost[0]},
			{ItemsIn: tc.live[1] + tc.lost[1], ItemsOut: tc.live[1] + tc.lost[1]},
		}
		c.settleLost(g.Stage("work"), reps, tc.lost[:], tc.lost[:], edges)
		if reps[0].ItemsIn != tc.want0 || reps[1].ItemsIn != tc.want1 || reps[0].ItemsOut != tc.want0 || reps[1].ItemsOut != tc.want1 {
			t.Errorf("%s: replicas took %d and %d, sent %d and %d; want %d and %d each way",
				tc.name, reps[0].ItemsIn, reps[1].ItemsIn, reps[0].ItemsOut, reps[1].ItemsOut, tc.want0, tc.want1)
		}
	}
}

// TestLargeItemsNobodyReads: a consumer that returns before reading all
// its input, across workers, with the items' bytes on the producer's data
// plane: the run ends (it fails, saying a consumer must read its input to
// the end, as in one process), and the producer's share does not wait for
// ever for releases that will not come.
func TestLargeItemsNobodyReads(t *testing.T) {
	t.Parallel()
	reg := nodes.Default.Clone()
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "take_one", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				_, err := r.In("in").Recv(ctx)
				return err
			}), nil
		},
	})
	tc := startClusterWith(t, 2, reg)
	spec := writeSpec(t, "one.hcl", `
stage "src" {
  node = "synthetic_source"
  config {
    count      = 3
    size_bytes = 1048576
  }
}
stage "one" {
  node = "take_one"
}
edge "e" {
  from     = src.out
  to       = one.in
  capacity = 8
}
`)
	rep, c, err := tc.runWith(t, spec, 2, func(o *CoordOptions) { o.Pin = map[string][]string{"src": {"w1"}, "one": {"w2"}} })
	if err == nil || rep.Status != report.Failed || !strings.Contains(err.Error(), "must read its input to the end") {
		t.Errorf("status %s, err %v (placement %s)", rep.Status, err, c.Placement())
	}
}

// TestFullQueueWaitIsQuiet: a sender held back by a full queue across
// workers reads its room less often the longer it waits, up to every
// maxRoomWait: blocked for two seconds (a consumer that takes nothing, as
// in a deadlock) it costs the server a few dozen API requests, where it
// cost about two thousand when it read its room every 2 ms (two requests
// a read) for as long as the wait lasted. Where the queue's consumer is in
// the sender's own instance, the reads are only a fallback: its fetch
// wakes the sender.
func TestFullQueueWaitIsQuiet(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		consumer  string // where stage work runs
		requests  uint64 // at most, in a wait of 2 s
		thenTaken bool   // the consumer takes an item: the send goes
	}{
		{"consumer elsewhere", "w2", 200, false},
		{"consumer here", "w1", 100, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, nc := testServer(t)
			js, _ := wire.NewJS(nc)
			g := chain(t, 1)
			g.Edges[0].Capacity = 2
			job := &wire.Job{Run: "quiet", Remote: map[string][]bool{"a": {true}, "b": {false}},
				Place: map[string][]string{"src": {"w1"}, "work": {c.consumer}, "sink": {c.consumer}}}
			ctx := context.Background()
			setUp(t, js, job, g)
			q := shareOf(t, nc, js, job, g, "w1").For(g.Edges[0], 0).(*jsQueue)
			for i := range 2 {
				if err := q.Send(ctx, &items.Blob{Data: []byte{byte(i)}}, engine.Origin{}); err != nil {
					t.Fatal(err)
				}
			}
			api := func() uint64 {
				js, err := srv.s.Jsz(nil)
				if err != nil {
					t.Fatal(err)
				}
				return js.API.Total
			}
			before := api()
			blocked, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := q.Send(blocked, &items.Blob{Data: []byte{2}}, engine.Origin{}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a send to a full queue: %v, want it held until its context ended", err)
			}
			if n := api() - before; n > c.requests {
				t.Errorf("%d JetStream API requests while a send waited 2 s for room, want at most %d: it reads its room too often", n, c.requests)
			} else {
				t.Logf("%d JetStream API requests while a send waited 2 s for room", n)
			}
			if !c.thenTaken {
				return
			}
			sent := make(chan error, 1)
			go func() { sent <- q.Send(ctx, &items.Blob{Data: []byte{3}}, engine.Origin{}) }()
			if _, _, err := q.Recv(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-sent:
				if err != nil {
					t.Errorf("the send once the consumer took an item: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the send waited on after the consumer here took an item")
			}
		})
	}
}

// TestTakenSettledOnce: an input is handed to the ledger once, even where
// a node sends from another goroutine after asking for its next item (a
// publish derived from the input after it was finished): counted twice, its
// replica's open count went below nothing, and the replica was never
// recorded settled.
func TestTakenSettledOnce(t *testing.T) {
	t.Parallel()
	lg := &ledger{wake: make(chan struct{}, 1)}
	tk := &taken{id: "in-1"}
	tk.finish(lg) // nothing under way: to the ledger
	tk.derive()   // a late send
	tk.answered(lg)
	if n := len(lg.finished); n != 1 {
		t.Errorf("the input went to the ledger %d times, want once", n)
	}
}

// TestRoomSaid: a producer waiting for room in a queue whose consumer is
// on another worker is told when that consumer fetches (on the queue's
// room subject), and reads the room two or three times for each item it
// then sends, not every few milliseconds while it waits: reading every 2 ms, a
// blocked target of the seed read it about ten times for each item its
// slower drafter took, two JetStream API requests a read.
func TestRoomSaid(t *testing.T) {
	t.Parallel()
	srv, _ := testServer(t)
	send, recv, js, cleanup := edgePairCap(t, srv, "said", 4)
	defer cleanup()
	if send.(*jsQueue).roomSub == nil {
		t.Fatal("the producer does not listen for the room its consumer makes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	requests := func() uint64 {
		info, err := js.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.API.Total
	}
	const n = 40
	errs := sendSmall(ctx, send, n, func() error { send.Close(); return nil })
	before := requests()
	for range n {
		if _, ok, err := recv.Recv(ctx); err != nil || !ok {
			t.Fatalf("recv: %v %v", ok, err)
		}
		time.Sleep(20 * time.Millisecond) // a consumer slower than its producer
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// About three reads an item (one that finds the room, one that finds
	// it gone and one 2 ms later, two requests each), and both sides'
	// depth reads and keep-alives; reading every 2 ms, 10 or more an item.
	got := requests() - before
	t.Logf("%d JetStream API requests for %d items", got, n)
	if got > 8*n {
		t.Errorf("%d JetStream API requests for %d items through a full queue, want at most %d", got, n, 8*n)
	}
	// and it was told (with no word, reading every 100 ms, it would make
	// fewer requests, and take 40 times as long): one word for what came
	// together, and at most the consumer side's inbox (4 here) comes at once
	if said, err := send.(*jsQueue).roomSub.Delivered(); err != nil || said < n/4 {
		t.Errorf("the producer was told of room %d times (%v) for %d items, want at least one for every four", said, err, n)
	}
}

// sendSmall sends n items of 64 bytes on send from a goroutine, then
// end's error, or the first Send's, on the channel it returns.
func sendSmall(ctx context.Context, send engine.Transport, n int, end func() error) <-chan error {
	errs := make(chan error, 1)
	go func() {
		for range n {
			if err := send.Send(ctx, &items.Blob{Data: make([]byte, 64)}, engine.Origin{}); err != nil {
				errs <- err
				return
			}
		}
		errs <- end()
	}()
	return errs
}
