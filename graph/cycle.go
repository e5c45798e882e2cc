package graph

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// CycleError reports a loop in a graph: Stages[0] feeds Stages[1] and so on,
// the last feeding the first, through Edges (Edges[i] runs from Stages[i]
// to Stages[(i+1)%len]).
type CycleError struct {
	Stages []string
	Edges  []string
}

func (e *CycleError) Error() string {
	return "graph: cycle " + strings.Join(append(append([]string{}, e.Stages...), e.Stages[0]), " -> ")
}

// Cycles returns every loop of the graph, one per strongly connected
// component, in declaration order of their first stage. A valid graph has
// none; Load reports each as an error.
func Cycles(g *Graph) []*CycleError {
	out := map[*Stage][]*Edge{}
	for _, e := range g.Edges {
		if e.From != nil && e.To != nil {
			out[e.From.Stage] = append(out[e.From.Stage], e)
		}
	}
	var cycles []*CycleError
	for _, comp := range stronglyConnected(g.Stages, out) {
		if c := loopThrough(comp, out); c != nil {
			cycles = append(cycles, c)
		}
	}
	return cycles
}

// stronglyConnected is Tarjan's algorithm over the stages.
func stronglyConnected(stages []*Stage, out map[*Stage][]*Edge) [][]*Stage {
	index := map[*Stage]int{}
	low := map[*Stage]int{}
	onStack := map[*Stage]bool{}
	var stack []*Stage
	var comps [][]*Stage
	var visit func(s *Stage)
	visit = func(s *Stage) {
		index[s] = len(index)
		low[s] = index[s]
		stack = append(stack, s)
		onStack[s] = true
		for _, e := range out[s] {
			t := e.To.Stage
			if _, seen := index[t]; !seen {
				visit(t)
				low[s] = min(low[s], low[t])
			} else if onStack[t] {
				low[s] = min(low[s], index[t])
			}
		}
		if low[s] != index[s] {
			return
		}
		var comp []*Stage
		for {
			t := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[t] = false
			comp = append(comp, t)
			if t == s {
				break
			}
		}
		comps = append(comps, comp)
	}
	for _, s := range stages {
		if _, seen := index[s]; !seen {
			visit(s)
		}
	}
	return comps
}

// loopThrough finds one loop inside a strongly connected component, or nil
// when the component is a single stage without a self-edge.
func loopThrough(comp []*Stage, out map[*Stage][]*Edge) *CycleError {
	in := map[*Stage]bool{}
	start := comp[0]
	for _, s := range comp {
		in[s] = true
		if s.DeclRange.Start.Byte < start.DeclRange.Start.Byte ||
			(s.DeclRange.Start.Byte == start.DeclRange.Start.Byte && s.order < start.order) {
			start = s
		}
	}
	// Breadth-first search from start back to start, inside the component.
	prev := map[*Stage]*Edge{}
	queue := []*Stage{start}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, e := range out[s] {
			t := e.To.Stage
			if !in[t] {
				continue
			}
			if t == start {
				return buildLoop(start, e, prev)
			}
			if _, seen := prev[t]; !seen {
				prev[t] = e
				queue = append(queue, t)
			}
		}
	}
	return nil
}

func buildLoop(start *Stage, last *Edge, prev map[*Stage]*Edge) *CycleError {
	edges := []*Edge{last}
	for s := last.From.Stage; s != start; s = prev[s].From.Stage {
		edges = append(edges, prev[s])
	}
	c := &CycleError{}
	for i := len(edges) - 1; i >= 0; i-- {
		c.Stages = append(c.Stages, edges[i].From.Stage.Name)
		c.Edges = append(c.Edges, edges[i].Name)
	}
	return c
}

func (b *Builder) checkCycles() bool {
	cycles := Cycles(b.g)
	for _, c := range cycles {
		e := b.g.edges[c.Edges[0]]
		b.diags = append(b.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "cycle",
			Detail: fmt.Sprintf("stages %s form a loop through edges %s; a pipeline must be acyclic.",
				strings.Join(append(append([]string{}, c.Stages...), c.Stages[0]), " -> "),
				quoteAll(c.Edges)),
			Subject: subject(e.NameRange),
		})
	}
	return len(cycles) > 0
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
