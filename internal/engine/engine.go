package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Options tune a run.
type Options struct {
	// Registry builds the nodes; nodes.Default when nil.
	Registry *nodes.Registry
	// Drain, when closed, starts a drain: sources are stopped, items in
	// flight are consumed, nodes see Replica.Draining closed, and the run
	// ends "interrupted". Cancelling Run's ctx instead aborts at once: the
	// run ends "aborted", as does a drain that cannot complete because
	// nothing left can move (the error then names the deadlock).
	Drain <-chan struct{}
	// Grace is how long replicas get to return after the run is
	// cancelled before Run gives up on them (default 5s).
	Grace time.Duration
	// SampleEvery is the queue-depth sampling period (default 10ms).
	SampleEvery time.Duration
	// DeadlockConfirm is how long a stuck state must hold, unchanged,
	// before the run fails with a *Deadlock (default
	// DefaultDeadlockConfirm; deadlock.go).
	DeadlockConfirm time.Duration
	// Interval is the monitoring period: every Interval a point is added
	// to the report's series and Observe, if set, is called with a fresh
	// snapshot. Zero means no series and no calls.
	Interval time.Duration
	Observe  func(*report.Snapshot)
	// Transport, when set, may carry queues out of process (transport.go);
	// nil keeps every queue an in-process channel.
	Transport TransportFor
	// Chain, when set, may make an in-process queue a chain's: its items
	// carry receipts derived from their senders' (transport.go).
	Chain ChainFor
	// Here, when set, runs only the replicas it accepts; the others run
	// in other engines (placement.go). Group, when set, may give a stage
	// a group whose members sit in several engines.
	Here  PlaceFor
	Group GroupFor
	// Wrap, when set, is given every stage's node once built and returns
	// the node to run (a cluster's worker follows what a restartable
	// stage's replicas take and send this way); a wrapper made with
	// Wrapped keeps what the node says of its quiescence.
	Wrap func(s *graph.Stage, n nodes.Node) nodes.Node
	// Rebalance, when set for a graph with a rebalance block, is its
	// policy: the engine moves replicas between the block's stages as it
	// says, while the run goes (rebalance.go; Movable says which runs
	// can).
	Rebalance RebalanceFor
	// Parked, on a cluster, are the rebalanced stages' replicas that
	// start parked: the last Parked[stage] of each, wired to the stage's
	// queues as the graph has them; a move the coordinator decides starts
	// one (Pipeline.Move), and Pipeline.Release takes those that will not
	// start out of their queues (parked.go).
	Parked map[string]int
	// Started are the slots among them that a move has started already
	// (they run from the start here: a share taking over a lost worker's
	// replicas), Left the replicas a move took away (they do not run
	// again), and Released the stages whose slots were released.
	Started  map[string][]int
	Left     map[string][]int
	Released []string
}

// Run is one execution of a graph.
type run struct {
	g        *graph.Graph
	opts     Options
	stages   []*stage
	edges    []*edge
	draining chan struct{}
	pumps    *pumps // the transports' pumps (startPumps)
	coarse   coarseClock
	// stop is set once the run is cancelled, srcStop once it is cancelled
	// or drained: a replica's cheap test, before it blocks in a plain
	// channel operation, of whether its context may be done (a flag set
	// once is one load; a closed-channel test is a call).
	stop    stopFlag
	srcStop stopFlag
	start   time.Time
	startNs atomic.Int64 // start, for monitoring goroutines
	series  []report.Sample
	detect  detector

	mu       sync.Mutex
	firstErr error
	cancel   context.CancelFunc
	// moves makes a rebalance's moves (Options.Rebalance), nil without
	moves *mover
}

