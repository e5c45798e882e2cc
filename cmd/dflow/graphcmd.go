package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/report"
)

func cmdGraph(e *env, args []string) int {
	fs := flag.NewFlagSet("graph", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	format := fs.String("format", "text", "print the graph as `FORMAT`: "+strings.Join(graph.Formats, ", ")+" (dot for Graphviz, mermaid for Markdown)")
	workers := fs.Int("workers", 0, "also say where a run on `N` workers puts each replica, as --local-cluster N does, and how it carries each edge: a chain's (in process), on a stream within a worker, or across hosts (text format)")
	var pins map[string][]string
	fs.Func("place", "with --workers, a run's `STAGE=W1,W2,...` pin (workers local1 to localN; repeatable)", func(v string) error {
		stage, ws, ok := strings.Cut(v, "=")
		if !ok || stage == "" || ws == "" {
			return errors.New("want STAGE=WORKER[,WORKER...], such as target=local2")
		}
		if pins == nil {
			pins = map[string][]string{}
		}
		pins[stage] = strings.Split(ws, ",")
		return nil
	})
	files, code, ok := parse(e, fs, args, "SPEC [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageErr(e, "graph", "want exactly one spec, got %d", len(files))
	}
	if !slices.Contains(graph.Formats, *format) {
		return usageErr(e, "graph", "unknown format %q; use %s", *format, strings.Join(graph.Formats, ", "))
	}
	switch {
	case *workers < 0:
		return usageErr(e, "graph", "--workers %d: want a number of workers, at least 1", *workers)
	case *workers > 0 && *format != "text":
		return usageErr(e, "graph", "--workers shows the placement in the text format, not %s", *format)
	case len(pins) > 0 && *workers == 0:
		return usageErr(e, "graph", "--place pins a stage on the workers of --workers N: give --workers")
	}
	g, code := e.loadSpec(&sf, files[0])
	if g == nil {
		return code
	}
	if err := graph.Render(e.stdout, g, *format); err != nil {
		return exitFailed
	}
	if *workers > 0 {
		if err := e.placement(g, *workers, pins); err != nil {
			fmt.Fprintf(e.stderr, "dflow graph: %v\n", err)
			return exitUsage
		}
	}
	return exitOK
}

// placement writes where a run on n workers (local1 to localN, as
// --local-cluster names them) puts each replica, and how it carries each
// edge.
func (e *env) placement(g *graph.Graph, n int, pins map[string][]string) error {
	var ws []string
	for i := range n {
		ws = append(ws, fmt.Sprintf("local%d", i+1))
	}
	place, carried, err := cluster.Plan(g, e.registry, ws, pins)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\non %d workers (%s), as `dflow run --local-cluster %d` places it:\n", n, strings.Join(ws, ", "), n)
	for _, s := range g.Stages {
		fmt.Fprintf(e.stdout, "  %-12s %s\n", s.Name, strings.Join(place[s.Name], ", "))
	}
	for _, ed := range g.Edges {
		fmt.Fprintf(e.stdout, "  edge %-7s %s\n", ed.Name, carriedWords[carried[ed.Name]])
	}
	return nil
}

// carriedWords say what each way of carrying an edge means.
var carriedWords = map[string]string{
	report.CarriedCrosses: "crosses hosts: on JetStream, between workers",
	report.CarriedStream:  "on JetStream within one worker: the stage it feeds restarts elsewhere after a loss, and its unfinished items must outlive the worker",
	report.CarriedChain:   "a chain's: in process, its items settled through the input at the chain's head; a lost worker restarts the chain whole",
	report.CarriedProcess: "in process, on one worker",
}
