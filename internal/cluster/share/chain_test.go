package share

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// TestChainRecordSealed: a share's chain record holds what its settled
// heads derived, written before their acks; once the coordinator seals it
// (wire.SealChain, the share counted lost), the share's next write fails (errSealed), so
// it acks nothing more, and the record keeps what it held. A share that
// had written none is sealed all the same.
func TestChainRecordSealed(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	a := &graph.Stage{Name: "a", Replicas: 1}
	b := &graph.Stage{Name: "b", Replicas: 1}
	g := &graph.Graph{Stages: []*graph.Stage{a, b}, Edges: []*graph.Edge{
		{Name: "ab", From: &graph.Port{Stage: a}, To: &graph.Port{Stage: b}, Queues: graph.Wire(graph.Shared, 1, 1)}}}
	job := &wire.Job{Run: "sealed", Remote: map[string][]bool{"ab": {false}}, Chained: map[string]bool{"ab": true}}
	setUp(t, js, job, g)
	l := shareOf(t, nc, js, job, g, "w1")
	head := func(id string, n int64) *taken { return &taken{id: id, lg: l.ledger, chain: []int64{n}} }
	if err := l.ledger.recordChains([]*taken{head("x1", 3)}); err != nil {
		t.Fatal(err)
	}
	if err := l.ledger.recordChains([]*taken{head("x2", 2), head("x3", 1)}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := wire.SealChain(ctx, l.ends, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := l.ledger.recordChains([]*taken{head("x4", 5)}); !errors.Is(err, errSealed) {
		t.Fatalf("a write after the seal: %v, want errSealed", err)
	}
	rec, err := wire.ReadChain(ctx, l.ends, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Sealed || !maps.Equal(rec.Committed, map[string]int64{"ab": 6}) || !slices.Equal(rec.Last.IDs, []string{"x2", "x3"}) {
		t.Errorf("sealed record %+v, want committed ab=6, last x2 x3", rec)
	}
	// A share with no record yet: sealed as well.
	l2 := shareOf(t, nc, js, job, g, "w2")
	if _, err := wire.SealChain(ctx, l2.ends, "w2"); err != nil {
		t.Fatal(err)
	}
	if err := l2.ledger.recordChains([]*taken{head("y1", 1)}); !errors.Is(err, errSealed) {
		t.Fatalf("a first write after the seal: %v, want errSealed", err)
	}
}