type stage struct {
	g        *graph.Stage
	index    int // in the graph's order
	run      *run
	node     nodes.Node
	replicas []*replica
	group    *group
	remote   RemoteGroup // the stage's group across engines, if any (placement.go)
	kind     *graph.Kind // for its metrics' merge rules
	total    int64       // items the stage will emit in all, 0 when unknown
	// oneForOne: its kind sends one item on each output for each it takes
	// (nodes.Spec.OneForOne)
	oneForOne bool
	// slots, for a rebalanced stage, are its replicas and the parked ones
	// a move may start (rebalance.go): what Replica.Replicas says, so that
	// every index is below it and a group of one that may grow is told
	// it is not alone; 0 otherwise
	slots int
}

type edge struct {
	g      *graph.Edge
	run    *run
	queues []*queue
}

// stage returns the stage of that name.
func (r *run) stage(name string) *stage {
	for _, s := range r.stages {
		if s.g.Name == name {
			return s
		}
	}
	return nil
}

// Run executes g until every stage has finished, the run fails, ctx is
// cancelled (abort) or opts.Drain is closed (drain). It always returns a
// report; the error is the run's first failure, naming stage and replica.
func Run(ctx context.Context, g *graph.Graph, opts Options) (*report.Report, error) {
	p, err := New(g, opts)
	if err != nil {
		return p.Failed(err), err
	}
	return p.Execute(ctx)
}

// Pipeline is a graph made ready to run: nodes built, queues wired. Its
// Snapshot may be read from any goroutine while Execute runs.
type Pipeline struct{ r *run }

// New builds the nodes and queues of g. On error the Pipeline is still
// usable for its (failed) report.
func New(g *graph.Graph, opts Options) (*Pipeline, error) {
	if opts.Registry == nil {
		opts.Registry = nodes.Default
	}
	if opts.Grace == 0 {
		opts.Grace = 5 * time.Second
	}
	if opts.SampleEvery == 0 {
		opts.SampleEvery = 10 * time.Millisecond
	}
	if opts.DeadlockConfirm == 0 {
		opts.DeadlockConfirm = DefaultDeadlockConfirm
	}
	r := &run{g: g, opts: opts, draining: make(chan struct{})}
	r.detect.confirm = opts.DeadlockConfirm
	return &Pipeline{r}, r.build()
}

// Execute runs the pipeline once (see Run).
func (p *Pipeline) Execute(ctx context.Context) (*report.Report, error) {
	return p.r.execute(ctx)
}

// Failed is the report of a pipeline whose construction failed with err:
// every stage and edge, nothing run.
func (p *Pipeline) Failed(err error) *report.Report {
	return p.r.report(time.Now(), report.Failed, err)
}

// FailedReport is the report of a run of g that could not start (its
// cluster could not be reached, say) with err: every stage and edge,
// nothing counted.
func FailedReport(g *graph.Graph, err error) *report.Report {
	return (&run{g: g}).report(time.Now(), report.Failed, err)
}

// Snapshot reads the live figures of the run.
func (p *Pipeline) Snapshot() *report.Snapshot { return p.r.snapshot(time.Now()) }

