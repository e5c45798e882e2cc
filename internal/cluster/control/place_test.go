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
	place, remote := Place(g, []string{"w1", "w2"}, nil)
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
		remote := RemoteQueues(g, place, func(s *graph.Stage) bool { return s == restarts })
		if want := []bool{true, true}; !slices.Equal(remote["bc"], want) {
			t.Errorf("%s restartable: bc remote %v, want %v", name, remote["bc"], want)
		}
	}
}
