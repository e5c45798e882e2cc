package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/ui"
	"github.com/dflow-dev/dflow/report"
)

// startUI serves the live page of a run at addr (dflow run --ui); the
// returned finish hands it the report, keeps it up for linger or until
// Ctrl-C, and closes it. stopSignals ends run's own signal handling, so
// that the Ctrl-C here only closes the page.
//
// where, for a run across hosts, names each replica's worker (nil in one
// process).
func (e *env) startUI(addr string, g *graph.Graph, title string, where map[string][]string, snap func() *report.Snapshot, linger time.Duration, stopSignals func()) (finish func(*report.Report), err error) {
	r := ui.LiveOn(g, title, where, snap, 500*time.Millisecond)
	url, shutdown, err := ui.Serve(addr, r)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(e.stderr, "dflow: ui at %s\n", url)
	return func(rep *report.Report) {
		r.Finish(rep)
		stopSignals()
		if linger > 0 {
			fmt.Fprintf(e.stderr, "dflow: ui stays up for %s at %s (Ctrl-C to close it)\n", linger, url)
			t := time.NewTimer(linger)
			select {
			case <-t.C:
			case <-e.signals: // nil in tests: the timer decides
			}
			t.Stop()
		}
		shutdown()
	}, nil
}

func cmdUI(e *env, args []string) int {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	addr := fs.String("addr", ":0", "serve the page at http://`HOST:PORT`/ (:8080 binds to loopback only; :0 picks a free port)")
	files, code, ok := parse(e, fs, args, "REPORT.json [REPORT2.json] [--addr HOST:PORT]")
	if !ok {
		return code
	}
	if len(files) < 1 || len(files) > 2 {
		return usageErr(e, "ui", "want one report, or two to compare, got %d", len(files))
	}
	var runs []*ui.Run
	for _, f := range files {
		rep, err := report.Read(f)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow ui: %v\n", err)
			return exitFailed
		}
		runs = append(runs, ui.Saved(rep, e.reportGraph(rep), reportTitle(f, rep)))
	}
	url, shutdown, err := ui.Serve(*addr, runs...)
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow ui: %v\n", err)
		return exitFailed
	}
	defer shutdown()
	fmt.Fprintf(e.stderr, "dflow: ui at %s (Ctrl-C to stop)\n", url)
	if e.signals != nil {
		<-e.signals
	}
	return exitOK
}

// reportGraph loads the spec a report names, with the overrides it
// records, for the page's edges; nil when it cannot be read any more (the
// page then draws the stages and edges the report lists).
func (e *env) reportGraph(rep *report.Report) *graph.Graph {
	if rep.Spec == "" {
		return nil
	}
	if _, err := os.Stat(rep.Spec); err != nil {
		return nil
	}
	l := &graph.Loader{Catalog: e.registry, Vars: rep.Overrides.Vars, VarFiles: rep.Overrides.VarFiles, Sets: rep.Overrides.Sets, Plugins: e.loadPlugins}
	g, diags := l.LoadFile(rep.Spec)
	if diags.HasErrors() || g == nil {
		return nil
	}
	return g
}

func reportTitle(file string, rep *report.Report) string {
	t := file
	if rep.Spec != "" {
		t += " (" + rep.Spec
		for _, s := range rep.Overrides.Sets {
			t += " --set " + s
		}
		t += ")"
	}
	if rep.Simulated {
		t += ", simulated"
	}
	return t
}