// build constructs nodes, queues and replica ports.
func (r *run) build() error {
	byName := map[string]*stage{}
	for _, gs := range r.g.Stages {
		spec, ok := r.opts.Registry.Spec(gs.Node)
		if !ok || spec.New == nil {
			return fmt.Errorf("stage %q: node kind %q cannot be run: no constructor registered", gs.Name, gs.Node)
		}
		n, err := spec.New(gs.Config)
		if err != nil {
			return fmt.Errorf("stage %q (%s): %w", gs.Name, gs.Node, err)
		}
		if r.opts.Wrap != nil {
			n = r.opts.Wrap(gs, n)
		}
		s := &stage{g: gs, index: len(r.stages), run: r, node: n, group: newGroup(gs.Replicas), kind: &spec.Kind}
		if spec.Total != nil {
			s.total = spec.Total(gs.Config)
		}
		s.oneForOne = spec.OneForOne
		for i := 0; i < gs.Replicas; i++ {
			_, quiescer := n.(nodes.Quiescer)
			s.replicas = append(s.replicas, &replica{
				stage: s, index: i, device: gs.Device(i), countSites: quiescer, metrics: newMetrics(),
				remoteSite: waitSite{kind: waitRemoteGroup},
				inputs:     map[string]*input{}, outputs: map[string]*output{},
			})
		}
		for _, rep := range s.replicas {
			for _, p := range gs.Inputs {
				in := &input{r: rep}
				in.site = waitSite{kind: waitRecv, in: in}
				rep.inputs[p.Name] = in
			}
			for _, p := range gs.Outputs {
				rep.outputs[p.Name] = &output{r: rep}
			}
		}
		r.stages = append(r.stages, s)
		byName[gs.Name] = s
	}
	for _, ge := range r.g.Edges {
		e := &edge{g: ge, run: r}
		for i, gq := range ge.Queues {
			q := newQueue(e, gq, ge.Capacity, ge.CapacityBytes)
			if r.opts.Transport != nil {
				if t := r.opts.Transport(ge, i); t != nil {
					// The transport holds what is in flight; the consumers'
					// side keeps one item at hand (transport.go).
					q.t, q.ch = t, make(chan any, 1)
				}
			}
			if r.opts.Chain != nil && q.t == nil {
				q.chain = r.opts.Chain(ge, i)
			}
			e.queues = append(e.queues, q)
		}
		from, to := byName[ge.From.Stage.Name], byName[ge.To.Stage.Name]
		for i, rep := range from.replicas {
			oe := &outEdge{route: ge.Policy.Router(ge, i)}
			for _, qi := range ge.ProducerQueues(i) {
				oq := newOutQueue(e.queues[qi])
				oq.q.senders = append(oq.q.senders, oq)
				oe.queues = append(oe.queues, oq)
			}
			out := rep.outputs[ge.From.Name]
			out.edges = append(out.edges, oe)
			out.one = nil
			if len(out.edges) == 1 && len(oe.queues) == 1 && oe.route == nil && oe.queues[0].q.chain == nil {
				out.one = oe.queues[0]
			}
		}
		for i, rep := range to.replicas {
			in := rep.inputs[ge.To.Name]
			iq := newInQueue(e.queues[ge.ConsumerQueue(i)])
			iq.q.receivers = append(iq.q.receivers, iq)
			rep.delivers = rep.delivers || iq.remote
			in.all = append(in.all, iq)
			in.live = append(in.live, iq)
			in.one = nil
			if len(in.all) == 1 {
				in.one = iq
			}
		}
		r.edges = append(r.edges, e)
	}
	if err := r.parkSlots(); err != nil {
		return err
	}
	r.place()
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			for _, in := range rep.inputs {
				in.clock.starts, in.clock.solo = true, len(rep.inputs) == 1
			}
			for _, out := range rep.outputs {
				out.clock.starts = rep.isSource()
				out.clock.solo = out.clock.starts && len(rep.outputs) == 1
			}
		}
	}
	return nil
}

func (r *run) execute(parent context.Context) (*report.Report, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	r.cancel = cancel
	srcCtx, stopSources := context.WithCancel(ctx)
	defer stopSources()

	r.coarse.now.Store(nanotime())
	r.start = time.Now()
	r.startNs.Store(r.start.UnixNano())
	var wg sync.WaitGroup
	if r.moves != nil {
		// The mover's count: held while a move may start a replica, let
		// go once every replica has returned (settle, rebalance.go).
		wg.Add(1)
		r.moves.mu.Lock()
		r.moves.wg, r.moves.ctx = &wg, ctx
		r.moves.mu.Unlock()
	}
	// The pumps first: a parked replica that a move starts starts its
	// own (parked.go).
	stopPumps := r.startPumps(ctx)
	defer stopPumps()
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.away || rep.parked.Load() || rep.gone {
				rep.markAway(r.start) // runs in another engine, or not yet, or no more (rebalance.go, parked.go)
				continue
			}
			parent := ctx
			if rep.isSource() {
				parent = srcCtx
			}
			r.launch(rep, parent, &wg, nil)
		}
	}
	r.releaseAtStart() // released or left before the run started here (parked.go)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()

	stopSampling := r.sample()
	defer stopSampling()

	drain := r.opts.Drain
	for {
		select {
		case <-finished:
			stopSampling()
			return r.result(parent)
		case <-drain:
			drain = nil
			close(r.draining)
			stopSources()
			r.srcStop.set()
		case <-ctx.Done():
			r.stop.set()
			r.srcStop.set()
			r.settle() // no parked replica holds the run any longer
			// Release the waits the cancellation cannot reach, until every
			// replica has returned or the grace period is over.
			quit := make(chan struct{})
			woken := make(chan struct{})
			go func() {
				defer close(woken)
				r.wake(finished, quit)
			}()
			select {
			case <-finished:
			case <-time.After(r.opts.Grace):
				r.stuck()
			}
			close(quit)
			<-woken
			stopSampling()
			return r.result(parent)
		}
	}
}

