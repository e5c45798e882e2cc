package main

import (
	"flag"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
)

func cmdGraph(e *env, args []string) int {
	fs := flag.NewFlagSet("graph", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	format := fs.String("format", "text", "print the graph as `FORMAT`: "+strings.Join(graph.Formats, ", ")+" (dot for Graphviz, mermaid for Markdown)")
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
	g, code := e.loadSpec(&sf, files[0])
	if g == nil {
		return code
	}
	if err := graph.Render(e.stdout, g, *format); err != nil {
		return exitFailed
	}
	return exitOK
}
