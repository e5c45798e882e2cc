package engine

import (
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// The books of a run: what it counted of its items, edge by edge. A run
// that would end ok ends failed instead where they do not balance
// (CheckBooks): an item lost, or counted twice, is a bug, never a
// result.
//
// For every edge, from port P of stage S to stage T:
//
//   - produced: the items sent onto the edge, each once;
//   - consumed: the items taken off it by T's replicas;
//   - emitted: what S's replicas sent on P (every item sent on a port goes
//     once onto each of its edges), and, where S is a source whose kind
//     knows how many items it emits in all (nodes.Spec.Total) on its one
//     port, that count;
//   - taken: what T's replicas took in on the edge's input port.
//
// A run that ran to its end balances: produced = consumed = emitted on
// every edge, and T took what its edges consumed. A stage may send more or
// fewer items than it takes (a filter, a fan-out): the books are per edge,
// and say nothing of what a stage makes of its items, except where its
// kind sends one item on each output for each it takes
// (nodes.Spec.OneForOne): there they carry through it, what each of its
// out edges produced equal to what its in edges consumed (an item the
// stage took and settled without sending on is seen). A run cut short
// (failed, aborted) leaves items in its queues; a drain ends `interrupted`,
// not `ok`: neither is checked.
//
// Which figures are independent of which, in one process: produced is the
// sum of the producer ports' send counters on the edge's queues, consumed
// the sum of the consumer ports' receive counters, and a source's total
// comes from its config: those three are counted apart. A replica's
// items out are the send counters of the first edge of each port, so a
// stage's emitted is that edge's produced, counted by the same counters;
// the other edges of a port (a fan-out) have counters of their own. Items
// in are the receive counters, the same as consumed. Across hosts the
// coordinator's merged report has other sources for each (see
// internal/cluster/books.go).

// totals is how many items each source emits in all, by stage, where its
// kind says (for CheckBooks).
func (r *run) totals() map[string]int64 {
	out := map[string]int64{}
	for _, s := range r.stages {
		if len(s.g.Inputs) == 0 && s.total > 0 {
			out[s.g.Name] = s.total
		}
	}
	return out
}

// Unbalanced is the error of a run whose books do not balance: each of
// Lines names an edge, or a stage and its edges, and the counts that
// disagree.
type Unbalanced struct {
	Lines []string
}

func (u *Unbalanced) Error() string {
	return "books do not balance: " + strings.Join(u.Lines, "; ") +
		" (items were lost or counted twice: a bug in dflow; please report it with the run's report)"
}

// oneForOne is which stages' kinds send one item on each output for each
// they take, by name (for CheckBooksThrough).
func (r *run) oneForOne() map[string]bool {
	out := map[string]bool{}
	for _, s := range r.stages {
		if s.oneForOne {
			out[s.g.Name] = true
		}
	}
	return out
}

// CheckBooks checks the books of rep, a report of a run of g that ran to
// its end, against totals (by stage: how many items a source emits in
// all, where its kind says: nodes.Spec.Total); nil where they balance, else an
// *Unbalanced that names every edge (or stage) whose counts disagree, in
// the spec's order.
func CheckBooks(g *graph.Graph, rep *report.Report, totals map[string]int64) error {
	return CheckBooksThrough(g, rep, totals, nil)
}

// CheckBooksThrough is CheckBooks with the books carried through the
// stages named in oneForOne (nodes.Spec.OneForOne).
func CheckBooksThrough(g *graph.Graph, rep *report.Report, totals map[string]int64, oneForOne map[string]bool) error {
	var lines []string
	for _, e := range g.Edges {
		re := rep.Edges[e.Name]
		if re.Produced != re.Consumed {
			lines = append(lines, fmt.Sprintf("edge %q: %d produced, %d consumed", e.Name, re.Produced, re.Consumed))
		}
		if n, ok := totals[e.From.Stage.Name]; ok && len(e.From.Stage.Outputs) == 1 && re.Produced != n {
			lines = append(lines, fmt.Sprintf("edge %q: %d produced, stage %q emits %d in all", e.Name, re.Produced, e.From.Stage.Name, n))
		}
	}
	for _, s := range g.Stages {
		lines = append(lines, emitted(s, rep)...)
		lines = append(lines, taken(s, rep)...)
		if oneForOne[s.Name] {
			lines = append(lines, through(s, rep)...)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return &Unbalanced{Lines: lines}
}

// emitted compares what stage s's replicas sent (their items out) with
// what its out edges produced: each edge of a port as much as the port's
// first, and the ports' together as much as the replicas sent.
func emitted(s *graph.Stage, rep *report.Report) []string {
	var lines []string
	var ports []*graph.Port
	var sent int64 // over the ports, as their first edge has it
	for _, p := range s.Outputs {
		if len(p.Edges) == 0 {
			continue
		}
		ports = append(ports, p)
		first := rep.Edges[p.Edges[0].Name].Produced
		sent += first
		for _, e := range p.Edges[1:] {
			if n := rep.Edges[e.Name].Produced; n != first {
				lines = append(lines, fmt.Sprintf("edge %q: %d produced, edge %q from the same port %d", e.Name, n, p.Edges[0].Name, first))
			}
		}
	}
	out := itemsOf(rep, s.Name, func(r report.Replica) int64 { return r.ItemsOut })
	switch {
	case out == sent:
	case len(ports) == 1:
		for _, e := range ports[0].Edges {
			lines = append(lines, fmt.Sprintf("edge %q: %d produced, stage %q sent %d", e.Name, rep.Edges[e.Name].Produced, s.Name, out))
		}
	default:
		lines = append(lines, fmt.Sprintf("stage %q: sent %d, its edges %s produced %d", s.Name, out, firstEdges(ports), sent))
	}
	return lines
}

// taken compares what stage s's replicas took in with what its in edges
// consumed.
func taken(s *graph.Stage, rep *report.Report) []string {
	var edges []string
	var consumed int64
	for _, p := range s.Inputs {
		for _, e := range p.Edges {
			edges = append(edges, fmt.Sprintf("%q", e.Name))
			consumed += rep.Edges[e.Name].Consumed
		}
	}
	in := itemsOf(rep, s.Name, func(r report.Replica) int64 { return r.ItemsIn })
	switch {
	case in == consumed:
		return nil
	case len(edges) == 1:
		return []string{fmt.Sprintf("edge %s: %d consumed, stage %q took %d", edges[0], consumed, s.Name, in)}
	}
	return []string{fmt.Sprintf("stage %q: took %d, its edges %s consumed %d", s.Name, in, strings.Join(edges, ", "), consumed)}
}

// through compares what each out edge of stage s produced with what its
// in edges consumed: s sends one item on each output for each it takes.
func through(s *graph.Stage, rep *report.Report) []string {
	var consumed int64
	for _, p := range s.Inputs {
		for _, e := range p.Edges {
			consumed += rep.Edges[e.Name].Consumed
		}
	}
	var lines []string
	for _, p := range s.Outputs {
		for _, e := range p.Edges {
			if n := rep.Edges[e.Name].Produced; n != consumed {
				lines = append(lines, fmt.Sprintf("stage %q: its in edges consumed %d, its out edge %q produced %d (it sends one item for each it takes)", s.Name, consumed, e.Name, n))
			}
		}
	}
	return lines
}

// itemsOf adds up one count of stage name's replicas in rep.
func itemsOf(rep *report.Report, name string, count func(report.Replica) int64) int64 {
	var n int64
	for _, r := range rep.Stages[name].Replicas {
		n += count(r)
	}
	return n
}

// firstEdges names the first edge of each port, quoted, comma separated.
func firstEdges(ports []*graph.Port) string {
	var names []string
	for _, p := range ports {
		names = append(names, fmt.Sprintf("%q", p.Edges[0].Name))
	}
	return strings.Join(names, ", ")
}
