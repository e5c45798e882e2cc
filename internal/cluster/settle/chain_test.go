package settle

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/nats-io/nats.go/jetstream"
)

// share is a share as the tests' ledgers see it: never counted lost.
type share struct{ worker string }

func (s share) Worker() string  { return s.worker }
func (s share) Released() bool  { return false }
func (s share) Fatal(err error) {}

// TestChainRecordSealed: a share's chain record holds what its settled
// heads derived, written before their acks; once the coordinator seals it
// (wire.SealChain, the share counted lost), the share's next write fails (errSealed), so
// it acks nothing more, and the record keeps what it held. A share that
// had written none is sealed all the same.
func TestChainRecordSealed(t *testing.T) {
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
	ctx := context.Background()
	remote := map[string][]bool{"ab": {false}}
	if err := wire.SetupRun(ctx, js, "sealed", g, remote, wire.DefaultAckWait); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.TeardownRun(js, "sealed", g, remote) })
	ends, err := js.KeyValue(ctx, wire.BucketEnds("sealed"))
	if err != nil {
		t.Fatal(err)
	}
	ledger := func(instance string) *Ledger {
		return New(Env{NC: nc, Graph: g, Instance: instance, Ends: ends, Stop: ctx}, share{instance})
	}
	lg := ledger("w1")
	head := func(id string, n int64) *Taken { return &Taken{id: id, lg: lg, chain: []int64{n}} }
	if err := lg.recordChains([]*Taken{head("x1", 3)}); err != nil {
		t.Fatal(err)
	}
	if err := lg.recordChains([]*Taken{head("x2", 2), head("x3", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := wire.SealChain(ctx, ends, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := lg.recordChains([]*Taken{head("x4", 5)}); !errors.Is(err, errSealed) {
		t.Fatalf("a write after the seal: %v, want errSealed", err)
	}
	rec, err := wire.ReadChain(ctx, ends, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Sealed || !maps.Equal(rec.Committed, map[string]int64{"ab": 6}) || !slices.Equal(rec.Last.IDs, []string{"x2", "x3"}) {
		t.Errorf("sealed record %+v, want committed ab=6, last x2 x3", rec)
	}
	// A share with no record yet: sealed as well.
	lg2 := ledger("w2")
	if _, err := wire.SealChain(ctx, ends, "w2"); err != nil {
		t.Fatal(err)
	}
	if err := lg2.recordChains([]*Taken{head("y1", 1)}); !errors.Is(err, errSealed) {
		t.Fatalf("a first write after the seal: %v, want errSealed", err)
	}
}

// TestChainDerives: an item sent on a chain's edge has the id the edge's
// stream would have given it (derived from the sender's delivery in hand
// and how many it had sent from it), so what derives from it further on
// has the same ids whether a hop is chained or not; it counts on its
// chain's head, and as a publish under way of the delivery it derives
// from, which goes to the ledger only once everything derived from it is
// settled.
func TestChainDerives(t *testing.T) {
	t.Parallel()
	g := &graph.Graph{Edges: []*graph.Edge{{Name: "ab"}, {Name: "bc"}}}
	lg := New(Env{Graph: g}, share{"w1"})
	in := lg.Take(nil, "in-1", nil, false)
	child := lg.Chain(0).Derive(engine.Origin{Receipt: in, Sent: 2}).(*Taken)
	grandchild := lg.Chain(1).Derive(engine.Origin{Receipt: child, Sent: 0}).(*Taken)
	if got, want := child.ID(), edge.DerivedID("in-1", 2, "0"); got != want {
		t.Errorf("the chained item's id is %q, want %q (as the edge's stream would have it)", got, want)
	}
	if got, want := grandchild.ID(), edge.DerivedID(child.ID(), 0, "1"); got != want {
		t.Errorf("the item derived from it has id %q, want %q", got, want)
	}
	if !slices.Equal(in.chain, []int64{1, 1}) {
		t.Errorf("the head counts %v derived on the chain's edges, want [1 1]", in.chain)
	}
	queued := func() int {
		lg.mu.Lock()
		defer lg.mu.Unlock()
		return len(lg.finished)
	}
	in.Finish()
	child.Finish()
	if n := queued(); n != 0 {
		t.Fatalf("the head went to the ledger with an item derived from it unsettled (%d queued)", n)
	}
	grandchild.Finish()
	if n := queued(); n != 1 || lg.finished[0] != in {
		t.Errorf("once everything derived from it is settled, %d went to the ledger, want the head alone", n)
	}
}
