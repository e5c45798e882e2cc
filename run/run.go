package run

import (
	"context"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Options tune a run. The zero value runs with nodes.Default, no series
// and no drain.
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
}

// Pipeline is a graph made ready to run.
type Pipeline struct {
	p   *engine.Pipeline
	err error // the construction's, returned by Run
}

// New builds the nodes and queues of g. On error the Pipeline is still
// usable: its Run returns at once with the failed report (every stage and
// edge, nothing run) and the same error, so a caller writes one report
// either way.
func New(g *graph.Graph, opts Options) (*Pipeline, error) {
	p, err := engine.New(g, engine.Options{Registry: opts.Registry, Drain: opts.Drain, Grace: opts.Grace,
		Interval: opts.Interval, Observe: opts.Observe})
	return &Pipeline{p: p, err: err}, err
}

// Run executes the pipeline once (see the package comment).
func (p *Pipeline) Run(ctx context.Context) (*report.Report, error) {
	if p.err != nil {
		return p.p.Failed(p.err), p.err
	}
	return p.p.Execute(ctx)
}

// Snapshot reads the live figures of the run: cumulative since the start;
// diff two for rates.
func (p *Pipeline) Snapshot() *report.Snapshot { return p.p.Snapshot() }

// Run builds and executes g: New then Pipeline.Run.
func Run(ctx context.Context, g *graph.Graph, opts Options) (*report.Report, error) {
	p, _ := New(g, opts)
	return p.Run(ctx)
}

// Deadlock is the error of a run in which no replica could move: each
// waited on a full queue, an empty queue or its group's step, for
// replicas that waited too; Cycle lists the waits, Fix says what breaks
// the cycle. It is report.Deadlock, the runtime's own error type.
type Deadlock = report.Deadlock
