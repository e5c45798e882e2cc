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

// comparison is what `dflow compare --json` prints.
type comparison struct {
	Spec      string          `json:"spec"`
	Edge      string          `json:"edge"`
	Simulated bool            `json:"simulated"`
	Rows      []comparisonRow `json:"rows"`
}

type comparisonRow struct {
	Policy      string    `json:"policy"`
	Status      string    `json:"status"`
	Throughput  float64   `json:"throughput"` // items the sources emitted per second
	WallSeconds float64   `json:"wall_seconds"`
	Speedup     float64   `json:"speedup"` // against the first policy's wall time
	Utilization []float64 `json:"utilization"`
	MeanDepth   []float64 `json:"mean_depth"`
}

func cmdCompare(e *env, args []string) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	edgeName := fs.String("edge", "", "the edge whose policy to vary, by its `NAME` in the spec (required)")
	policies := fs.String("policies", "round_robin,shared", "the `POLICIES` to compare, separated by commas, of "+strings.Join(graph.PolicyNames(), ", ")+"; the first is the baseline the speedups are against")
	simulate := fs.Bool("sim", false, "simulate each policy in virtual time instead of running it")
	from := fs.String("from", "", "with --sim: take service times from `REPORT`, the report of a real run, and the overrides it ran with (those given here win)")
	asJSON := fs.Bool("json", false, "print the table as JSON on stdout")
	plotPath := fs.String("plot", "", "draw the throughput per policy as labelled bars into `FILE`, a .png or .jpg")
	files, code, ok := parse(e, fs, args, "SPEC --edge NAME [--policies a,b] [--sim] [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 || *edgeName == "" {
		return usageErr(e, "compare", "want one spec and --edge NAME")
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
	if *plotPath != "" {
		bars := make([]monitor.Bar, len(cmp.Rows))
		for i, r := range cmp.Rows {
			bars[i] = monitor.Bar{Label: r.Policy, Value: r.Throughput, Note: fmt.Sprintf("%.2fs, %.2fx", r.WallSeconds, r.Speedup)}
		}
		title := fmt.Sprintf("%s: throughput per policy of edge %s (%s)", cmp.Spec, cmp.Edge, map[bool]string{true: "simulated", false: "measured"}[cmp.Simulated])
		xLabel := fmt.Sprintf("policy of edge %s (wall time, speedup against %s)", cmp.Edge, cmp.Rows[0].Policy)
		if err := monitor.BarChart(bars, title, xLabel, *plotPath); err != nil {
			fmt.Fprintf(e.stderr, "dflow compare: %v\n", err)
			return exitFailed
		}
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
