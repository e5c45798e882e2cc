package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

// compareRebalance is `dflow compare SPEC --rebalance`: the spec's static
// split, the best static split of the budget (the simulator's, for two
// stages, when it is not the spec's) and the split that moves as the
// rebalance decides, each run (or simulated) once, in one table. g is
// the spec as loaded; measured, with --sim, lends its service times.
func (e *env) compareRebalance(g *graph.Graph, file string, simulate bool, measured *report.Report) (comparison, int) {
	opts := sim.Options{Registry: e.registry, From: measured}
	live, code := e.rebalanced("compare", g, true, false, opts)
	if live == nil {
		return comparison{}, code
	}
	if !simulate {
		if why := run.Rebalancing(live, run.Options{Registry: e.registry}); why != nil {
			fmt.Fprintf(e.stderr, "dflow compare: --rebalance: a run would keep its split: %v (--sim simulates the moves)\n", why)
			return comparison{}, exitFailed
		}
	}
	rb := live.Rebalance
	static := live.WithoutRebalance()
	cmp := comparison{Spec: file, Rebalance: rb.Stages, Simulated: simulate}

	type variant struct {
		name string
		g    *graph.Graph
	}
	variants := []variant{{"static", static}}
	if len(rb.Stages) == 2 {
		a, b := rb.Stages[0], rb.Stages[1]
		splits, err := sim.Splits(static, a, b, rb.Replicas, opts)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow compare: --rebalance: %v\n", err)
			return comparison{}, exitFailed
		}
		if best := splits[0]; best.Err == nil && (best.A != static.Stage(a).Replicas || best.B != static.Stage(b).Replicas) {
			v, diags := static.With(graph.SetReplicas(a, best.A), graph.SetReplicas(b, best.B))
			if diags.HasErrors() {
				graph.WriteDiagnostics(e.stderr, diags, nil)
				return comparison{}, exitFailed
			}
			variants = append(variants, variant{"best static", v})
		}
	}
	variants = append(variants, variant{"rebalance", live})

	for _, v := range variants {
		split := splitOf(v.g, rb.Stages)
		var rep *report.Report
		var err error
		moved := func(at time.Duration, moves []report.Move, why string) {
			for _, m := range moves {
				fmt.Fprintf(e.stderr, "dflow: at %.1fs %s\n", at.Seconds(), moveWords(m, why))
			}
		}
		switch {
		case simulate:
			o := opts
			if v.g.Rebalance != nil {
				o.Rebalance = true
				o.Moved = func(at time.Duration, d sim.Decision) { moved(at, d.Transfers, d.Why) }
			}
			rep, err = sim.Run(v.g, o)
		default:
			fmt.Fprintf(e.stderr, "dflow: running %s, %s %s\n", file, v.name, strings.Join(split, "+"))
			o := run.Options{Registry: e.registry}
			if v.g.Rebalance != nil {
				o.Rebalance = true
				o.Moved = func(at time.Duration, d run.Decision) { moved(at, d.Moves, d.Why) }
			}
			rep, err = run.Run(context.Background(), v.g, o)
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow compare: %s %s: %v\n", v.name, strings.Join(split, "+"), err)
			return comparison{}, exitFailed
		}
		row := comparisonRow{Variant: v.name, Split: strings.Join(split, "+"), Status: rep.Status,
			Throughput: sim.Throughput(v.g, rep), WallSeconds: rep.WallSeconds, Moves: rep.Moves}
		if v.g.Rebalance != nil {
			row.EndSplit = strings.Join(endSplit(v.g, rep.Moves), "+")
			if row.Moves == nil {
				row.Moves = []report.Move{}
			}
		}
		cmp.Rows = append(cmp.Rows, row)
	}
	for i := range cmp.Rows {
		if w := cmp.Rows[i].WallSeconds; w > 0 {
			cmp.Rows[i].Speedup = cmp.Rows[0].WallSeconds / w
		}
	}
	return cmp, exitOK
}

// splitOf is the replicas of each of stages in g, as text.
func splitOf(g *graph.Graph, stages []string) []string {
	out := make([]string, len(stages))
	for i, name := range stages {
		out[i] = fmt.Sprint(g.Stage(name).Replicas)
	}
	return out
}

// endSplit is g's rebalanced split after moves.
func endSplit(g *graph.Graph, moves []report.Move) []string {
	rb := g.Rebalance
	n := map[string]int{}
	for _, name := range rb.Stages {
		n[name] = g.Stage(name).Replicas
	}
	for _, m := range moves {
		if m.From != "" {
			n[m.From] -= m.Replicas
		}
		n[m.To] += m.Replicas
	}
	out := make([]string, len(rb.Stages))
	for i, name := range rb.Stages {
		out[i] = fmt.Sprint(n[name])
	}
	return out
}

// printRebalanceComparison prints compare --rebalance's table: a row a
// split, the live one's moves in words.
func printRebalanceComparison(e *env, cmp comparison) {
	kind := "measured"
	if cmp.Simulated {
		kind = "simulated"
	}
	stages := strings.Join(cmp.Rebalance, "+")
	fmt.Fprintf(e.stdout, "%s, static split against rebalance of %s (%s)\n", cmp.Spec, stages, kind)
	fmt.Fprintf(e.stdout, "%-24s %9s %8s %8s  %s\n", "split ("+stages+")", "items/s", "wall", "speedup", "moves")
	for _, r := range cmp.Rows {
		moves := ""
		if r.EndSplit != "" {
			var said []string
			for _, m := range r.Moves {
				from := m.From
				if from == "" {
					from = "(spare)"
				}
				said = append(said, fmt.Sprintf("at %.1fs %d %s -> %s", m.T, m.Replicas, from, m.To))
			}
			moves = "none"
			if len(said) > 0 {
				moves = strings.Join(said, ", ") + "; ends " + r.EndSplit
			}
		}
		line := fmt.Sprintf("%-24s %9.1f %7.2fs %7.2fx  %s", r.Variant+" "+r.Split, r.Throughput, r.WallSeconds, r.Speedup, moves)
		fmt.Fprintln(e.stdout, strings.TrimRight(line, " "))
	}
}
