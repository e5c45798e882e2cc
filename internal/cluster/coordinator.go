package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/deadlock"
	"github.com/dflow-dev/dflow/internal/cluster/figures"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/moves"
	"github.com/dflow-dev/dflow/internal/cluster/restarts"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// CoordOptions configure a coordinator.
type CoordOptions struct {
	Conn *nats.Conn
	// Graph is the spec as loaded here; Job carries its source and
	// overrides (Filename, Src, Vars, VarFiles, Sets) for the workers.
	Graph *graph.Graph
	Job   wire.Job
	// Workers is how many workers to wait for; 0 takes those that have
	// announced themselves within JoinWait (at least one).
	Workers  int
	JoinWait time.Duration
	Registry *nodes.Registry
	// Interval, Observe, Drain and Grace are as in run.Options.
	Interval time.Duration
	Observe  func(*report.Snapshot)
	Drain    <-chan struct{}
	Grace    time.Duration
	// Log gets the placement and the faults, a line each.
	Log io.Writer
	// Pin places a stage's replicas on the workers named, replica i on
	// Pin[stage][i mod len], over the spec's placement attributes; the
	// other stages spread evenly.
	Pin map[string][]string
	// Rebalance, for a graph with a rebalance block, is its policy: the
	// coordinator moves replicas between the block's stages as it says
	// (moves.go; engine.MovableAcross says which runs can). Nil: the run
	// keeps its split.
	Rebalance engine.RebalanceFor
	// Timings are the run's lease and ack wait; unset ones take the
	// defaults (the spec's lease, when it has one, comes in through the
	// caller).
	Timings wire.Timings
}

// Coordinator runs one pipeline over a cluster's workers.
type Coordinator struct {
	o      CoordOptions
	g      *graph.Graph
	js     jetstream.JetStream
	run    string
	start  time.Time
	remote map[string][]bool
	// chained says which edges are chains' (control.Queues): in process,
	// their items settled through the inputs at the chains' heads
	chained map[string]bool
	// recount are the resuming sources' heads lost shares recorded last
	// (Job.Recount) (c.mu)
	recount wire.ChainHeads

	mu        sync.Mutex
	workers   []string
	place     map[string][]string // stage -> instance per replica
	instances map[string]*instance
	seen      map[string]time.Time // worker -> last hello
	paused    control.Pauses       // the coordinator's own (seen by the heartbeat), not counted as workers' silence
	// restores are the saves groups lost whole restore, and their
	// attempts (package restarts, which decides what a loss restarts)
	restores restarts.Book
	restarts int
	snapAt   time.Time
	lostList atomic.Pointer[[]byte] // lostShares
	snap     *report.Snapshot
	series   []report.Sample
	// end is what the streams and records said once every share was done
	end figures.End
	// evicted are shares counted lost though heard from, to restart at
	// the next check (a group's restore needs a member they ran back)
	evicted []*instance
	// groups are the groups across workers it hosts, by stage
	groups map[string]*host.Host
	// deadlock is the detector's state; lastLoss when a worker was last
	// counted lost (the detector waits for its restart)
	deadlock deadlock.Watch
	lastLoss time.Time
	// dataKey opens the workers' data planes for this run (Job.DataKey)
	dataKey string
	// moves is a rebalance's record (moves.go); nil without one
	moves *moves.Book
}

// instance is one share of the run: a worker's, or a restart's.
type instance struct {
	name, worker string
	done, lost   bool
	// evict: counted lost though heard from (Coordinator.evicted), for
	// the restore of this stage's group
	evict string
	rep   *report.Report
	last  *report.Snapshot
	// lastAt is when the coordinator had last (its clock)
	lastAt time.Time
	// ran lists, once it is lost, the replicas it ran: stage -> indices.
	ran map[string][]int
}

