package settle

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// TestPositionRecordedAtMostEvery: a resuming source's items settled one
// settle at a time move its position at each, but the position bucket is
// written at most every recordEvery, not once a settle, and the last
// position is written within recordEvery though no settle follows it.
func TestPositionRecordedAtMostEvery(t *testing.T) {
	t.Parallel()
	_, nc := clustertest.Server(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	a := &graph.Stage{Name: "a", Replicas: 1}
	b := &graph.Stage{Name: "b", Replicas: 1}
	g := &graph.Graph{Stages: []*graph.Stage{a, b}, Edges: []*graph.Edge{
		{Name: "ab", From: &graph.Port{Stage: a}, To: &graph.Port{Stage: b}, Queues: graph.Wire(graph.Shared, 1, 1)}}}
	ctx, cancel := context.WithCancel(context.Background())
	remote := map[string][]bool{"ab": {false}}
	if err := wire.SetupRun(ctx, js, "pos", g, remote, wire.DefaultAckWait); err != nil {
		t.Fatal(err)
	}
	positions, err := js.KeyValue(ctx, wire.BucketPositions("pos"))
	if err != nil {
		t.Fatal(err)
	}
	lg := New(Env{NC: nc, Graph: g, Instance: "w1", Positions: positions, Stop: ctx}, share{"w1"})
	var wg sync.WaitGroup
	wg.Go(lg.Run)
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		wire.TeardownRun(js, "pos", g, remote)
	})
	p, err := lg.Resume(ctx, "a.0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	for k := range int64(n) {
		p.Item(k).Done()
		for deadline := time.Now().Add(10 * time.Second); p.At() != k+1; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("item %d not settled within 10s: position %d", k, p.At())
			}
		}
	}
	var e jetstream.KeyValueEntry
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if e, err = positions.Get(ctx, "a.0"); err == nil && string(e.Value()) == strconv.Itoa(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("position not recorded as %d within 10s: %v %v", n, e, err)
		}
	}
	// One key in the bucket: its revision counts the writes.
	if e.Revision() > n/2 {
		t.Errorf("%d settles wrote the position %d times, want at most every recordEvery", n, e.Revision())
	}
	t.Logf("%d settles, %d writes", n, e.Revision())
}
