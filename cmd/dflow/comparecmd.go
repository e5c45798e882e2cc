package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

// comparison is what `dflow compare --json` prints: an edge's policies
// (Edge), or a static split beside a rebalance (Rebalance, its stages).
type comparison struct {
	Spec      string          `json:"spec"`
	Edge      string          `json:"edge,omitempty"`
	Rebalance []string        `json:"rebalance,omitempty"`
	Simulated bool            `json:"simulated"`
	Rows      []comparisonRow `json:"rows"`
}

type comparisonRow struct {
	Policy string `json:"policy,omitempty"`
	// Variant (--rebalance) is "static" (the spec's split), "best static"
	// (the simulator's best split of the budget) or "rebalance"; Split is
	// the split it starts at, the rebalanced stages' replicas joined by
	// "+", and EndSplit (a rebalance's) the split it ended at after Moves.
	Variant     string        `json:"variant,omitempty"`
	Split       string        `json:"split,omitempty"`
	EndSplit    string        `json:"end_split,omitempty"`
	Moves       []report.Move `json:"moves,omitempty"`
	Status      string        `json:"status"`
	Throughput  float64       `json:"throughput"` // items the sources emitted per second
	WallSeconds float64       `json:"wall_seconds"`
	Speedup     float64       `json:"speedup"` // against the first row's wall time
	Utilization []float64     `json:"utilization,omitempty"`
	MeanDepth   []float64     `json:"mean_depth,omitempty"`
}

func cmdCompare(e *env, args []string) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	edgeName := fs.String("edge", "", "the edge whose policy to vary, by its `NAME` in the spec (this or --rebalance)")
	rebalance := fs.Bool("rebalance", false, "compare the spec's static split, the simulator's best static split of the budget (two stages) and the split a rebalance moves while the run goes, over the spec's rebalance block or, without one, the stages that carry the work (this or --edge)")
	policies := fs.String("policies", "round_robin,shared", "the `POLICIES` to compare, separated by commas, of "+strings.Join(graph.PolicyNames(), ", ")+"; the first is the baseline the speedups are against")
	simulate := fs.Bool("sim", false, "simulate each policy in virtual time instead of running it")
	from := fs.String("from", "", "with --sim: take service times from `REPORT`, the report of a real run, and the overrides it ran with (those given here win)")
	asJSON := fs.Bool("json", false, "print the table as JSON on stdout")
	plotPath := fs.String("plot", "", "draw the throughput per policy as labelled bars into `FILE`, a .png or .jpg")
	files, code, ok := parse(e, fs, args, "SPEC (--edge NAME [--policies a,b] | --rebalance) [--sim] [flags]")
	if !ok {
		return code
	}
	policiesGiven := false
	fs.Visit(func(f *flag.Flag) { policiesGiven = policiesGiven || f.Name == "policies" })
	switch {
	case *rebalance && (*edgeName != "" || policiesGiven):
		return usageErr(e, "compare", "--edge and --policies compare an edge's policies, --rebalance a static split with one that moves; give one of them")
	case len(files) != 1 || *edgeName == "" && !*rebalance:
		return usageErr(e, "compare", "want one spec and --edge NAME or --rebalance")
	}
	pols := strings.Split(*policies, ",")
	for _, pol := range pols {
		if !slices.Contains(graph.Policies, graph.Policy(pol)) {
			return usageErr(e, "compare", "--policies: %q is not a policy; the policies are %s", pol, strings.Join(graph.PolicyNames(), ", "))
		}
	}
	if code, ok := checkOutputs(e, "compare", files[0], output{"plot", *plotPath, true}); !ok {
		return code
	}
	var measured *report.Report
	if *from != "" {
		var err error
		if measured, err = report.Read(*from); err != nil {
			fmt.Fprintf(e.stderr, "dflow compare: %v\n", err)
			return exitFailed
		}
		sf.under(e, "compare", measured, *from, files[0])
	}
	// The edge must exist before it is overridden: an unknown one is a
	// usage error naming --edge, not an error of the graph.With made below.
	g, code := e.loadSpec(&sf, files[0])
	if g == nil {
		return code
	}
	if *rebalance {
		cmp, code := e.compareRebalance(g, files[0], *simulate, measured)
		if code != exitOK {
			return code
		}
		if *asJSON {
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			enc.Encode(cmp)
		} else {
			printRebalanceComparison(e, cmp)
		}
		return e.plotComparison(cmp, *plotPath)
	}
	if g.Edge(*edgeName) == nil {
		var names []string
		for _, ed := range g.Edges {
			names = append(names, ed.Name)
		}
		return usageErr(e, "compare", "--edge %q: %s has no edge of that name; its edges are %s", *edgeName, files[0], strings.Join(names, ", "))
	}
	cmp := comparison{Spec: files[0], Edge: *edgeName, Simulated: *simulate}
	// Each policy is the loaded graph with the edge's policy set
	// (sim.Compare, graph.With): the spec is read once.
	runner := sim.Simulator(sim.Options{Registry: e.registry, From: measured})
	if !*simulate {
		runner = func(g *graph.Graph) (*report.Report, error) {
			fmt.Fprintf(e.stderr, "dflow: running %s with edge %s policy %s\n", files[0], *edgeName, g.Edge(*edgeName).Policy)
			return run.Run(context.Background(), g, run.Options{Registry: e.registry})
		}
	}
	varied := make([]graph.Policy, len(pols))
	for i, pol := range pols {
		varied[i] = graph.Policy(pol)
	}
	variants, err := sim.Compare(g, *edgeName, varied, runner)
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow compare: %v\n", err)
		return exitFailed
	}
	for _, v := range variants {
		cmp.Rows = append(cmp.Rows, comparisonRow{Policy: string(v.Policy), Status: v.Report.Status, Throughput: v.Throughput,
			WallSeconds: v.WallSeconds, Speedup: v.Speedup, Utilization: v.Utilization, MeanDepth: v.MeanDepth})
	}
	consumer := g.Edge(*edgeName).To.Stage.Name
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(cmp)
	} else {
		printComparison(e, cmp, consumer)
	}
	return e.plotComparison(cmp, *plotPath)
}

