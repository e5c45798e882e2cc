package run

import (
	"context"
	"fmt"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Options tune a run. The zero value runs in this process with
// nodes.Default, no series and no drain.
type Options struct {
	// Registry builds the nodes; nodes.Default when nil.
	Registry *nodes.Registry
	// Drain, when closed, starts a drain: sources are stopped, items in
	// flight are consumed, nodes see Replica.Draining closed, and the run
	// ends "interrupted". Cancelling Run's ctx instead aborts at once
	// ("aborted"), as does a drain that cannot complete.
	Drain <-chan struct{}
	// Grace is how long replicas get to return after the run is cancelled
	// before Run gives up on them (default 5s).
	Grace time.Duration
	// Interval is the monitoring period: every Interval a point is added
	// to the report's series and Observe, if set, is called with a fresh
	// snapshot. Zero means no series and no calls.
	Interval time.Duration
	Observe  func(*report.Snapshot)
	// Cluster, when set, runs the pipeline across hosts, on a cluster's
	// workers (see Cluster); nil runs it in this process.
	Cluster *Cluster
	// Rebalance moves replicas between the stages of g's rebalance block
	// while the run goes, as its policy decides (sim.Rebalancer), where
	// they can move (Rebalancing); Moved, if set, is called with each
	// decision once its moves are made. The report lists them (Moves).
	Rebalance bool
	Moved     func(at time.Duration, d Decision)
}

// Decision is one of the rebalance policy's decisions to move, as a run
// made it (Options.Moved).
type Decision struct {
	// Moves are the moves made, one per pair of stages, largest first.
	Moves []report.Move
	// Rate and NewRate are the predicted items per second (at the
	// sources) before the moves and after them.
	Rate, NewRate float64
	// TimeLeft is the predicted time left before the moves, and Saved the
	// time they save over it, their cost taken off.
	TimeLeft, Saved time.Duration
	// Why says in words why it moved.
	Why string
}

// decision is d as Options.Moved takes it.
func decision(d sim.Decision) Decision {
	return Decision{Moves: d.Transfers, Rate: d.Rate, NewRate: d.NewRate, TimeLeft: d.TimeLeft, Saved: d.Saved, Why: d.Why}
}

// Rebalancing says why a run of g with opts would keep its split though
// it asks to rebalance, or returns nil when its replicas can move: in one
// process, between stages whose kinds keep no state, or group kinds whose
// state moves (a member leaves at a step boundary, one joins by taking
// the group's state over), but not those that restart whole
// (engine.Movable).
func Rebalancing(g *graph.Graph, opts Options) error {
	if g.Rebalance == nil {
		return fmt.Errorf("the spec has no rebalance block")
	}
	if opts.Cluster != nil {
		return engine.MovableAcross(g, opts.Registry)
	}
	return engine.Movable(g, opts.Registry)
}

// Pipeline is a graph made ready to run, in this process or on a
// cluster.
type Pipeline struct {
	g     *graph.Graph
	reg   *nodes.Registry
	local *engine.Pipeline     // in this process
	coord *cluster.Coordinator // on a cluster
	stop  func()               // what a cluster run started
	err   error                // the construction's, returned by Run
	// moves returns a rebalance's moves once the run is over, their
	// gains measured (Options.Rebalance); nil without one
	moves func(end *report.Snapshot) []report.Move
}

// New builds the nodes and queues of g (NewContext with a background
// context). On error the Pipeline is still usable: its Run returns at
// once with the failed report (every stage and edge, nothing run) and the
// same error, so a caller writes one report either way.
func New(g *graph.Graph, opts Options) (*Pipeline, error) {
	return NewContext(context.Background(), g, opts)
}

// NewContext is New; on a cluster (opts.Cluster) it also starts what the
// cluster needs (the embedded server, the local workers), waits for the
// workers and places the replicas; ctx ends that wait (the workers build
// the nodes when the run starts). Close stops what it started.
func NewContext(ctx context.Context, g *graph.Graph, opts Options) (*Pipeline, error) {
	if opts.Registry == nil {
		opts.Registry = nodes.Default
	}
	p := &Pipeline{g: g, reg: opts.Registry, stop: func() {}}
	if opts.Cluster != nil {
		var policyFor engine.RebalanceFor
		if opts.Rebalance && Rebalancing(g, opts) == nil {
			policyFor, p.moves = policy(g, opts)
		}
		p.coord, p.stop, p.err = coordinate(ctx, opts.Cluster, g, opts, policyFor)
		if p.err != nil {
			p.stop, p.coord = func() {}, nil // coordinate stopped what it started
		}
		return p, p.err
	}
	eopts := engine.Options{Registry: opts.Registry, Drain: opts.Drain, Grace: opts.Grace,
		Interval: opts.Interval, Observe: opts.Observe}
	if opts.Rebalance && Rebalancing(g, opts) == nil {
		eopts.Rebalance, p.moves = policy(g, opts)
	}
	p.local, p.err = engine.New(g, eopts)
	return p, p.err
}

// policy is the rebalance policy of a run in this process: the
// simulator's Rebalancer, asked at every sampling tick, and the moves it
// made. A look's simulations run beside the engine's sampler, not in it:
// the tick after they end makes the moves.
func policy(g *graph.Graph, opts Options) (engine.RebalanceFor, func(*report.Snapshot) []report.Move) {
	rb := sim.NewRebalancer(g, sim.Options{Registry: opts.Registry})
	made := 0
	type looked struct {
		d    sim.Decision
		snap *report.Snapshot
	}
	var pending chan looked // a look in progress
	ask := func(snap *report.Snapshot) ([]report.Move, func(bool)) {
		if pending == nil {
			if !rb.Due(snap) {
				return nil, nil
			}
			pending = make(chan looked, 1)
			go func(c chan<- looked) { c <- looked{rb.Look(snap), snap} }(pending)
			return nil, nil
		}
		var l looked
		select {
		case l = <-pending:
			pending = nil
		default:
			return nil, nil
		}
		d, snap := l.d, l.snap
		if !d.Move {
			return nil, nil
		}
		asked := make([]int, len(d.Transfers))
		for i, t := range d.Transfers {
			asked[i] = t.Replicas
		}
		return d.Transfers, func(ok bool) {
			if ok {
				// A cluster's coordinator may make fewer than asked (a
				// worker keeps one replica of each stage it runs): the
				// split is what was made.
				var kept []report.Move
				for i, t := range d.Transfers {
					if short := asked[i] - t.Replicas; short > 0 {
						if t.From != "" {
							d.Split[t.From] += short
						}
						d.Split[t.To] -= short
					}
					if t.Replicas > 0 {
						kept = append(kept, t)
					}
				}
				d.Transfers = kept
				// Made now: a look ends between two ticks, and on a
				// cluster a tick may be a second apart.
				at := snap.Elapsed + time.Since(snap.Time)
				for i := range d.Transfers {
					d.Transfers[i].T = at.Seconds()
				}
				rb.Moved(d)
				made++
				if opts.Moved != nil {
					opts.Moved(at, decision(d))
				}
			}
		}
	}
	moves := func(end *report.Snapshot) []report.Move {
		// The engine has stopped asking: a look still in progress ends
		// unheeded.
		if pending != nil {
			<-pending
		}
		if made == 0 {
			return nil
		}
		return rb.Finish(end)
	}
	return ask, moves
}

// MovesDiagnosis is the diagnosis of a run whose replicas moved (a
// rebalance): its moves, in words. The usual reading of a run's
// bottleneck is of the split the spec gives.
func MovesDiagnosis(rep *report.Report) []string {
	var out []string
	for _, m := range rep.Moves {
		from := m.From
		if from == "" {
			from = "(spare)"
		}
		n := fmt.Sprintf("%d replicas", m.Replicas)
		if m.Replicas == 1 {
			n = "1 replica"
		}
		measured := ""
		if m.MeasuredGain != nil {
			measured = fmt.Sprintf(", measured %+.0f%%", 100**m.MeasuredGain)
		}
		out = append(out, fmt.Sprintf("at %.1fs the rebalance moved %s %s -> %s (%s), predicted %+.0f%% of the time left%s",
			m.T, n, from, m.To, m.Reason, 100*m.PredictedGain, measured))
	}
	return out
}

// Run executes the pipeline once (see the package comment). The report
// carries the diagnosis (report.Report.Diagnosis: what limited the run,
// in plain words) of a pipeline that was built, whether it ran in this
// process or on a cluster.
func (p *Pipeline) Run(ctx context.Context) (*report.Report, error) {
	if p.err != nil {
		if p.local != nil {
			return p.local.Failed(p.err), p.err
		}
		return engine.FailedReport(p.g, p.err), p.err
	}
	var rep *report.Report
	var err error
	if p.coord != nil {
		rep, err = p.coord.Run(ctx)
	} else {
		rep, err = p.local.Execute(ctx)
	}
	if p.moves != nil {
		if rep.Moves = p.moves(p.Snapshot()); len(rep.Moves) > 0 {
			rep.Diagnosis = MovesDiagnosis(rep)
			return rep, err
		}
	}
	rep.Diagnosis = Diagnose(p.g, rep, p.reg)
	return rep, err
}

// Diagnose is the diagnosis of a finished run of g (Run puts it in the
// report): its bottleneck, replicas starved or blocked beside their
// siblings, queues always full or empty, a round_robin wiring that a
// "shared" edge would balance with what the simulator, replaying the
// run's own service times (reg's kinds), predicts it gains; for a failed
// run only a deadlock's account. Each sentence cites the figures it rests
// on.
func Diagnose(g *graph.Graph, rep *report.Report, reg *nodes.Registry) []string {
	if reg == nil {
		reg = nodes.Default
	}
	return monitor.Diagnose(g, rep, sim.Predictor(g, sim.Options{Registry: reg, From: rep}))
}

// Snapshot reads the live figures of the run: cumulative since the start;
// diff two for rates. On a cluster it merges the workers' latest.
func (p *Pipeline) Snapshot() *report.Snapshot {
	switch {
	case p.coord != nil:
		return p.coord.Snapshot()
	case p.local != nil:
		return p.local.Snapshot()
	}
	return &report.Snapshot{Time: time.Now()}
}

// Where names, on a cluster, the worker each replica is placed on
// (Where()[stage][replica]); nil in this process.
func (p *Pipeline) Where() map[string][]string {
	if p.coord == nil {
		return nil
	}
	return p.coord.Where()
}

// Close stops what a cluster run started (the local workers, the
// embedded server, the connection); call it once done with the pipeline,
// after Run and any last Snapshot. In this process it does nothing.
func (p *Pipeline) Close() {
	p.stop()
	p.stop = func() {}
}

// Run builds and executes g: New (NewContext on a cluster), then
// Pipeline.Run, then Close.
func Run(ctx context.Context, g *graph.Graph, opts Options) (*report.Report, error) {
	p, _ := NewContext(ctx, g, opts)
	defer p.Close()
	return p.Run(ctx)
}

// Deadlock is the error of a run in which no replica could move: each
// waited on a full queue, an empty queue or its group's step, for
// replicas that waited too; Cycle lists the waits, Fix says what breaks
// the cycle. It is report.Deadlock, the runtime's own error type, in one
// process and on a cluster alike.
type Deadlock = report.Deadlock
