package control

import (
	"slices"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

// TestPlace: replicas go to the workers in turn, stage after stage in the
// spec's order; a queue rides a stream where its producers and consumers
// are not all on one worker, where it feeds a stage that restarts
// elsewhere after a loss, and, on an edge of several queues, where such a
// stage sends on it (a duplicate sent by another replica meets the first
// in one stream); a queue within one worker between stages that do not
// restart stays in process.
func TestPlace(t *testing.T) {
	a := &graph.Stage{Name: "a", Replicas: 1}
	b := &graph.Stage{Name: "b", Replicas: 2}
	c := &graph.Stage{Name: "c", Replicas: 2}
	edge := func(name string, from, to *graph.Stage, queues ...graph.Queue) *graph.Edge {
		return &graph.Edge{Name: name, From: &graph.Port{Stage: from}, To: &graph.Port{Stage: to}, Queues: queues}
	}
	g := &graph.Graph{Stages: []*graph.Stage{a, b, c}, Edges: []*graph.Edge{
		edge("ab", a, b, graph.Queue{Producers: []int{0}, Consumers: []int{0, 1}}),
		edge("bc", b, c, graph.Queue{Index: 0, Producers: []int{0}, Consumers: []int{0}},
			graph.Queue{Index: 1, Producers: []int{1}, Consumers: []int{1}}),
	}}
	place, remote, _ := Place(g, []string{"w1", "w2"}, Kinds{}, nil)
	for s, want := range map[string][]string{"a": {"w1"}, "b": {"w2", "w1"}, "c": {"w2", "w1"}} {
		if !slices.Equal(place[s], want) {
			t.Errorf("stage %s placed on %v, want %v", s, place[s], want)
		}
	}
	// ab: a on w1, b on w2 and w1: remote; bc: b[0] and c[0] on w2, b[1]
	// and c[1] on w1: in process.
	if want := []bool{true}; !slices.Equal(remote["ab"], want) {
		t.Errorf("ab remote %v, want %v", remote["ab"], want)
	}
	if want := []bool{false, false}; !slices.Equal(remote["bc"], want) {
		t.Errorf("bc remote %v, want %v", remote["bc"], want)
	}
	// c restarts elsewhere: its input rides streams; b restarts: every
	// queue of its edge of several does.
	for name, restarts := range map[string]*graph.Stage{"c": c, "b": b} {
		remote, _ := Queues(g, place, Kinds{Restartable: func(s *graph.Stage) bool { return s == restarts }})
		if want := []bool{true, true}; !slices.Equal(remote["bc"], want) {
			t.Errorf("%s restartable: bc remote %v, want %v", name, remote["bc"], want)
		}
	}
}

// TestPlaceChains: replicas joined by a chainable edge (both stages
// chainable, every queue one producer's to one consumer) sit on one
// worker, and the edge is a chain's, in process; a shared edge of several
// producers is not chainable and rides a stream into a stage that
// restarts; a pin that parts a chain's replicas makes its edge ride a
// stream again.
func TestPlaceChains(t *testing.T) {
	src := &graph.Stage{Name: "src", Replicas: 1}
	a := &graph.Stage{Name: "a", Replicas: 2}
	b := &graph.Stage{Name: "b", Replicas: 2}
	c := &graph.Stage{Name: "c", Replicas: 1}
	edge := func(name string, from, to *graph.Stage, policy graph.Policy) *graph.Edge {
		return &graph.Edge{Name: name, From: &graph.Port{Stage: from}, To: &graph.Port{Stage: to},
			Queues: graph.Wire(policy, from.Replicas, to.Replicas)}
	}
	g := &graph.Graph{Stages: []*graph.Stage{src, a, b, c}, Edges: []*graph.Edge{
		edge("sa", src, a, graph.Shared),   // one producer, two consumers: not a chain's
		edge("ab", a, b, graph.RoundRobin), // a[i] -> b[i]: a chain's
		edge("bc", b, c, graph.RoundRobin), // b[0], b[1] -> c: not
	}}
	all := func(*graph.Stage) bool { return true }
	kinds := Kinds{Restartable: all, Chainable: all}
	place, remote, chained := Place(g, []string{"w1", "w2", "w3"}, kinds, nil)
	for i := range 2 {
		if place["a"][i] != place["b"][i] {
			t.Errorf("a[%d] on %s, b[%d] on %s: a chain parted", i, place["a"][i], i, place["b"][i])
		}
	}
	if place["a"][0] == place["a"][1] {
		t.Errorf("a's replicas both on %s: chains are spread", place["a"][0])
	}
	if !chained["ab"] || chained["sa"] || chained["bc"] {
		t.Errorf("chained %v, want ab only", chained)
	}
	if want := []bool{false, false}; !slices.Equal(remote["ab"], want) {
		t.Errorf("ab remote %v, want %v", remote["ab"], want)
	}
	if want := []bool{true}; !slices.Equal(remote["sa"], want) {
		t.Errorf("sa remote %v, want %v", remote["sa"], want)
	}
	// Without chainable kinds, the replicas go in turn, and every queue
	// into a stage that restarts rides a stream.
	place2, remote2, chained2 := Place(g, []string{"w1", "w2", "w3"}, Kinds{Restartable: all}, nil)
	if len(chained2) != 0 || !slices.Equal(remote2["ab"], []bool{true, true}) {
		t.Errorf("no chainable kinds: chained %v, ab remote %v", chained2, remote2["ab"])
	}
	if want := []string{"w2", "w3"}; !slices.Equal(place2["a"], want) {
		t.Errorf("no chainable kinds: a on %v, want %v", place2["a"], want)
	}
	// One producer rotating (or hashing) over two consumers' queues is
	// no chain: a restart may pick another queue, and the consumers would
	// all be drawn to the producer's worker.
	for _, policy := range []graph.Policy{graph.RoundRobin, graph.KeyHash} {
		fan := &graph.Graph{Stages: []*graph.Stage{src, a}, Edges: []*graph.Edge{edge("fan", src, a, policy)}}
		fplace, _, fchained := Place(fan, []string{"w1", "w2"}, kinds, nil)
		if fchained["fan"] || fplace["a"][0] == fplace["a"][1] {
			t.Errorf("%s from one producer to two: chained %v, a on %v", policy, fchained, fplace["a"])
		}
	}
	// A pin parts b[1] from a[1]: ab rides its stream.
	place["b"][1] = place["a"][0]
	remote3, chained3 := Queues(g, place, kinds)
	if chained3["ab"] || !slices.Equal(remote3["ab"], []bool{true, true}) {
		t.Errorf("parted chain: chained %v, ab remote %v", chained3, remote3["ab"])
	}
}

// TestPlacePinsLead: a chain's replicas follow a pinned one: b, joined to
// a by a chainable edge, goes where a's pin put it.
func TestPlacePinsLead(t *testing.T) {
	a := &graph.Stage{Name: "a", Replicas: 1}
	b := &graph.Stage{Name: "b", Replicas: 1}
	g := &graph.Graph{Stages: []*graph.Stage{a, b}, Edges: []*graph.Edge{
		{Name: "ab", From: &graph.Port{Stage: a}, To: &graph.Port{Stage: b}, Queues: graph.Wire(graph.Shared, 1, 1)}}}
	all := func(*graph.Stage) bool { return true }
	place, _, chained := Place(g, []string{"w1", "w2"}, Kinds{Restartable: all, Chainable: all}, map[string][]string{"a": {"w2"}})
	if place["a"][0] != "w2" || place["b"][0] != "w2" || !chained["ab"] {
		t.Errorf("a on %v, b on %v, chained %v: want both on w2, chained", place["a"], place["b"], chained)
	}
}