// launch runs a replica in a goroutine of its own, under parent; ready,
// if set, is called once the replica is set up, before it runs.
func (r *run) launch(rep *replica, parent context.Context, wg *sync.WaitGroup, ready func()) {
	// A context of its own per replica: a replica blocked on a queue
	// selects on its own Done channel, not on one that every replica of
	// the run contends for.
	rctx, rcancel := context.WithCancel(parent)
	rep.ctx, rep.done, rep.coarse, rep.stop = rctx, rctx.Done(), &r.coarse, &r.stop
	if rep.isSource() {
		rep.stop = &r.srcStop
	}
	if ready != nil {
		ready()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer rcancel()
		r.finish(rep, r.call(rctx, rep))
		r.succeed(rep) // the replica that takes over its device after a move, if any
		r.settle()     // the last to return lets the mover's count go
	}()
}

// call runs one replica's node, turning a panic into an error.
func (r *run) call(ctx context.Context, rep *replica) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, trimStack(debug.Stack()))
		}
	}()
	err = rep.stage.node.Run(ctx, rep)
	if err != nil && rep.isSource() && r.isDraining() && errors.Is(err, context.Canceled) {
		err = nil // a source stopped by the drain ended cleanly
	}
	return err
}

func (r *run) isDraining() bool {
	select {
	case <-r.draining:
		return true
	default:
		return false
	}
}

// finish does the bookkeeping when a replica's Run returns: it closes the
// queues it was the last producer of, and checks that it did not leave a
// queue unfinished as its last consumer.
func (r *run) finish(rep *replica, err error) {
	rep.clock.stop(rep) // returned while working on an item
	if err == nil && rep.ctx.Err() == nil {
		rep.settleHand() // done with its last delivery
	} else {
		rep.dropHand() // not done: it comes back to whatever takes over, if anything
	}
	rep.flush()
	rep.ended.Store(time.Now().UnixNano())
	rep.stage.leave(rep.index)
	if err != nil {
		r.fail(fmt.Errorf("stage %q replica %d: %w", rep.stage.g.Name, rep.index, err))
	}
	for _, out := range rep.outputs {
		for _, oe := range out.edges {
			for _, oq := range oe.queues {
				oq.q.producerDone(rep.index)
			}
		}
	}
	for _, in := range rep.inputs {
		for _, iq := range in.all {
			q := iq.q
			if unfinished, unread := q.consumerDone(); unfinished && err == nil {
				r.fail(fmt.Errorf("edge %q: stage %q returned while stage %q still produces (%d items unread); a consumer must read its input to the end",
					q.edge.g.Name, q.edge.g.To.Stage.Name, q.edge.g.From.Stage.Name, unread))
			}
		}
	}
}

// fail records the run's first error and cancels everything.
func (r *run) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.firstErr == nil {
		r.firstErr = err
		r.cancel()
	}
}