// plotComparison draws the table's throughputs as labelled bars into
// path, if given.
func (e *env) plotComparison(cmp comparison, path string) int {
	if path == "" {
		return exitOK
	}
	kind := map[bool]string{true: "simulated", false: "measured"}[cmp.Simulated]
	bars := make([]monitor.Bar, len(cmp.Rows))
	for i, r := range cmp.Rows {
		label := r.Policy
		if r.Variant != "" {
			label = r.Variant + " " + r.Split
		}
		bars[i] = monitor.Bar{Label: label, Value: r.Throughput, Note: fmt.Sprintf("%.2fs, %.2fx", r.WallSeconds, r.Speedup)}
	}
	title := fmt.Sprintf("%s: throughput per policy of edge %s (%s)", cmp.Spec, cmp.Edge, kind)
	xLabel := fmt.Sprintf("policy of edge %s (wall time, speedup against %s)", cmp.Edge, cmp.Rows[0].Policy)
	if cmp.Edge == "" {
		stages := strings.Join(cmp.Rebalance, "+")
		title = fmt.Sprintf("%s: throughput, static split and rebalance of %s (%s)", cmp.Spec, stages, kind)
		xLabel = fmt.Sprintf("split of %s (wall time, speedup against the static split)", stages)
	}
	if err := monitor.BarChart(bars, title, xLabel, path); err != nil {
		fmt.Fprintf(e.stderr, "dflow compare: %v\n", err)
		return exitFailed
	}
	return exitOK
}

func printComparison(e *env, cmp comparison, consumer string) {
	kind := "measured"
	if cmp.Simulated {
		kind = "simulated"
	}
	fmt.Fprintf(e.stdout, "%s, edge %s (%s)\n", cmp.Spec, cmp.Edge, kind)
	fmt.Fprintf(e.stdout, "%-12s %9s %8s %8s  %-28s %s\n", "policy", "items/s", "wall", "speedup", consumer+" busy", cmp.Edge+" mean depth")
	for _, r := range cmp.Rows {
		util := make([]string, len(r.Utilization))
		for i, u := range r.Utilization {
			util[i] = fmt.Sprintf("%.0f%%", 100*u)
		}
		depth := make([]string, len(r.MeanDepth))
		for i, d := range r.MeanDepth {
			depth[i] = fmt.Sprintf("%.1f", d)
		}
		fmt.Fprintf(e.stdout, "%-12s %9.1f %7.2fs %7.2fx  %-28s %s\n", r.Policy, r.Throughput, r.WallSeconds, r.Speedup,
			"["+strings.Join(util, " ")+"]", "["+strings.Join(depth, " ")+"]")
	}
}
