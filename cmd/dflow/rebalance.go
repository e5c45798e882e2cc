package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
)

// rebalanceFlag is --rebalance as given: asked for (on), turned off
// (--rebalance=false: off), or not given (the spec's block decides).
func rebalanceFlag(fs *flag.FlagSet, value bool) (on, off bool) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "rebalance" })
	return value, given && !value
}

// rebalanced gives g the rebalance `--rebalance` (on) asks for, when the
// spec has no rebalance block: over the stages that carry the work and
// whose replicas can move (sim.RebalanceStages), with the block's
// defaults. A spec's own block wins, unless --rebalance=false (off) takes
// it away. It says on stderr which stages share which budget; nil and an
// exit code when no two stages can.
func (e *env) rebalanced(cmd string, g *graph.Graph, on, off bool, opts sim.Options) (*graph.Graph, int) {
	if off {
		if g.Rebalance != nil {
			fmt.Fprintf(e.stderr, "dflow: rebalance: off (--rebalance=false): the stages keep the split the spec gives\n")
			g = g.WithoutRebalance()
		}
		return g, exitOK
	}
	if on && g.Rebalance == nil {
		stages, err := sim.RebalanceStages(g, opts)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow %s: --rebalance: %v\n", cmd, err)
			return nil, exitFailed
		}
		v, diags := g.WithRebalance(graph.Rebalance{Stages: stages, FromFlag: true})
		if diags.HasErrors() {
			graph.WriteDiagnostics(e.stderr, diags, nil)
			return nil, exitFailed
		}
		g = v
	}
	if r := g.Rebalance; r != nil {
		fmt.Fprintf(e.stderr, "dflow: rebalance: %s\n", describeRebalance(g))
	}
	return g, exitOK
}

// describeRebalance says in one line what a rebalance moves and when:
// "target and drafter share 8 replicas (now 5+3); looks every 10s, moves
// for a gain of 5% of the time left, a move costs 0s, no move back within
// 1m0s".
func describeRebalance(g *graph.Graph) string {
	r := g.Rebalance
	var now []string
	for _, name := range r.Stages {
		now = append(now, fmt.Sprint(g.Stage(name).Replicas))
	}
	names := strings.Join(r.Stages[:len(r.Stages)-1], ", ") + " and " + r.Stages[len(r.Stages)-1]
	where := ""
	if len(r.Devices) > 0 {
		where = " on " + strings.Join(r.Devices, ", ")
	}
	return fmt.Sprintf("%s share %d replicas%s (now %s); looks every %v, moves for a gain of %.0f%% of the time left, a move costs %v, no move back within %v",
		names, r.Replicas, where, strings.Join(now, "+"), r.Every, 100*r.MinGain, r.MoveCost, r.Hold)
}

// moveWords says one move: "moved 4 replicas drafter -> target: target
// 100% busy, drafter 41%; predicted +80% over the 49.7s left (20.0 ->
// 99.5 items/s)".
func moveWords(m report.Move, why string) string {
	from := m.From
	if from == "" {
		from = "(spare)"
	}
	what := plural(m.Replicas, "replica")
	return fmt.Sprintf("moved %s %s -> %s: %s; %s", what, from, m.To, m.Reason, why)
}