// stuck adds the replicas that ignored cancellation to the run's error.
func (r *run) stuck() {
	running := r.running()
	r.mu.Lock()
	defer r.mu.Unlock()
	stuck := fmt.Errorf("replicas %s did not stop within %v of cancellation", running, r.opts.Grace)
	if r.firstErr == nil {
		r.firstErr = stuck
	} else {
		r.firstErr = fmt.Errorf("%w; and %v", r.firstErr, stuck)
	}
}

func (r *run) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.firstErr
}

// running names the replicas that have not returned.
func (r *run) running() string {
	var names []string
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			if rep.ended.Load() == 0 {
				names = append(names, fmt.Sprintf("%s[%d]", s.g.Name, rep.index))
			}
		}
	}
	return strings.Join(names, ", ")
}

func (r *run) result(parent context.Context) (*report.Report, error) {
	err := r.err()
	status := report.OK
	switch {
	case r.detect.drainStuck.Load():
		status = report.Aborted // a drain that could not complete: err says why
	case parent.Err() != nil && (err == nil || errors.Is(err, context.Canceled)):
		status, err = report.Aborted, nil
	case err != nil:
		status = report.Failed
	case r.isDraining():
		status = report.Interrupted
	}
	rep := r.report(time.Now(), status, err)
	if status == report.OK && r.opts.Here == nil { // the whole graph ran here
		if err = CheckBooksThrough(r.g, rep, r.totals(), r.oneForOne()); err != nil {
			rep.Status, rep.Error = report.Failed, err.Error()
		}
	}
	return rep, err
}

// sample advances the coarse clock and records queue depths at every tick
// (every SampleEvery, or every Interval when that is shorter) and, with an
// Interval, takes a series point (and makes an Observe call) every
// Interval, until stop. stop is idempotent and adds a last series point at
// the end of the run.
func (r *run) sample() (stop func()) {
	period := r.opts.SampleEvery
	if r.opts.Interval > 0 && r.opts.Interval < period {
		period = r.opts.Interval // series points as often as asked
	}
	t := newTicker(period)
	finished := make(chan struct{})
	var prev *report.Snapshot
	go func() {
		defer close(finished)
		next := time.Now().Add(r.opts.Interval)
		for t.wait() {
			now := nanotime()
			r.coarse.now.Store(now)
			for _, e := range r.edges {
				for _, q := range e.queues {
					q.sample()
				}
			}
			r.checkDeadlock(now)
			if r.moves != nil && r.moves.policy != nil {
				r.rebalance(time.Now())
			}
			if r.opts.Interval > 0 {
				if now := time.Now(); !now.Before(next) {
					prev = r.observe(now, prev, true)
					next = next.Add(r.opts.Interval)
					if next.Before(now) { // fell behind: no burst of catch-up points
						next = now.Add(r.opts.Interval)
					}
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.stop()
			<-finished
			// A last series point closes the picture, unless one was
			// taken moments ago (its utilization would be noise).
			now := time.Now()
			if r.opts.Interval > 0 && (prev == nil || now.Sub(prev.Time) >= r.opts.Interval/2) {
				r.observe(now, prev, false)
			}
		})
	}
}

// observe adds a series point and, if call, calls Observe.
func (r *run) observe(now time.Time, prev *report.Snapshot, call bool) *report.Snapshot {
	s := r.snapshot(now)
	r.series = append(r.series, s.Sample(prev))
	if call && r.opts.Observe != nil {
		r.opts.Observe(s)
	}
	return s
}

func trimStack(b []byte) string {
	lines := strings.Split(string(b), "\n")
	if len(lines) > 16 {
		lines = lines[:16]
	}
	return strings.Join(lines, "\n")
}

// Wrapped is a node that runs as run does (a wrapper around n that waits
// on nothing of its own) and says of its replicas' quiescence what n says
// (nodes.Quiescer), so that the deadlock detector still sees through n.
func Wrapped(n nodes.Node, run nodes.NodeFunc) nodes.Node {
	if q, ok := n.(nodes.Quiescer); ok {
		return quiescent{run, q}
	}
	return run
}

type quiescent struct {
	nodes.NodeFunc
	nodes.Quiescer
}
