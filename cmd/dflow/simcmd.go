package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

func cmdSim(e *env, args []string) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	reportPath := fs.String("report", "", "write the simulated run's report to `FILE`, JSON in the shape of run's (\"simulated\": true)")
	from := fs.String("from", "", "take each replica's service times from `REPORT`, the report of a real run, instead of the sim blocks, and the overrides it ran with (--var, --var-file, --set; those given here win)")
	interval := fs.Duration("interval", 5*time.Second, "print a status line and add a series point every `DURATION` of simulated time (at least 1ms; 0 turns both off)")
	plotPath := fs.String("plot", "", "draw queue depth, busy and idle share over simulated time into `FILE`, a .png or .jpg (needs an --interval)")
	seed := fs.Uint64("seed", 1, "the `SEED` of the random draws that do not come from a node's own seed")
	split := fs.String("split", "", "simulate every split of N replicas between stages A and B, written `A,B=N` (target,drafter=8), and rank them by throughput")
	rebalance := fs.Bool("rebalance", false, "simulate the rebalance policy for a spec without a rebalance block, between the stages that carry the work, as a run with --rebalance would (a spec's block is simulated without it; --rebalance=false keeps the spec's split)")
	files, code, ok := parse(e, fs, args, "SPEC [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageErr(e, "sim", "want exactly one spec, got %d", len(files))
	}
	if err := checkInterval(*interval); err != nil {
		return usageErr(e, "sim", "%v", err)
	}
	if *plotPath != "" && *interval == 0 {
		return usageErr(e, "sim", "--plot draws the time series, and --interval 0 turns it off; give an interval shorter than the run")
	}
	if code, ok := checkOutputs(e, "sim", files[0], output{"report", *reportPath, false}, output{"plot", *plotPath, true}); !ok {
		return code
	}
	opts := sim.Options{Registry: e.registry, Seed: *seed}
	if *from != "" {
		rep, err := report.Read(*from)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow sim: %v\n", err)
			return exitFailed
		}
		opts.From = rep
		sf.under(e, "sim", rep, *from, files[0])
	}
	if *split != "" && *rebalance {
		return usageErr(e, "sim", "--split ranks the splits a run keeps, --rebalance simulates one that moves replicas; give one of them")
	}
	if *split != "" {
		return e.split(&sf, files[0], *split, opts)
	}
	g, code := e.loadSpec(&sf, files[0])
	if g == nil {
		return code
	}
	on, off := rebalanceFlag(fs, *rebalance)
	if on || off || g.Rebalance != nil {
		if g, code = e.rebalanced("sim", g, on, off, opts); g == nil {
			return code
		}
		opts.Rebalance = g.Rebalance != nil
		opts.Moved = func(at time.Duration, d sim.Decision) {
			for _, m := range d.Transfers {
				fmt.Fprintf(e.stderr, "dflow: at %.1fs %s\n", at.Seconds(), moveWords(m, d.Why))
			}
		}
	}
	status := &monitor.Status{W: e.stderr, Width: 250}
	if *interval > 0 {
		opts.Interval, opts.Observe = *interval, status.Observe
	}
	started := time.Now()
	rep, err := sim.Run(g, opts)
	rep.Version, rep.Overrides = dflowVersion(), sf.overrides()
	if rep.Started.IsZero() {
		rep.Started = started.Round(0)
	}
	switch {
	case err == nil && len(rep.Moves) > 0:
		// The diagnosis reads a run of the spec's split; this one moved.
		rep.Diagnosis = run.MovesDiagnosis(rep)
	case err == nil:
		popts := opts
		popts.Rebalance, popts.Moved = false, nil
		rep.Diagnosis = monitor.Diagnose(g, rep, sim.Predictor(g, popts))
	}
	rep.Summarize(e.stdout) // the result on stdout, as run's
	if werr := e.writeOutputs(rep, *reportPath, *plotPath); werr != nil {
		fmt.Fprintf(e.stderr, "dflow sim: %v\n", werr)
		return exitFailed
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow sim: %s: %v\n", files[0], err)
		return exitFailed
	}
	return exitOK
}

// split ranks every split of N replicas between stages A and B
// ("target,drafter=8") by simulated throughput (sim.Splits, on the graph
// loaded once) and prints them.
func (e *env) split(sf *specFlags, file, spec string, opts sim.Options) int {
	a, b, n, err := parseSplit(spec)
	if err != nil {
		return usageErr(e, "sim", "--split %q: %v", spec, err)
	}
	g, code := e.loadSpec(sf, file)
	if g == nil {
		return code
	}
	splits, err := sim.Splits(g, a, b, n, opts)
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow sim: --split %s: %v\n", spec, err)
		return exitFailed
	}
	fmt.Fprintf(e.stdout, "splits of %d replicas between %s and %s (simulated)\n", n, a, b)
	fmt.Fprintf(e.stdout, "%-5s %8s %8s %10s %9s  %s\n", "rank", a, b, "items/s", "wall", "bottleneck")
	for i, r := range splits {
		if r.Err != nil {
			fmt.Fprintf(e.stdout, "%-5s %8d %8d  failed: %v\n", "-", r.A, r.B, r.Err)
			continue
		}
		fmt.Fprintf(e.stdout, "%-5d %8d %8d %10.1f %8.2fs  %s (%.0f%% busy)\n", i+1, r.A, r.B, r.Throughput, r.WallSeconds, r.Bottleneck, 100*r.Busy)
	}
	return exitOK
}

func parseSplit(spec string) (a, b string, n int, err error) {
	stages, count, ok := strings.Cut(spec, "=")
	a, b, ok2 := strings.Cut(stages, ",")
	if !ok || !ok2 || a == "" || b == "" || a == b {
		return "", "", 0, fmt.Errorf("want A,B=N with two stage names, such as target,drafter=8")
	}
	n, err = strconv.Atoi(count)
	if err != nil || n < 2 {
		return "", "", 0, fmt.Errorf("N must be a whole number of at least 2")
	}
	return a, b, n, nil
}
