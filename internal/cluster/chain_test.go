package cluster

import (
	"encoding/json"
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
// (the share counted lost), the share's next write fails (errSealed), so
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
	c := &Coordinator{js: js, run: job.Run, chained: job.Chained}
	if err := c.sealChain(&instance{name: "w1"}); err != nil {
		t.Fatal(err)
	}
	if err := l.ledger.recordChains([]*taken{head("x4", 5)}); !errors.Is(err, errSealed) {
		t.Fatalf("a write after the seal: %v, want errSealed", err)
	}
	rec, err := c.readChain("w1")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Sealed || !maps.Equal(rec.Committed, map[string]int64{"ab": 6}) || !slices.Equal(rec.Last.IDs, []string{"x2", "x3"}) {
		t.Errorf("sealed record %+v, want committed ab=6, last x2 x3", rec)
	}
	// A share with no record yet: sealed as well.
	l2 := shareOf(t, nc, js, job, g, "w2")
	if err := c.sealChain(&instance{name: "w2"}); err != nil {
		t.Fatal(err)
	}
	if err := l2.ledger.recordChains([]*taken{head("y1", 1)}); !errors.Is(err, errSealed) {
		t.Fatalf("a first write after the seal: %v, want errSealed", err)
	}
}

// TestChainTwice: a stream's head settled by more than one share (its
// first holder recorded it in its last settle and was lost before the
// ack; later ones saw it delivered before) counts once: what it derived
// comes off for each share past the first; a head settled once, and a
// redelivered one only one share settled, come off nothing.
func TestChainTwice(t *testing.T) {
	t.Parallel()
	recs := map[string]wire.ChainRecord{
		"lost":  {Last: wire.ChainHeads{IDs: []string{"x", "y"}}},
		"again": {Redone: map[string]map[string]int64{"x": {"e": 2, "f": 1}}},
		"third": {Redone: map[string]map[string]int64{"x": {"e": 2, "f": 1}, "z": {"e": 5}}},
	}
	if got, want := wire.ChainTwice(recs), map[string]int64{"e": 4, "f": 2}; !maps.Equal(got, want) {
		t.Errorf("chainTwice = %v, want %v", got, want)
	}
	b, _ := json.Marshal(recs["lost"])
	var back wire.ChainRecord
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Last.IDs, []string{"x", "y"}) {
		t.Errorf("a record through JSON: %+v, %v", back, err)
	}
}
