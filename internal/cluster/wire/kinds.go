package wire

import (
	"fmt"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// Spread reports whether the replicas of a stage sit in more than one
// instance.
func Spread(place []string) bool {
	for _, p := range place {
		if p != place[0] {
			return true
		}
	}
	return false
}

// Hosted reports whether a stage's group is the coordinator's: its
// replicas sit in more than one instance, or it is a lone replica whose
// state moves (lost, it restores its group's last save through the host;
// its steps are barriers, which carry no vector), or its state moves and
// it has a rebalance's spare slots (slotted: Job.Parked), which join and
// leave through the host wherever they are. Several replicas on one
// instance sum in process, on their devices.
func Hosted(reg *nodes.Registry, s *graph.Stage, place []string, slotted bool) bool {
	return Spread(place) || (s.Replicas == 1 || slotted) && Moves(reg, s)
}

// Placed says which replicas an instance runs, or that it runs none.
func Placed(g *graph.Graph, job *Job, inst string) string {
	s := ""
	for _, st := range g.Stages {
		for i, p := range job.Place[st.Name] {
			if p == inst {
				if s != "" {
					s += " "
				}
				s += fmt.Sprintf("%s[%d]", st.Name, i)
			}
		}
	}
	if s == "" {
		return "no replicas here"
	}
	return s
}

// Restartable reports whether a stage's replicas may restart elsewhere:
// a source that resumes (Spec.Resumes); a stage of a stateless kind,
// stepping with the others or not (a synchronized one rejoins its group);
// a stage whose state moves to its restart (Spec.Moves).
func Restartable(reg *nodes.Registry, s *graph.Stage) bool {
	spec, ok := reg.Spec(s.Node)
	switch {
	case !ok:
		return false
	case len(s.Inputs) == 0:
		return spec.Resumes // a source keeps its place in what it emits
	default:
		return spec.Stateless || spec.Moves
	}
}

// Chainable reports whether a stage may be part of a chain (control.Kinds):
// it restarts elsewhere, and nothing of it outlives an item: no state that
// moves, no group.
func Chainable(reg *nodes.Registry, s *graph.Stage) bool {
	spec, ok := reg.Spec(s.Node)
	return ok && Restartable(reg, s) && !spec.Moves && (spec.Sync == nil || !spec.Sync(s.Config))
}

// Whole reports whether a stage's group cannot go on without any of its
// members (Spec.Whole): a member lost loses the group whole.
func Whole(reg *nodes.Registry, s *graph.Stage) bool {
	spec, ok := reg.Spec(s.Node)
	return ok && spec.Whole
}

// Moves reports whether a stage's state moves to a restart (Spec.Moves).
func Moves(reg *nodes.Registry, s *graph.Stage) bool {
	spec, ok := reg.Spec(s.Node)
	return ok && spec.Moves
}

// StageIndex is s's index in g's stages (-1: none), by pointer or name.
func StageIndex(g *graph.Graph, s *graph.Stage) int {
	for i, gs := range g.Stages {
		if gs == s || gs.Name == s.Name {
			return i
		}
	}
	return -1
}

// EdgeIndex is e's index in g's edges (-1: none), by pointer or name:
// the number in its stream's and subjects' names.
func EdgeIndex(g *graph.Graph, e *graph.Edge) int {
	for i, ge := range g.Edges {
		if ge == e || ge.Name == e.Name {
			return i
		}
	}
	return -1
}
