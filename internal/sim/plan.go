package sim

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
	"github.com/hashicorp/hcl/v2"
)

// This file answers "which policy, which split" from the graph in memory:
// each variant is g.With(a change), never a re-read of the spec.

// Predictor puts a figure on the diagnosis's suggestion (monitor.Diagnose):
// for an edge, it simulates g as it is and g with that edge shared, both
// with opts' models (opts.From, a real run's report, replays its service
// times), and predicts their wall times. The estimate's spread comes from
// predictFits alternative fits simulated the same way, each with its own
// draws of service times and, replaying a report, each replica's measured
// figures redrawn within their precision (redraw): the prediction's Low and
// High are the lowest and highest speedup of the fits, the point's
// included. A spec whose sources emit more than predictItems is simulated
// with their totals scaled down alike, and the wall times scaled back up:
// a drained run of a million items is diagnosed in milliseconds, not
// seconds. opts' Interval and Observe are ignored. g as it is is simulated
// once a fit, on the first call; the returned function is safe for
// concurrent use.
func Predictor(g *graph.Graph, opts Options) monitor.Predictor {
	return predictor(g, opts, predictItems, predictFits)
}

// predictItems is the most items a source emits in Predictor's
// simulations: enough for the steady state to be most of the run.
const predictItems = 20_000

// predictFits is how many alternative fits give the prediction's spread.
// Their sources emit at most altItems (the totals scaled down alike, as
// for predictItems), and they are simulated side by side; their speedups
// are taken relative to the fit of opts as given at the same scale, so
// that scaling down does not move the range. A diagnosis takes about
// twice the CPU of the point fit alone (the seed at a million items, from
// a report), and on two cores or more about the time.
const (
	predictFits = 8
	altItems    = predictItems / 8
)

func predictor(g *graph.Graph, opts Options, maxItems int64, alternatives int) monitor.Predictor {
	opts.Interval, opts.Observe, opts.maxItems = 0, nil, maxItems
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	// fits[0] is the point fit; fits[1] the same at the alternatives'
	// scale, where that differs; then the alternatives.
	fits := []Options{opts}
	if alternatives > 0 {
		alt := opts
		if maxItems <= 0 || maxItems > altItems {
			alt.maxItems = altItems
			fits = append(fits, alt)
		}
		for k := 1; k <= alternatives; k++ {
			alt.Seed, alt.refit = opts.Seed+uint64(k), k
			fits = append(fits, alt)
		}
	}
	base := len(fits) - alternatives - 1 // the point fit at the alternatives' scale
	wall := func(g *graph.Graph, opts Options) float64 {
		s, err := build(g, opts)
		if err != nil {
			return 0
		}
		if s.run(); s.err != nil {
			return 0
		}
		return s.report().WallSeconds * s.scale
	}
	// walls simulates g under every fit, side by side.
	walls := func(g *graph.Graph) []float64 {
		w := make([]float64, len(fits))
		var wg sync.WaitGroup
		sem := make(chan struct{}, runtime.GOMAXPROCS(0))
		for k := range fits {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				w[k] = wall(g, fits[k])
			}()
		}
		wg.Wait()
		return w
	}
	var once sync.Once
	var before []float64
	return func(edge string) (monitor.Prediction, bool) {
		once.Do(func() { before = walls(g) })
		if before[0] == 0 {
			return monitor.Prediction{}, false
		}
		shared, diags := g.With(graph.SetPolicy(edge, graph.Shared))
		if diags.HasErrors() {
			return monitor.Prediction{}, false
		}
		after := walls(shared)
		if after[0] == 0 {
			return monitor.Prediction{}, false
		}
		p := monitor.Prediction{Before: before[0], After: after[0]}
		x := p.Before / p.After
		p.Low, p.High = x, x
		if before[base] > 0 && after[base] > 0 {
			x0 := before[base] / after[base]
			for k := base + 1; k < len(fits); k++ {
				if before[k] > 0 && after[k] > 0 {
					r := x * before[k] / after[k] / x0
					p.Low, p.High = min(p.Low, r), max(p.High, r)
				}
			}
		}
		return p, true
	}
}

// Split is one split of replicas between two stages, simulated.
type Split struct {
	A, B        int     // the replicas of the first and second stage
	Throughput  float64 // items the sources emitted per second (Throughput)
	WallSeconds float64
	Bottleneck  string  // the stage whose replicas were busiest (Busiest)
	Busy        float64 // their mean utilization, 0 to 1
	Err         error   // the simulation failed (a wiring that deadlocks)
}

