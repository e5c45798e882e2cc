package wire

import (
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// TestKinds: which stages restart elsewhere, may be part of a chain,
// carry state that moves, and have their group hosted by the
// coordinator. A chain's stage keeps nothing past an item: a kind whose
// state moves, or whose replicas step together, is never chainable, even
// where it restarts.
func TestKinds(t *testing.T) {
	reg := nodes.NewRegistry()
	kind := func(name string, spec nodes.Spec) {
		spec.Kind = graph.Kind{Name: name, Ports: func(*graph.Config) []graph.PortSpec { return nil }}
		reg.Register(spec)
	}
	sync := func(*graph.Config) bool { return true }
	kind("stateless", nodes.Spec{Stateless: true})
	kind("stepping", nodes.Spec{Stateless: true, Sync: sync})
	kind("moving", nodes.Spec{Moves: true, Sync: sync})
	kind("kept", nodes.Spec{})
	kind("resuming", nodes.Spec{Resumes: true})
	kind("fresh", nodes.Spec{})
	in := []*graph.Port{{Name: "in"}}
	for _, c := range []struct {
		stage                       *graph.Stage
		restartable, chainable, mvs bool
	}{
		{&graph.Stage{Name: "a", Node: "stateless", Inputs: in, Replicas: 2}, true, true, false},
		{&graph.Stage{Name: "b", Node: "stepping", Inputs: in, Replicas: 2}, true, false, false},
		{&graph.Stage{Name: "c", Node: "moving", Inputs: in, Replicas: 2}, true, false, true},
		{&graph.Stage{Name: "d", Node: "kept", Inputs: in, Replicas: 1}, false, false, false},
		{&graph.Stage{Name: "e", Node: "resuming", Replicas: 1}, true, true, false},
		{&graph.Stage{Name: "f", Node: "fresh", Replicas: 1}, false, false, false},
		{&graph.Stage{Name: "g", Node: "unknown", Inputs: in, Replicas: 1}, false, false, false},
	} {
		s := c.stage
		if got := Restartable(reg, s); got != c.restartable {
			t.Errorf("%s (%s): restartable %v, want %v", s.Name, s.Node, got, c.restartable)
		}
		if got := Chainable(reg, s); got != c.chainable {
			t.Errorf("%s (%s): chainable %v, want %v", s.Name, s.Node, got, c.chainable)
		}
		if got := Moves(reg, s); got != c.mvs {
			t.Errorf("%s (%s): moves %v, want %v", s.Name, s.Node, got, c.mvs)
		}
	}
	moving := &graph.Stage{Name: "c", Node: "moving", Inputs: in, Replicas: 1}
	if !Hosted(reg, moving, []string{"w1"}, false) {
		t.Error("a lone replica whose state moves: not hosted, want hosted (it restores through the host)")
	}
	two := &graph.Stage{Name: "c", Node: "moving", Inputs: in, Replicas: 2}
	if Hosted(reg, two, []string{"w1", "w1"}, false) || !Hosted(reg, two, []string{"w1", "w2"}, false) {
		t.Error("a group of two: hosted only when its members sit on two workers")
	}
	// a rebalance's slots join through the host, even all on one worker
	// (a local group's final save does not count slots)
	if !Hosted(reg, two, []string{"w1", "w1"}, true) {
		t.Error("a group of two with a rebalance's slots on one worker: not hosted, want hosted")
	}
	kept := &graph.Stage{Name: "d", Node: "kept", Inputs: in, Replicas: 2}
	if Hosted(reg, kept, []string{"w1", "w1"}, true) {
		t.Error("a stage whose state does not move, with slots on one worker: hosted, want in process")
	}
}

// TestPlaced: an instance's line names its replicas in the graph's
// order, and says so when it runs none (a worker a run left idle).
func TestPlaced(t *testing.T) {
	g := &graph.Graph{Stages: []*graph.Stage{{Name: "src"}, {Name: "work"}}}
	job := &Job{Place: map[string][]string{"src": {"w1"}, "work": {"w2", "w1"}}}
	for inst, want := range map[string]string{"w1": "src[0] work[1]", "w2": "work[0]", "w3": "no replicas here"} {
		if got := Placed(g, job, inst); got != want {
			t.Errorf("Placed(%s) = %q, want %q", inst, got, want)
		}
	}
}
