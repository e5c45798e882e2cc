package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/finished"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// loader is clustertest.Loader.
func loader(reg *nodes.Registry) func(*wire.Job) (*graph.Graph, error) {
	return clustertest.Loader(reg)
}

// setUp makes job's streams, consumers and buckets, removed once the
// test has ended.
func setUp(t *testing.T, js jetstream.JetStream, job *wire.Job, g *graph.Graph) {
	t.Helper()
	if err := wire.SetupRun(context.Background(), js, job.Run, g, job.Remote, wire.DefaultAckWait); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.TeardownRun(js, job.Run, g, job.Remote) })
}

// endsOf is job's end bucket, where shares write their ends and records.
func endsOf(t *testing.T, js jetstream.JetStream, job *wire.Job) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), wire.BucketEnds(job.Run))
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// serverConn starts an embedded server for the test and connects to it.
func serverConn(t *testing.T) *nats.Conn {
	t.Helper()
	_, nc := testServer(t)
	return nc
}

// testServer is clustertest.Server.
func testServer(t *testing.T) (*Server, *nats.Conn) {
	t.Helper()
	return clustertest.Server(t)
}

// writeSpec is clustertest.WriteSpec.
func writeSpec(t *testing.T, name, src string) string {
	t.Helper()
	return clustertest.WriteSpec(t, name, src)
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

// TestSettledAfterLastSnapshot: a worker lost after its replicas had
// returned, settled everything (their record written) and written their
// ends, but before a snapshot showed them done (snapshots come once a
// second). Their consumer may have ended on those ends: run again, a
// replica could take an item another lost replica held on a shared input
// and send it after that end (TestWorkerKilled's "two a second apart"
// met it under load: 'stage "drafter" returned with 1 items of stage
// "target" unread'). They stay finished, and w2's last snapshot now
// has them done, for the deadlock watch and the report. No worker is
// live here: a restart would fail the recover.
func TestSettledAfterLastSnapshot(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := clustertest.Chain(t, 3)
	job := &wire.Job{Run: "settled-late", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2", "w2", "w2"}, "sink": {"w3"}}}
	setUp(t, js, job, g)
	ends := endsOf(t, js, job)
	ctx := context.Background()
	for i := range 3 {
		if _, err := ends.Put(ctx, wire.KeySettled(1, i), []byte("w2")); err != nil {
			t.Fatal(err)
		}
		if _, err := ends.Put(ctx, wire.KeyEnd(1, 0, i), []byte("w2")); err != nil {
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
		if !finished.Done(in.last, "work", i) {
			t.Errorf("work[%d] not done in w2's last snapshot", i)
		}
	}
	if last.Stages[0].Replicas[1].Done {
		t.Error("the snapshot merged before was changed")
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