// Splits simulates every split of n replicas between stages a and b (1
// and n-1, 2 and n-2, ...) with everything else as in g, and returns them
// ranked by throughput, highest first; splits whose simulation failed come
// last, in order. An unknown stage, a == b or n < 2 is an error.
func Splits(g *graph.Graph, a, b string, n int, opts Options) ([]Split, error) {
	if a == b {
		return nil, fmt.Errorf("splits need two different stages; got %q twice", a)
	}
	if n < 2 {
		return nil, fmt.Errorf("splits of %d replicas: need at least 2, one per stage", n)
	}
	opts.Interval, opts.Observe = 0, nil
	var splits []Split
	for i := 1; i < n; i++ {
		v, diags := g.With(graph.SetReplicas(a, i), graph.SetReplicas(b, n-i))
		if diags.HasErrors() {
			return nil, diagError(diags)
		}
		rep, err := Run(v, opts)
		s := Split{A: i, B: n - i, WallSeconds: rep.WallSeconds, Err: err}
		if err == nil {
			s.Throughput = Throughput(v, rep)
			s.Bottleneck, s.Busy = Busiest(v, rep)
		}
		splits = append(splits, s)
	}
	sort.SliceStable(splits, func(i, j int) bool {
		if (splits[i].Err == nil) != (splits[j].Err == nil) {
			return splits[i].Err == nil
		}
		return splits[i].Throughput > splits[j].Throughput
	})
	return splits, nil
}

// Variant is one policy's outcome when an edge's policies are compared.
type Variant struct {
	Policy      graph.Policy
	Graph       *graph.Graph // g with the edge's policy set
	Report      *report.Report
	Throughput  float64   // items the sources emitted per second (Throughput)
	WallSeconds float64   // the run's
	Speedup     float64   // the first variant's wall time over this one's
	Utilization []float64 // per replica of the edge's consumer stage
	MeanDepth   []float64 // per queue of the edge
}

// A Runner runs or simulates a graph and returns its report, such as
// Simulator(opts) or a real run.
type Runner func(*graph.Graph) (*report.Report, error)

// Simulator is the Runner that simulates with opts.
func Simulator(opts Options) Runner {
	return func(g *graph.Graph) (*report.Report, error) { return Run(g, opts) }
}

// Compare runs g once per policy of edge, each as g.With(the policy), and
// returns the outcomes in the order of policies, with speedups against the
// first. An unknown edge or policy is an error, and so is a failed run,
// naming its policy.
func Compare(g *graph.Graph, edge string, policies []graph.Policy, run Runner) ([]Variant, error) {
	var out []Variant
	for _, pol := range policies {
		v, diags := g.With(graph.SetPolicy(edge, pol))
		if diags.HasErrors() {
			return nil, diagError(diags)
		}
		rep, err := run(v)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", pol, err)
		}
		r := Variant{Policy: pol, Graph: v, Report: rep, Throughput: Throughput(v, rep), WallSeconds: rep.WallSeconds}
		for _, rp := range rep.Stages[v.Edge(edge).To.Stage.Name].Replicas {
			r.Utilization = append(r.Utilization, rp.Utilization)
		}
		for _, q := range rep.Edges[edge].Queues {
			r.MeanDepth = append(r.MeanDepth, q.MeanDepth)
		}
		out = append(out, r)
	}
	for i := range out {
		if w := out[i].WallSeconds; w > 0 {
			out[i].Speedup = out[0].WallSeconds / w
		}
	}
	return out, nil
}

// Throughput is the items g's sources (stages with no input) emitted per
// second of the run rep reports; 0 for a run of no time.
func Throughput(g *graph.Graph, rep *report.Report) float64 {
	if rep.WallSeconds <= 0 {
		return 0
	}
	var items int64
	for _, s := range g.Stages {
		if len(s.Inputs) == 0 {
			for _, r := range rep.Stages[s.Name].Replicas {
				items += r.ItemsOut
			}
		}
	}
	return float64(items) / rep.WallSeconds
}

// Busiest names the stage whose replicas were busy the most on average in
// rep, with that mean utilization (0 to 1); the first in g's order on a
// tie.
func Busiest(g *graph.Graph, rep *report.Report) (stage string, busy float64) {
	best, bestU := "", -1.0
	for _, s := range g.Stages {
		if u := rep.Stages[s.Name].Utilization(); u > bestU {
			best, bestU = s.Name, u
		}
	}
	return best, bestU
}

// diagError is With's error diagnostics as an error, their details joined.
func diagError(diags hcl.Diagnostics) error {
	var msgs []string
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			msgs = append(msgs, strings.TrimSuffix(d.Detail, "."))
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}
