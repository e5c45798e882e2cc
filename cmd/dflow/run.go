package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
	"golang.org/x/term"
)

func cmdRun(e *env, args []string) int {
	tty, width := terminal(e.stderr)
	e = e.withLockedStderr() // the signal watcher and the status line print too
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	reportPath := fs.String("report", "", "at the end, write the run report to `FILE`: JSON with every stage's, replica's and edge's figures, the time series, the diagnosis and the overrides")
	grace := fs.Duration("grace", 5*time.Second, "after a failure or an abort, the `DURATION` replicas get to return before dflow stops waiting for them")
	interval := fs.Duration("interval", 5*time.Second, "print a status line and add a point to the report's series every `DURATION` (such as 1s or 500ms; at least 1ms; 0 turns both off)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://`HOST:PORT`/metrics while the run lasts (:9090 binds to loopback only; 0.0.0.0:9090 exposes it)")
	uiAddr := fs.String("ui", "", "serve a live page of the run at http://`HOST:PORT`/: the graph, queues, replicas, node metrics, diagnosis (:8080 binds to loopback only)")
	uiLinger := fs.Duration("ui-linger", 5*time.Second, "with --ui, keep the page up this `DURATION` after the run ends (Ctrl-C closes it sooner)")
	plotPath := fs.String("plot", "", "at the end, draw queue depth, busy and idle share over time into `FILE`, a .png or .jpg (needs an --interval)")
	rebalance := fs.Bool("rebalance", false, "move replicas between the stages that carry the work while the run goes, as a rebalance block with its defaults does (for a spec without one); --rebalance=false keeps the split of a spec with one")
	var cf clusterFlags
	cf.register(fs)
	files, code, ok := parse(e, fs, args, "SPEC [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageErr(e, "run", "want exactly one spec, got %d", len(files))
	}
	if err := checkInterval(*interval); err != nil {
		return usageErr(e, "run", "%v", err)
	}
	cf.visited(fs)
	if err := cf.check(); err != nil {
		return usageErr(e, "run", "%v", err)
	}
	if *plotPath != "" && *interval == 0 {
		return usageErr(e, "run", "--plot draws the time series, and --interval 0 turns it off; give an interval shorter than the run")
	}
	if code, ok := checkOutputs(e, "run", files[0], output{"report", *reportPath, false}, output{"plot", *plotPath, true}); !ok {
		return code
	}
	g, code := e.loadSpec(&sf, files[0])
	if g == nil {
		return code
	}
	on, off := rebalanceFlag(fs, *rebalance)
	if g, code = e.rebalanced("run", g, on, off, sim.Options{Registry: e.registry}); g == nil {
		return code
	}

	ctx, abort := context.WithCancel(context.Background())
	defer abort()
	drain := make(chan struct{})
	// For a cluster's workers a Ctrl-C ends the wait. It is set before
	// "dflow: running" is printed, so that an interrupt after that line
	// (a script's, a test's) never finds a drain with nothing begun.
	var waiting atomic.Bool
	waiting.Store(cf.on())
	stopSignals := sync.OnceFunc(e.watchSignals(drain, abort, &waiting))
	defer stopSignals()

	replicas := 0
	for _, s := range g.Stages {
		replicas += s.Replicas
	}
	fmt.Fprintf(e.stderr, "dflow: running %s: %s, %s, %s\n", files[0], plural(len(g.Stages), "stage"), plural(replicas, "replica"), plural(len(g.Edges), "edge"))
	outputsWritten := e.announceOutputs(g) // where models and checkpoints go
	status := &monitor.Status{W: e.stderr, TTY: tty, Width: width}
	opts := run.Options{Registry: e.registry, Drain: drain, Grace: *grace, Interval: *interval}
	if *interval > 0 {
		opts.Observe = status.Observe
	}
	if cf.on() { // across hosts (workercmd.go)
		opts.Cluster = cf.cluster(e, &sf)
	}
	if g.Rebalance != nil {
		if why := run.Rebalancing(g, opts); why != nil {
			fmt.Fprintf(e.stderr, "dflow: rebalance: this run keeps its split: %v (dflow sim --rebalance simulates the moves)\n", why)
		} else {
			opts.Rebalance = true
			opts.Moved = func(at time.Duration, d run.Decision) {
				for _, m := range d.Moves {
					fmt.Fprintf(e.stderr, "dflow: at %.1fs %s\n", at.Seconds(), moveWords(m, d.Why))
				}
			}
		}
	}
	p, err := run.NewContext(ctx, g, opts)
	waiting.Store(false)
	defer p.Close()
	if cf.on() {
		if ctx.Err() != nil {
			return exitInterrupted // while waiting for workers; said by watchSignals
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow run: cluster: %v\n", err)
			return exitFailed
		}
	}
	built := err == nil // a pipeline whose stages failed to build runs nothing
	if err == nil && *metricsAddr != "" {
		url, shutdown, merr := monitor.Serve(*metricsAddr, monitor.NewCollector(p.Snapshot))
		if merr != nil {
			fmt.Fprintf(e.stderr, "dflow run: %v\n", merr)
			return exitFailed
		}
		defer shutdown()
		fmt.Fprintf(e.stderr, "dflow: metrics at %s\n", url)
	}
	finishUI := func(*report.Report) {}
	if err == nil && *uiAddr != "" {
		// across hosts, Where names each replica's worker
		f, uerr := e.startUI(*uiAddr, g, files[0], p.Where(), p.Snapshot, *uiLinger, stopSignals)
		if uerr != nil {
			fmt.Fprintf(e.stderr, "dflow run: %v\n", uerr)
			return exitFailed
		}
		finishUI = f
	}
	rep, err := p.Run(ctx) // a failed construction: its report and error at once; a run's with its diagnosis
	ran := built && began(rep)
	if ran && *interval > 0 && rep.Status != report.Aborted {
		// A last status line with the run's final figures: what a node
		// measured at its end, after the last interval (drafter_train's
		// final evaluation), is then the status line's last word as it is
		// the summary's. (An abort may have left replicas running.)
		status.Observe(p.Snapshot())
	}
	status.Finish()
	rep.Version, rep.Overrides = dflowVersion(), sf.overrides()
	if !ran {
		// Its stages failed to build (here, or on a worker): nothing ran,
		// so there is no summary, diagnosis or plot, only the error (and
		// the failed report, when asked for, so that a script reading it
		// does not find an earlier run's), after the outputs it left alone.
		outputsWritten()
		fmt.Fprintf(e.stderr, "dflow run: %s: %v\n", files[0], err)
		if werr := e.writeOutputs(rep, *reportPath, ""); werr != nil {
			fmt.Fprintf(e.stderr, "dflow run: %v\n", werr)
		}
		return exitFailed
	}
	// The summary and the diagnosis are the run's result, on stdout (what
	// `dflow run SPEC > summary.txt` keeps); the status lines, the files
	// written and the errors are on stderr.
	rep.Summarize(e.stdout)
	outputsWritten()
	finishUI(rep)
	if werr := e.writeOutputs(rep, *reportPath, *plotPath); werr != nil {
		fmt.Fprintf(e.stderr, "dflow run: %v\n", werr)
		return exitFailed
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow run: %s: %v\n", files[0], err)
	}
	switch {
	case rep.Status == report.Interrupted || rep.Status == report.Aborted:
		return exitInterrupted
	case err != nil:
		return exitFailed
	}
	return exitOK
}

