package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/report"
)

func cmdRun(e *env, args []string) int {
	e = e.withLockedStderr() // the signal watcher prints too
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	reportPath := fs.String("report", "", "write the run report (JSON) to this file")
	grace := fs.Duration("grace", 5*time.Second, "how long replicas get to stop after a failure or abort")
	files, code, ok := parse(e, fs, args, "SPEC [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageErr(e, "run", "want exactly one spec, got %d", len(files))
	}
	g := e.load(&sf, files[0])
	if g == nil {
		return exitFailed
	}

	ctx, abort := context.WithCancel(context.Background())
	defer abort()
	drain := make(chan struct{})
	stopSignals := e.watchSignals(drain, abort)
	defer stopSignals()

	replicas := 0
	for _, s := range g.Stages {
		replicas += s.Replicas
	}
	fmt.Fprintf(e.stderr, "dflow: running %s: %d stages, %d replicas, %d edges\n", files[0], len(g.Stages), replicas, len(g.Edges))
	rep, err := engine.Run(ctx, g, engine.Options{Registry: e.registry, Drain: drain, Grace: *grace})
	summarize(e.stderr, g, rep)
	if *reportPath != "" {
		if werr := rep.Write(*reportPath); werr != nil {
			fmt.Fprintf(e.stderr, "dflow run: %v\n", werr)
			return exitFailed
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(e.stderr, "dflow run: %s: %v\n", files[0], err)
		return exitFailed
	case rep.Status == report.Interrupted:
		return exitInterrupted
	}
	return exitOK
}

// watchSignals turns the first interrupt into a drain and the second into
// an abort.
func (e *env) watchSignals(drain chan struct{}, abort context.CancelFunc) (stop func()) {
	if e.signals == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-e.signals:
			fmt.Fprintln(e.stderr, "dflow: draining: sources stopped, finishing items in flight (Ctrl-C again to abort)")
			close(drain)
		case <-done:
			return
		}
		select {
		case <-e.signals:
			fmt.Fprintln(e.stderr, "dflow: aborting")
			abort()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// summarize prints the end-of-run figures, stages and edges in spec order.
func summarize(w io.Writer, g *graph.Graph, rep *report.Report) {
	fmt.Fprintf(w, "run %s in %.2fs\n", rep.Status, rep.WallSeconds)
	for _, s := range g.Stages {
		st := rep.Stages[s.Name]
		var in, out int64
		util := make([]string, len(st.Replicas))
		for i, r := range st.Replicas {
			in += r.ItemsIn
			out += r.ItemsOut
			util[i] = fmt.Sprintf("%.0f%%", 100*r.Utilization)
		}
		fmt.Fprintf(w, "  stage %-10s in=%-6d out=%-6d busy=%v\n", s.Name, in, out, util)
	}
	for _, e := range g.Edges {
		ed := rep.Edges[e.Name]
		depth := make([]string, len(ed.Queues))
		for i, q := range ed.Queues {
			depth[i] = fmt.Sprintf("%.1f", q.MeanDepth)
		}
		fmt.Fprintf(w, "  edge  %-10s %-11s produced=%d consumed=%d mean depth=%v\n",
			e.Name, ed.Policy, ed.Produced, ed.Consumed, depth)
	}
}

// lockedWriter serializes writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (e *env) withLockedStderr() *env {
	c := *e
	c.stderr = &lockedWriter{w: e.stderr}
	return &c
}