// NewCoordinator waits for the workers and places the replicas.
func NewCoordinator(ctx context.Context, o CoordOptions) (*Coordinator, error) {
	if o.Registry == nil {
		o.Registry = nodes.Default
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.JoinWait == 0 {
		o.JoinWait = 2 * time.Second
	}
	if o.Grace == 0 {
		o.Grace = 5 * time.Second
	}
	o.Timings = o.Timings.WithDefaults()
	c := &Coordinator{o: o, g: o.Graph, seen: map[string]time.Time{}, instances: map[string]*instance{}}
	var err error
	if c.js, err = wire.NewJS(o.Conn); err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	c.run = hex.EncodeToString(b)
	c.dataKey = NewToken()
	if err := c.waitWorkers(ctx); err != nil {
		return nil, err
	}
	pins, err := control.Pins(c.g, o.Pin, c.workers)
	if err != nil {
		return nil, err
	}
	c.place, c.remote, c.chained = control.Place(c.g, c.workers, c.kinds(), pins)
	if o.Rebalance != nil && c.g.Rebalance != nil {
		if err := c.addSlots(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Plan is where a run across the workers named puts each replica (by
// stage), and how it carries each edge (report.Edge.Carried): `dflow
// graph --workers` shows it before a run.
func Plan(g *graph.Graph, reg *nodes.Registry, workers []string, pin map[string][]string) (place map[string][]string, carried map[string]string, err error) {
	pins, err := control.Pins(g, pin, workers)
	if err != nil {
		return nil, nil, err
	}
	kinds := control.Kinds{Restartable: func(s *graph.Stage) bool { return wire.Restartable(reg, s) },
		Chainable: func(s *graph.Stage) bool { return wire.Chainable(reg, s) }}
	place, remote, chained := control.Place(g, workers, kinds, pins)
	carried = map[string]string{}
	for _, e := range g.Edges {
		carried[e.Name] = control.Carried(e, place, remote[e.Name], chained[e.Name])
	}
	return place, carried, nil
}

// waitWorkers waits for the run's workers: Workers idle ones (up to
// 30s), or those idle that announced themselves within JoinWait.
func (c *Coordinator) waitWorkers(ctx context.Context) error {
	sub, err := c.o.Conn.Subscribe("dflow.hello.*", c.hello)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	deadline := time.Now().Add(c.o.JoinWait)
	if c.o.Workers > 0 {
		deadline = time.Now().Add(max(c.o.JoinWait, 30*time.Second))
	}
	for {
		idle := c.idle()
		if c.o.Workers > 0 && len(idle) >= c.o.Workers {
			c.workers = idle[:c.o.Workers]
			break
		}
		if time.Now().After(deadline) {
			if c.o.Workers == 0 && len(idle) > 0 {
				c.workers = idle
				break
			}
			if c.o.Workers > 0 {
				return fmt.Errorf("%d idle worker(s) of the %d wanted announced themselves within %v (start them with dflow worker --join URL)", len(idle), c.o.Workers, max(c.o.JoinWait, 30*time.Second))
			}
			return fmt.Errorf("no idle worker announced itself within %v (start them with dflow worker --join URL)", c.o.JoinWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Run starts the workers' shares, waits for them and returns the merged
// report. Cancelling ctx aborts the whole cluster; closing Drain drains
// it.
func (c *Coordinator) Run(ctx context.Context) (*report.Report, error) {
	c.mu.Lock()
	c.start = time.Now()
	c.mu.Unlock()
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := wire.SetupRun(setupCtx, c.js, c.run, c.g, c.remote, c.o.Timings.AckWait)
	cancel()
	defer wire.TeardownRun(c.js, c.run, c.g, c.remote)
	if err != nil {
		return c.failed(err), err
	}
	dones, stop, err := c.listen()
	defer stop()
	if err != nil {
		return c.failed(err), err
	}
	if err := c.startShares(); err != nil {
		return c.failed(err), err
	}
	l := &runLoop{c: c, ctx: ctx, dones: dones, drain: c.o.Drain}
	l.run()
	if l.err == nil && l.status == "" {
		l.err = c.unread(ctx) // every share done: what is still in a stream was never read
	}
	if c.o.Interval > 0 && (l.prev == nil || time.Since(l.prev.Time) >= c.o.Interval/2) {
		s := c.merge(time.Now())
		c.mu.Lock()
		c.series = append(c.series, s.Sample(l.prev))
		c.mu.Unlock()
	}
	rep, err := c.merged(l.status, l.err)
	if l.drainStuck {
		rep.Status = report.Aborted // as in process: a drain that cannot complete
	}
	return rep, err
}

// listen subscribes to what the run's workers say (groups,
// dones, announcements) and starts the heartbeat; stop undoes it all.
func (c *Coordinator) listen() (dones chan *nats.Msg, stop func(), err error) {
	nc := c.o.Conn
	var subs []*nats.Subscription
	hbStop := make(chan struct{})
	var beating sync.WaitGroup // the heartbeat's goroutine, ended by stop
	stop = func() {
		for _, s := range subs {
			s.Unsubscribe()
		}
		select {
		case <-hbStop:
		default:
			close(hbStop)
		}
		beating.Wait()
	}
	sub := func(subject string, f nats.MsgHandler) {
		if err != nil {
			return
		}
		var s *nats.Subscription
		if s, err = nc.Subscribe(subject, f); err == nil {
			subs = append(subs, s)
		}
	}
	groups := map[string]*host.Host{}
	for _, s := range c.g.Stages {
		var slots []int // a rebalance's: members once a move starts them (moves.go)
		if c.moves != nil {
			slots = c.moves.SlotsOf(s.Name)
		}
		if wire.Hosted(c.o.Registry, s, c.place[s.Name], len(slots) > 0) {
			h := host.New(s.Name, s.Replicas, nc.MaxPayload(), wire.Moves(c.o.Registry, s))
			if len(slots) > 0 {
				h.Park(slots)
			}
			groups[s.Name] = h
			sub(wire.SubjGroup(c.run, s.Name), h.Handle)
		}
	}
	c.mu.Lock() // for LastSave, which may be called while Run runs
	c.groups = groups
	c.mu.Unlock()
	sub("dflow.hello.*", c.hello)
	sub("dflow.r."+c.run+".saves.*", c.savesNote)
	sub(wire.SubjAlive(c.run), func(m *nats.Msg) { m.Respond(c.lostShares()) }) // a worker that missed heartbeats asks
	dones = make(chan *nats.Msg, 64)
	if err == nil {
		var ds *nats.Subscription
		if ds, err = nc.ChanSubscribe(wire.SubjDone(c.run), dones); err == nil {
			subs = append(subs, ds)
		}
	}
	if err != nil {
		return nil, stop, err
	}
	beating.Go(func() {
		t := time.NewTicker(wire.HBEvery)
		defer t.Stop()
		for {
			nc.Publish(wire.SubjHB(c.run), c.lostShares())
			c.paused.Check(time.Now())
			select {
			case <-hbStop:
				return
			case <-t.C:
			}
		}
	})
	nc.Flush()
	return dones, stop, nil
}

// startShares starts every worker's share of the run.
func (c *Coordinator) startShares() error {
	c.mu.Lock()
	for _, w := range c.workers {
		c.instances[w] = &instance{name: w, worker: w}
	}
	c.mu.Unlock()
	for _, w := range c.workers {
		if err := c.startInstance(w, w); err != nil {
			c.o.Conn.Publish(wire.SubjAbort(c.run), nil)
			return err
		}
	}
	fmt.Fprintf(c.o.Log, "dflow: cluster run %s on %s: %s\n", c.run, strings.Join(c.workers, ", "), c.Placement())
	return nil
}

// runLoop is the coordinator's run once the shares have started: what
// the workers say, the drain, the abort, the figures and the liveness
// checks, until every share is done.
type runLoop struct {
	c     *Coordinator
	ctx   context.Context
	dones chan *nats.Msg
	drain <-chan struct{}
	// err is the run's first failure; status "" (ok so far), interrupted
	// (a drain) or aborted
	err        error
	status     string
	abortedAt  time.Time
	drainStuck bool // a drain that cannot complete: the run ends aborted
	prev       *report.Snapshot
	ticks      int
}

func (l *runLoop) run() {
	live := time.NewTicker(wire.HBEvery)
	defer live.Stop()
	var series <-chan time.Time
	if l.c.o.Interval > 0 {
		t := time.NewTicker(l.c.o.Interval)
		defer t.Stop()
		series = t.C
	}
	for !l.c.allDone() {
		select {
		case m := <-l.dones:
			l.done(m)
		case <-l.drain:
			l.drain = nil
			l.status = report.Interrupted
			l.c.o.Conn.Publish(wire.SubjDrain(l.c.run), nil)
		case <-l.ctx.Done():
			l.cancelled()
		case <-series:
			l.sample()
		case <-live.C:
			l.tick()
		}
		if l.err != nil && l.abortedAt.IsZero() {
			l.abortedAt = time.Now()
		}
	}
}

// over says the run drains, failed or was aborted: no move is made, and
// the parked slots are released.
func (l *runLoop) over() bool { return l.err != nil || l.status != "" }

// fail records the run's first failure and aborts every share.
func (l *runLoop) fail(err error) {
	if l.err == nil {
		l.err = err
		l.abort()
	}
}

func (l *runLoop) abort() {
	l.c.o.Conn.Publish(wire.SubjAbort(l.c.run), nil)
	l.c.o.Conn.Flush()
}

// done takes a share's report and last figures.
func (l *runLoop) done(m *nats.Msg) {
	c := l.c
	var d wire.Done
	if json.Unmarshal(m.Data, &d) != nil {
		return
	}
	m.Respond(nil)
	rep := &report.Report{}
	if json.Unmarshal(d.Report, rep) != nil {
		rep = nil
	}
	c.mu.Lock()
	counted := false
	if in := c.instances[d.Instance]; in != nil && !in.lost {
		in.done, in.rep, counted = true, rep, true
		if snap := (&report.Snapshot{}); json.Unmarshal(d.Snapshot, snap) == nil {
			in.last, in.lastAt = snap, time.Now() // its figures as it ended, node metrics included
			c.snap = nil                          // the next snapshot has them
		}
	}
	c.mu.Unlock()
	// A share counted lost has been replaced: what it says now (its
	// abort, say) is not the run's.
	if counted && d.Err != "" {
		l.fail(errors.New(d.Err))
	}
}

// cancelled aborts the run (ctx is done), and gives up on shares that do
// not answer within the grace period and a lease.
func (l *runLoop) cancelled() {
	if l.abortedAt.IsZero() {
		l.status, l.abortedAt = report.Aborted, time.Now()
		l.abort()
	} else if time.Since(l.abortedAt) > l.c.o.Grace+l.c.o.Timings.Lease {
		l.c.giveUp()
	}
	select {
	case m := <-l.dones:
		l.dones <- m
	case <-time.After(wire.HBEvery):
	}
}

// sample takes a point of the series (and shows it to Observe).
func (l *runLoop) sample() {
	c := l.c
	all := c.snapshotAll()
	s := c.visible(all)
	c.mu.Lock()
	c.series = append(c.series, s.Sample(l.prev))
	c.mu.Unlock()
	l.prev = s
	if c.o.Observe != nil {
		c.o.Observe(s)
	}
	l.judge()
	c.rebalance(all, l.over())
}

// tick reads every share's figures at least every second, monitoring or
// not (what a lost share had finished is judged by its last), and looks
// for lost workers.
func (l *runLoop) tick() {
	c := l.c
	if l.ticks++; l.ticks%4 == 0 && (l.prev == nil || time.Since(l.prev.Time) > time.Second) {
		all := c.snapshotAll()
		l.judge()
		c.rebalance(all, l.over())
	}
	if err := c.checkLive(l.ctx); err != nil {
		l.fail(err)
	}
	if !l.abortedAt.IsZero() && time.Since(l.abortedAt) > c.o.Grace+c.o.Timings.Lease {
		c.giveUp()
	}
}

// judge looks for a deadlock across the workers in the snapshots just
// taken (package deadlock): the run then fails as in process, or, when a
// drain cannot complete, ends aborted.
func (l *runLoop) judge() {
	if l.err != nil || !l.abortedAt.IsZero() {
		return
	}
	c := l.c
	c.mu.Lock()
	v := c.deadlockView()
	c.mu.Unlock()
	if d := c.deadlock.Judge(l.ctx, v, l.status == report.Interrupted); d != nil {
		l.drainStuck = d.Draining
		l.fail(d)
	}
}

// deadlockView is what the deadlock watch reads of the run (c.mu held):
// every replica's latest figures from the share that runs it, or ran it.
func (c *Coordinator) deadlockView() *deadlock.View {
	v := &deadlock.View{Graph: c.g, Timings: c.o.Timings, LastLoss: c.lastLoss,
		Replicas: map[deadlock.Replica]deadlock.Seen{}, Groups: map[string]deadlock.Group{},
		Queued: func(ctx context.Context, ei, q int) (int, error) { return wire.QueueWaiting(ctx, c.js, c.run, ei, q) }}
	for _, s := range c.g.Stages {
		for i := range s.Replicas {
			in := c.instances[c.place[s.Name][i]]
			if in == nil {
				continue
			}
			if ss := in.last.Stage(s.Name); ss != nil && i < len(ss.Replicas) {
				v.Replicas[deadlock.Replica{Stage: s.Name, I: i}] = deadlock.Seen{ReplicaSnapshot: ss.Replicas[i], Worker: in.worker, Lost: in.lost}
			}
		}
	}
	for stage, h := range c.groups {
		v.Groups[stage] = h
	}
	return v
}

// unread fails a run whose shares have all ended while a remote queue's
// stream still holds items (figures.Streams.Unread); what it read is the
// queues' depth in the run's last snapshot.
func (c *Coordinator) unread(ctx context.Context) error {
	depth, err := c.streams().Unread(ctx)
	c.mu.Lock()
	c.end.Depth, c.snap = depth, nil
	c.mu.Unlock()
	return err
}

// lostShares is the heartbeat's payload: the shares counted lost, one
// name a line, so that a worker that missed its abort (it was paused, or
// reconnecting) hears it with the next beat. It takes no lock: nothing
// may hold the heartbeat back.
func (c *Coordinator) lostShares() []byte {
	if b := c.lostList.Load(); b != nil {
		return *b
	}
	return nil
}

// giveUp counts the instances that have not reported as lost.
func (c *Coordinator) giveUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, in := range c.instances {
		if !in.done && !in.lost {
			in.lost = true
			c.markRan(in)
		}
	}
}

func (c *Coordinator) allDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, in := range c.instances {
		if !in.done && !in.lost {
			return false
		}
	}
	return true
}

// startInstance sends worker the job of instance inst.
func (c *Coordinator) startInstance(worker, inst string) error {
	job := c.o.Job
	job.Run, job.Instance, job.Grace, job.Restart = c.run, inst, c.o.Grace, inst != worker
	job.Provenance = nodes.CurrentRun()
	job.Timings = c.o.Timings
	job.DataKey = c.dataKey
	job.Remote = c.remote
	job.Chained = c.chained
	c.mu.Lock()
	job.Place = c.placeCopy()
	job.Recount.MergeSources(c.recount)
	job.Restore, job.Attempt = c.restores.Job()
	if c.moves != nil {
		job.Started, job.Released, job.Left = c.moves.Job()
	}
	c.mu.Unlock()
	b, err := json.Marshal(&job)
	if err != nil {
		return err
	}
	m, err := c.take(worker, b)
	if err != nil {
		return err
	}
	var r wire.Reply
	json.Unmarshal(m.Data, &r)
	if r.Err != "" {
		return errors.New(r.Err)
	}
	return nil
}

// maxTake bounds how long a worker may take to take its share.
const maxTake = 30 * time.Minute

// take sends worker its share's job and waits for the answer. A share
// answers once it has built its nodes, which may load a model for
// minutes: the wait lasts while the worker still announces itself (its
// announcements go on while it builds), and ends, with an error naming
// it, once it has been silent past the lease, or after maxTake.
func (c *Coordinator) take(worker string, job []byte) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), maxTake)
	defer cancel()
	var silent atomic.Bool
	stop := make(chan struct{})
	var watch sync.WaitGroup
	began := time.Now() // silence counts from here: its hellos may not have been heard before
	watch.Go(func() {
		t := time.NewTicker(wire.HelloEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			c.mu.Lock()
			quiet := min(c.silent(worker), time.Since(began))
			c.mu.Unlock()
			if quiet > c.o.Timings.Lease {
				silent.Store(true)
				cancel()
				return
			}
		}
	})
	m, err := c.o.Conn.RequestWithContext(ctx, wire.SubjRun(worker), job)
	close(stop)
	watch.Wait()
	switch {
	case err == nil:
		return m, nil
	case silent.Load():
		return nil, fmt.Errorf("worker %s went silent for %v while it took its share (it announces itself while it builds its nodes)", worker, c.o.Timings.Lease)
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("worker %s did not take its share within %v", worker, maxTake)
	}
	return nil, fmt.Errorf("worker %s did not take its share: %w", worker, err)
}

// Run is the cluster's run id.
func (c *Coordinator) RunID() string { return c.run }