// began reports whether any replica of a run began: a failed run whose
// replicas all have no lifetime and no items never started (its stages
// failed to build on a worker), and its figures are all zero.
func began(rep *report.Report) bool {
	if rep.Status != report.Failed {
		return true
	}
	for _, st := range rep.Stages {
		for _, r := range st.Replicas {
			if r.BusySeconds+r.IdleSeconds+r.BlockedSeconds > 0 || r.ItemsIn > 0 || r.ItemsOut > 0 {
				return true
			}
		}
	}
	return false
}

// watchSignals turns the first interrupt into a drain and the second into
// an abort. While a coordinator waits for its workers (waiting) nothing
// has started and there is nothing to drain: the first interrupt ends the
// wait at once.
func (e *env) watchSignals(drain chan struct{}, abort context.CancelFunc, waiting *atomic.Bool) (stop func()) {
	if e.signals == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-e.signals:
			if waiting.Load() {
				fmt.Fprintln(e.stderr, "dflow: interrupted while waiting for workers, before the run started; nothing ran")
				abort()
				return
			}
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

// writeOutputs writes the report and the plot when asked for.
func (e *env) writeOutputs(rep *report.Report, reportPath, plotPath string) error {
	if reportPath != "" {
		if err := rep.Write(reportPath); err != nil {
			return err
		}
	}
	if plotPath != "" {
		if err := monitor.Plot(rep, plotPath); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "dflow: plot written to %s\n", plotPath)
		if n := len(rep.Series); n < 3 {
			fmt.Fprintf(e.stderr, "dflow: the plot has %d point(s) per series: the run lasted %.1fs; a shorter --interval draws more\n", n, rep.WallSeconds)
		}
	}
	return nil
}

// terminal reports whether w is a terminal and how wide the status line
// may be: the terminal's width, or 250 columns for logs and pipes, where
// one line per interval greps best.
func terminal(w io.Writer) (tty bool, width int) {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 20 {
			return true, cols
		}
		return true, 80
	}
	return false, 250
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

// withLockedStderr returns a copy of e whose stderr is safe for several
// goroutines; the copy shares e's plugin host, which writes there too.
func (e *env) withLockedStderr() *env {
	h := e.host()
	c := *e
	c.stderr = &lockedWriter{w: e.stderr}
	h.SetStderr(c.stderr)
	return &c
}
