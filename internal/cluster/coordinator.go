package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/nn"
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
	Job   Job
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
	// Timings are the run's lease and ack wait; unset ones take the
	// defaults (the spec's lease, when it has one, comes in through the
	// caller).
	Timings Timings
}

// Coordinator runs one pipeline over a cluster's workers.
type Coordinator struct {
	o      CoordOptions
	g      *graph.Graph
	js     jetstream.JetStream
	run    string
	start  time.Time
	remote map[string][]bool

	mu        sync.Mutex
	workers   []string
	place     map[string][]string // stage -> instance per replica
	instances map[string]*instance
	seen      map[string]time.Time // worker -> last hello
	restarts  int
	snapAt    time.Time
	lostList  atomic.Pointer[[]byte] // lostShares
	// counted are the items committed in the last 2 minutes, by queue and
	// id, oldest first in countedAt; dups counts those done twice
	counted   map[string]bool
	countedAt []countedKey
	dups      int
	snap      *report.Snapshot
	series    []report.Sample
	// groups are the groups across workers it hosts, by stage
	groups map[string]*groupHost
	// deadlock is the detector's state; lastLoss when a worker was last
	// counted lost (the detector waits for its restart)
	deadlock deadlockWatch
	lastLoss time.Time
	// dataKey opens the workers' data planes for this run (Job.DataKey)
	dataKey string
}

// instance is one share of the run: a worker's, or a restart's.
type instance struct {
	name, worker string
	done, lost   bool
	rep          *report.Report
	last         *report.Snapshot
	// ledger is what its restartable replicas finished, committed (and
	// acked) through the coordinator; seq the last commit applied.
	ledger counts
	seq    int64
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
	o.Timings = o.Timings.withDefaults()
	c := &Coordinator{o: o, g: o.Graph, seen: map[string]time.Time{}, instances: map[string]*instance{}}
	var err error
	if c.js, err = jetstream.New(o.Conn); err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	c.run = hex.EncodeToString(b)
	c.dataKey = NewToken()
	sub, err := o.Conn.Subscribe("dflow.hello.*", c.hello)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	deadline := time.Now().Add(o.JoinWait)
	if o.Workers > 0 {
		deadline = time.Now().Add(max(o.JoinWait, 30*time.Second))
	}
	for {
		idle := c.idle()
		if o.Workers > 0 && len(idle) >= o.Workers {
			c.workers = idle[:o.Workers]
			break
		}
		if time.Now().After(deadline) {
			if o.Workers == 0 && len(idle) > 0 {
				c.workers = idle
				break
			}
			if o.Workers > 0 {
				return nil, fmt.Errorf("%d idle worker(s) of the %d wanted announced themselves within %v (start them with dflow worker --join URL)", len(idle), o.Workers, max(o.JoinWait, 30*time.Second))
			}
			return nil, fmt.Errorf("no idle worker announced itself within %v (start them with dflow worker --join URL)", o.JoinWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.place, c.remote = Place(c.g, c.workers, c.stateless)
	// The spec's placement attributes, then the --place flags over them.
	pins := map[string][]string{}
	for _, s := range c.g.Stages {
		if len(s.Placement) > 0 {
			pins[s.Name] = s.Placement
		}
	}
	for stage, ws := range o.Pin {
		pins[stage] = ws
	}
	if len(pins) > 0 {
		if err := c.pin(pins); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Coordinator) hello(m *nats.Msg) {
	var h hello
	if json.Unmarshal(m.Data, &h) != nil || !validName.MatchString(h.Name) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.Busy && c.instances[h.Name] == nil {
		delete(c.seen, h.Name) // busy with another run
		return
	}
	c.seen[h.Name] = time.Now()
}

// idle lists the workers heard from lately, sorted.
func (c *Coordinator) idle() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []string
	for w, t := range c.seen {
		if time.Since(t) < c.o.Timings.Lease {
			ws = append(ws, w)
		}
	}
	sort.Strings(ws)
	return ws
}

// Place spreads every stage's replicas evenly over the workers, stage
// after stage (replica i of the k-th replica in the spec's order goes to
// worker k mod W), and says which queues ride JetStream (remoteQueues);
// restartable says which stages restart elsewhere after a loss.
func Place(g *graph.Graph, workers []string, restartable func(*graph.Stage) bool) (place map[string][]string, remote map[string][]bool) {
	place, remote = map[string][]string{}, map[string][]bool{}
	k := 0
	for _, s := range g.Stages {
		for range s.Replicas {
			place[s.Name] = append(place[s.Name], workers[k%len(workers)])
			k++
		}
	}
	return place, remoteQueues(g, place, restartable)
}

// remoteQueues says which queues ride JetStream under a placement: those
// whose producers and consumers are not all in one worker, and those that
// feed a stage that restarts elsewhere after a loss, so that what it has
// not finished outlives its worker (ledger.go).
func remoteQueues(g *graph.Graph, place map[string][]string, restartable func(*graph.Stage) bool) (remote map[string][]bool) {
	remote = map[string][]bool{}
	for _, e := range g.Edges {
		durable := restartable != nil && restartable(e.To.Stage)
		for _, q := range e.Queues {
			at := map[string]bool{}
			for _, p := range q.Producers {
				at[place[e.From.Stage.Name][p]] = true
			}
			for _, cr := range q.Consumers {
				at[place[e.To.Stage.Name][cr]] = true
			}
			remote[e.Name] = append(remote[e.Name], len(at) > 1 || durable)
		}
	}
	return remote
}

// pin applies CoordOptions.Pin and says again which queues are remote.
func (c *Coordinator) pin(pins map[string][]string) error {
	for stage, ws := range pins {
		s := c.g.Stage(stage)
		if s == nil {
			return fmt.Errorf("--place %s: no stage %q in the spec", stage, stage)
		}
		for _, w := range ws {
			if !slices.Contains(c.workers, w) {
				return fmt.Errorf("--place %s: no worker %q in the cluster (workers: %s)", stage, w, strings.Join(c.workers, ", "))
			}
		}
		for i := range s.Replicas {
			c.place[stage][i] = ws[i%len(ws)]
		}
	}
	c.remote = remoteQueues(c.g, c.place, c.stateless)
	return nil
}

// Placement says where each replica runs, one line.
func (c *Coordinator) Placement() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, s := range c.g.Stages {
		parts = append(parts, fmt.Sprintf("%s %s", s.Name, strings.Join(c.place[s.Name], ",")))
	}
	return strings.Join(parts, "; ")
}

// Workers are the workers the run uses.
func (c *Coordinator) Workers() []string { return slices.Clone(c.workers) }

// Place returns where each replica runs: stage -> worker per replica.
func (c *Coordinator) Where() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]string{}
	for k, v := range c.place {
		out[k] = slices.Clone(v)
	}
	return out
}

// Run starts the workers' shares, waits for them and returns the merged
// report. Cancelling ctx aborts the whole cluster; closing Drain drains
// it.
func (c *Coordinator) Run(ctx context.Context) (*report.Report, error) {
	nc := c.o.Conn
	c.mu.Lock()
	c.start = time.Now()
	c.mu.Unlock()
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := setupRun(setupCtx, c.js, c.run, c.g, c.remote, c.o.Timings.AckWait)
	cancel()
	defer teardownRun(c.js, c.run, c.g, c.remote)
	if err != nil {
		return c.failed(err), err
	}
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			s.Unsubscribe()
		}
	}()
	c.groups = map[string]*groupHost{}
	for _, s := range c.g.Stages {
		if spread(c.place[s.Name]) {
			h := newGroupHost(s.Name, s.Replicas, nc.MaxPayload())
			c.groups[s.Name] = h
			sub, err := nc.Subscribe(subjGroup(c.run, s.Name), h.handle)
			if err != nil {
				return c.failed(err), err
			}
			subs = append(subs, sub)
		}
	}
	csub, err := nc.Subscribe(subjCommit(c.run), c.commit)
	if err != nil {
		return c.failed(err), err
	}
	subs = append(subs, csub)
	dones := make(chan *nats.Msg, 64)
	dsub, err := nc.ChanSubscribe(subjDone(c.run), dones)
	if err != nil {
		return c.failed(err), err
	}
	subs = append(subs, dsub)
	hsub, err := nc.Subscribe("dflow.hello.*", c.hello)
	if err != nil {
		return c.failed(err), err
	}
	subs = append(subs, hsub)
	hbStop := make(chan struct{})
	defer close(hbStop)
	go func() {
		t := time.NewTicker(hbEvery)
		defer t.Stop()
		for {
			nc.Publish(subjHB(c.run), c.lostShares())
			select {
			case <-hbStop:
				return
			case <-t.C:
			}
		}
	}()
	nc.Flush()
	c.mu.Lock()
	for _, w := range c.workers {
		c.instances[w] = &instance{name: w, worker: w, ledger: counts{}}
	}
	c.mu.Unlock()
	for _, w := range c.workers {
		if err := c.startInstance(w, w); err != nil {
			nc.Publish(subjAbort(c.run), nil)
			return c.failed(err), err
		}
	}
	fmt.Fprintf(c.o.Log, "dflow: cluster run %s on %s: %s\n", c.run, strings.Join(c.workers, ", "), c.Placement())

	var firstErr error
	status := ""
	drain := c.o.Drain
	live := time.NewTicker(hbEvery)
	defer live.Stop()
	var series <-chan time.Time
	if c.o.Interval > 0 {
		t := time.NewTicker(c.o.Interval)
		defer t.Stop()
		series = t.C
	}
	var prev *report.Snapshot
	ticks := 0
	abort := func() { nc.Publish(subjAbort(c.run), nil); nc.Flush() }
	var abortedAt time.Time
	// judge looks for a deadlock across the workers in the snapshots just
	// taken (deadlock.go): the run then fails as in process, or, when a
	// drain cannot complete, ends aborted.
	drainStuck := false
	judge := func() {
		if firstErr != nil || !abortedAt.IsZero() {
			return
		}
		if d := c.watchDeadlock(ctx, status == report.Interrupted); d != nil {
			firstErr, drainStuck = d, d.Draining
			abort()
		}
	}
	for !c.allDone() {
		select {
		case m := <-dones:
			var d done
			if json.Unmarshal(m.Data, &d) != nil {
				continue
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
					in.last = snap // its figures as it ended, node metrics included
				}
			}
			c.mu.Unlock()
			// A share counted lost has been replaced: what it says now
			// (its abort, say) is not the run's.
			if counted && d.Err != "" && firstErr == nil {
				firstErr = errors.New(d.Err)
				abort()
			}
		case <-drain:
			drain = nil
			status = report.Interrupted
			nc.Publish(subjDrain(c.run), nil)
		case <-ctx.Done():
			if abortedAt.IsZero() {
				status, abortedAt = report.Aborted, time.Now()
				abort()
			} else if time.Since(abortedAt) > c.o.Grace+c.o.Timings.Lease {
				c.giveUp()
			}
			select {
			case m := <-dones:
				dones <- m
			case <-time.After(hbEvery):
			}
		case <-series:
			s := c.Snapshot()
			c.mu.Lock()
			c.series = append(c.series, s.Sample(prev))
			c.mu.Unlock()
			prev = s
			if c.o.Observe != nil {
				c.o.Observe(s)
			}
			judge()
		case <-live.C:
			// Every share's figures at least every second, monitoring or
			// not: what a lost share had finished is judged by its last.
			if ticks++; ticks%4 == 0 && (prev == nil || time.Since(prev.Time) > time.Second) {
				c.Snapshot()
				judge()
			}
			if err := c.checkLive(ctx); err != nil && firstErr == nil {
				firstErr = err
				abort()
			}
			if !abortedAt.IsZero() && time.Since(abortedAt) > c.o.Grace+c.o.Timings.Lease {
				c.giveUp()
			}
		}
		if firstErr != nil && abortedAt.IsZero() {
			abortedAt = time.Now()
		}
	}
	if firstErr == nil && status == "" {
		firstErr = c.unread(ctx) // every share done: what is still in a stream was never read
	}
	if c.o.Interval > 0 && (prev == nil || time.Since(prev.Time) >= c.o.Interval/2) {
		s := c.merge(time.Now())
		c.mu.Lock()
		c.series = append(c.series, s.Sample(prev))
		c.mu.Unlock()
	}
	rep := c.merged(status, firstErr)
	if drainStuck {
		rep.Status = report.Aborted // as in process: a drain that cannot complete
	}
	return rep, firstErr
}

// unread fails a run whose shares have all ended while a remote queue's
// stream still holds items never delivered to any consumer: their
// consumers returned before reading their input to the end, as a local
// run fails (no one engine sees it: each worker's consumers ended with
// producers elsewhere). Items delivered and not acked are left alone: an
// ack sent just before a share's end may still be on its way (a worker
// whose consumers returned with items in hand fails itself).
func (c *Coordinator) unread(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for ei, e := range c.g.Edges {
		for qi := range e.Queues {
			if !c.remote[e.Name][qi] {
				continue
			}
			s, err := c.js.Stream(ctx, streamQueue(c.run, ei, qi))
			if err != nil {
				continue
			}
			cons, err := s.Consumer(ctx, "c")
			if err != nil {
				continue
			}
			if info, err := cons.Info(ctx); err == nil && info.NumPending > 0 {
				return fmt.Errorf("edge %q queue %d: stage %q returned with %d items of stage %q unread; a consumer must read its input to the end",
					e.Name, qi, e.To.Stage.Name, info.NumPending, e.From.Stage.Name)
			}
		}
	}
	return nil
}

// lostShares is the heartbeat's payload: the shares counted lost, one
// name a line, so that a worker that missed its abort (it was paused, or
// reconnecting) hears it with the next beat. It takes no lock: nothing
// may hold the heartbeat back (a commit's flush holds c.mu).
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

// markRan records which replicas a share lost ran, and adds it to the
// heartbeat's list (c.mu held); once.
func (c *Coordinator) markRan(in *instance) {
	if in.ran != nil {
		return
	}
	var b []byte
	if old := c.lostList.Load(); old != nil {
		b = append(b, *old...)
	}
	b = append(append(b, in.name...), '\n')
	c.lostList.Store(&b)
	in.ran = map[string][]int{}
	for _, s := range c.g.Stages {
		for i, p := range c.place[s.Name] {
			if p == in.name {
				in.ran[s.Name] = append(in.ran[s.Name], i)
			}
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
	job.Provenance = nn.CurrentRun()
	job.Timings = c.o.Timings
	job.DataKey = c.dataKey
	c.mu.Lock()
	job.Place = map[string][]string{}
	for k, v := range c.place {
		job.Place[k] = slices.Clone(v)
	}
	c.mu.Unlock()
	job.Remote = c.remote
	b, err := json.Marshal(&job)
	if err != nil {
		return err
	}
	m, err := c.o.Conn.Request(subjRun(worker), b, 30*time.Second)
	if err != nil {
		return fmt.Errorf("worker %s did not take its share: %v", worker, err)
	}
	var r reply
	json.Unmarshal(m.Data, &r)
	if r.Err != "" {
		return errors.New(r.Err)
	}
	return nil
}

// checkLive looks for workers gone silent: their stateless replicas
// restart on a live worker; a stateful replica lost fails the run.
func (c *Coordinator) checkLive(ctx context.Context) error {
	c.mu.Lock()
	var lost []*instance
	for _, in := range c.instances {
		if !in.done && !in.lost && time.Since(c.seen[in.worker]) > c.o.Timings.Lease {
			in.lost = true
			c.markRan(in) // now, whatever recover makes of it
			lost = append(lost, in)
		}
	}
	c.mu.Unlock()
	for _, in := range lost {
		if err := c.recover(in); err != nil {
			return err
		}
	}
	return nil
}

// recover restarts the replicas of a lost instance on the live worker
// with the fewest, or says which stateful replica was lost.
func (c *Coordinator) recover(in *instance) error {
	// Whatever it still does, the share is over: told so, it stops keeping
	// its items from redelivery (a worker that was only slow, say).
	c.o.Conn.Publish(subjAbortShare(c.run, in.name), nil)
	c.mu.Lock()
	c.lastLoss = time.Now()
	c.markRan(in)
	type rep struct {
		s *graph.Stage
		i int
	}
	var move, stay []rep
	var moved []string
	var stateful error
	for _, s := range c.g.Stages {
		for i, p := range c.place[s.Name] {
			if p != in.name {
				continue
			}
			switch {
			case c.stateless(s):
				// done or not: a finished one may have left its last
				// item uncommitted, which comes back to its restart
				move = append(move, rep{s, i})
				moved = append(moved, fmt.Sprintf("%s[%d]", s.Name, i))
			case in.last != nil && replicaDone(in.last, s.Name, i):
				stay = append(stay, rep{s, i}) // finished: not run again
			case stateful == nil:
				if h := c.groups[s.Name]; h != nil {
					h.leave(i) // lost with its host: it has left its group
				}
				stateful = fmt.Errorf("worker %s lost (no word from it for %v): stage %q replica %d (%s) keeps state and cannot restart elsewhere; the run fails (a checkpointing node resumes from its last checkpoint on the next run)",
					in.worker, c.o.Timings.Lease, s.Name, i, s.Node)
			}
		}
	}
	c.mu.Unlock()
	if stateful != nil {
		fmt.Fprintf(c.o.Log, "dflow: %v\n", stateful)
		return stateful
	}
	// A finished replica that stays where it was lost has sent all it
	// will: its queues' end keys are written for it (its share wrote them
	// only once all its producers there had returned).
	for _, r := range stay {
		if err := c.writeEnds(r.s, r.i); err != nil {
			return fmt.Errorf("worker %s lost: stage %q replica %d had finished, but its end of input could not be recorded: %v", in.worker, r.s.Name, r.i, err)
		}
	}
	if len(move) == 0 {
		fmt.Fprintf(c.o.Log, "dflow: worker %s lost (no word from it for %v): its replicas had finished\n", in.worker, c.o.Timings.Lease)
		return nil
	}
	target := c.leastLoaded(in.worker)
	if target == "" {
		return fmt.Errorf("worker %s lost and no live worker left to restart %s on", in.worker, strings.Join(moved, ", "))
	}
	c.mu.Lock()
	c.restarts++
	inst := fmt.Sprintf("%s-r%d", target, c.restarts)
	for _, r := range move {
		c.place[r.s.Name][r.i] = inst
	}
	c.instances[inst] = &instance{name: inst, worker: target, ledger: counts{}}
	c.mu.Unlock()
	fmt.Fprintf(c.o.Log, "dflow: worker %s lost (no word from it for %v): restarting %s on %s; its unfinished items are redelivered\n",
		in.worker, c.o.Timings.Lease, strings.Join(moved, ", "), target)
	return c.startInstance(target, inst)
}

// writeEnds writes the end keys of replica i of s, a producer that has
// finished, on every queue it feeds.
func (c *Coordinator) writeEnds(s *graph.Stage, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, bucketEnds(c.run))
	if err != nil {
		return err
	}
	for ei, e := range c.g.Edges {
		if e.From.Stage != s {
			continue
		}
		for qi, q := range e.Queues {
			if slices.Contains(q.Producers, i) {
				if _, err := kv.Put(ctx, keyEnd(ei, qi, i), []byte("coordinator")); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func replicaDone(s *report.Snapshot, stage string, i int) bool {
	for _, st := range s.Stages {
		if st.Name == stage && i < len(st.Replicas) {
			return st.Replicas[i].Done
		}
	}
	return false
}

// stateless reports whether a stage's replicas may restart elsewhere: its
// kind says so and its replicas do not step together.
func (c *Coordinator) stateless(s *graph.Stage) bool { return restartable(c.o.Registry, s) }

// leastLoaded is the live worker other than not running the fewest
// replicas.
func (c *Coordinator) leastLoaded(not string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	load := map[string]int{}
	for _, w := range c.workers {
		if w != not && time.Since(c.seen[w]) < c.o.Timings.Lease {
			load[w] = 0
		}
	}
	for _, s := range c.g.Stages {
		for _, p := range c.place[s.Name] {
			if in := c.instances[p]; in != nil {
				if _, ok := load[in.worker]; ok {
					load[in.worker]++
				}
			}
		}
	}
	best := ""
	for _, w := range c.workers {
		if n, ok := load[w]; ok && (best == "" || n < load[best]) {
			best = w
		}
	}
	return best
}

// Snapshot is the cluster's live snapshot: every instance's, merged.
func (c *Coordinator) Snapshot() *report.Snapshot {
	c.mu.Lock()
	if c.snap != nil && time.Since(c.snapAt) < 100*time.Millisecond {
		s := c.snap
		c.mu.Unlock()
		return s
	}
	var ask []*instance
	for _, in := range c.instances {
		if !in.done && !in.lost {
			ask = append(ask, in)
		}
	}
	run := c.run
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, in := range ask {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := c.o.Conn.Request(subjSnap(run, in.name), nil, time.Second)
			if err != nil {
				return
			}
			s := &report.Snapshot{}
			if json.Unmarshal(m.Data, s) == nil {
				c.mu.Lock()
				in.last = s
				c.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s := c.merge(time.Now())
	c.mu.Lock()
	c.snap, c.snapAt = s, time.Now()
	c.mu.Unlock()
	return s
}

// merge builds one snapshot from the instances' latest: a lost one's
// counts are what it committed (lostReplica, lostEdge).
func (c *Coordinator) merge(now time.Time) *report.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &report.Snapshot{Time: now}
	if !c.start.IsZero() {
		out.Elapsed = now.Sub(c.start)
	}
	var tmpl *report.Snapshot
	var snaps []*report.Snapshot // the shares not lost
	byName := map[string]*report.Snapshot{}
	var lost []*instance
	for _, in := range c.sortedInstances() {
		if in.lost {
			lost = append(lost, in) // counted by its ledger, snapshot or not
		}
		if in.last == nil {
			continue
		}
		if tmpl == nil {
			tmpl = in.last
		}
		if !in.lost {
			snaps = append(snaps, in.last)
			byName[in.name] = in.last
		}
	}
	if tmpl == nil {
		return out
	}
	for si, st := range tmpl.Stages {
		gs := c.g.Stage(st.Name)
		ms := report.StageSnapshot{Name: st.Name, Node: st.Node, Source: st.Source, Total: st.Total}
		var repMetrics []map[string]report.Metric
		if gs != nil {
			ms.Metrics, ms.Counters, repMetrics = c.stageMetrics(gs)
		}
		for i := range st.Replicas {
			r := st.Replicas[i]
			if s := byName[c.place[st.Name][i]]; s != nil && si < len(s.Stages) && i < len(s.Stages[si].Replicas) {
				r = s.Stages[si].Replicas[i]
			} else {
				r.ItemsIn, r.ItemsOut = 0, 0
			}
			if i < len(repMetrics) {
				r.Metrics = repMetrics[i]
			}
			if in := c.instances[c.place[st.Name][i]]; in != nil {
				r.Worker = in.worker
			}
			for _, in := range lost {
				if gs != nil {
					if lr, ok := c.lostReplica(in, gs, i); ok {
						r.ItemsIn += lr.ItemsIn
						r.ItemsOut += lr.ItemsOut
						r.Busy += lr.Busy
						r.Idle += lr.Idle
						r.Blocked += lr.Blocked
						if in.name != c.place[st.Name][i] {
							r.Worker = in.worker + ">" + r.Worker
						}
					}
				}
			}
			ms.Replicas = append(ms.Replicas, r)
		}
		out.Stages = append(out.Stages, ms)
	}
	for ei, e := range tmpl.Edges {
		me := e
		me.Produced, me.Consumed = 0, 0
		me.Queues = slices.Clone(e.Queues)
		for qi := range me.Queues {
			me.Queues[qi].Depth, me.Queues[qi].Open = 0, nil
		}
		for _, s := range snaps {
			if ei >= len(s.Edges) {
				continue
			}
			me.Produced += s.Edges[ei].Produced
			me.Consumed += s.Edges[ei].Consumed
			for qi, q := range s.Edges[ei].Queues {
				if qi < len(me.Queues) {
					me.Queues[qi].Depth = max(me.Queues[qi].Depth, q.Depth)
					me.Queues[qi].Open = append(me.Queues[qi].Open, q.Open...)
				}
			}
		}
		if ge := c.g.Edge(e.Name); ge != nil {
			for _, in := range lost {
				p, n := c.lostEdge(in, ge)
				me.Produced += p
				me.Consumed += n
			}
		}
		for qi := range me.Queues {
			slices.Sort(me.Queues[qi].Open)
			me.Queues[qi].Open = slices.Compact(me.Queues[qi].Open)
		}
		out.Edges = append(out.Edges, me)
	}
	for _, s := range snaps {
		out.Draining = out.Draining || s.Draining
	}
	return out
}

// stageMetrics merges stage s's node metrics from every share's latest
// snapshot (c.mu held): each replica's as the shares that ran it saw
// them (a lost share, then the one that took over), then over the
// replicas by each metric's rule, as one process merges them.
func (c *Coordinator) stageMetrics(s *graph.Stage) (values map[string]float64, counters map[string]bool, replicas []map[string]report.Metric) {
	kind, _ := c.o.Registry.Kind(s.Node)
	replicas = make([]map[string]report.Metric, s.Replicas)
	for i := range replicas {
		var seen []map[string]report.Metric
		for _, in := range c.sortedInstances() {
			if ss := in.last.Stage(s.Name); ss != nil && i < len(ss.Replicas) {
				seen = append(seen, ss.Replicas[i].Metrics) // none where it did not run
			}
		}
		replicas[i] = report.Latest(seen...)
	}
	values, counters = report.MergeMetrics(kind, replicas)
	return values, counters, replicas
}

// lostReplica is what replica i of s did in the lost share in, as the
// report counts it: its items as committed for a restartable stage
// (ledger.go), as in the last snapshot for another (whose replicas had
// finished, or the run failed); its times as in the last snapshot. ok is
// false when in did not run the replica.
func (c *Coordinator) lostReplica(in *instance, s *graph.Stage, i int) (r report.ReplicaSnapshot, ok bool) {
	if !slices.Contains(in.ran[s.Name], i) {
		return r, false
	}
	if in.last != nil {
		for _, st := range in.last.Stages {
			if st.Name == s.Name && i < len(st.Replicas) {
				r = st.Replicas[i]
			}
		}
	}
	if c.stateless(s) {
		r.ItemsIn, r.ItemsOut = in.ledger[replicaKey("i", s.Name, i)], in.ledger[replicaKey("o", s.Name, i)]
	}
	return r, true
}

// lostEdge is what the lost share in produced and consumed on e, as the
// report counts it: each side by the ledger when its stage restarts, by
// the last snapshot when it does not.
func (c *Coordinator) lostEdge(in *instance, e *graph.Edge) (produced, consumed int64) {
	var last *report.EdgeSnapshot
	if in.last != nil {
		for k := range in.last.Edges {
			if in.last.Edges[k].Name == e.Name {
				last = &in.last.Edges[k]
			}
		}
	}
	switch {
	case c.stateless(e.From.Stage):
		produced = in.ledger[edgeKey("p", e.Name)]
	case last != nil:
		produced = last.Produced
	}
	switch {
	case c.stateless(e.To.Stage):
		consumed = in.ledger[edgeKey("c", e.Name)]
	case last != nil:
		consumed = last.Consumed
	}
	return produced, consumed
}

// commit applies a share's commit (ledger.go): its items' messages are
// acked, then its counts go into the share's ledger, each item's once
// (countOnce), then it is answered. A commit from a share already counted
// lost is refused: its items come back to the shares that took over.
func (c *Coordinator) commit(m *nats.Msg) {
	var cm commit
	if err := json.Unmarshal(m.Data, &cm); err != nil {
		respond(m, fmt.Errorf("bad commit: %v", err))
		return
	}
	c.mu.Lock()
	in := c.instances[cm.Instance]
	switch {
	case in == nil:
		c.mu.Unlock()
		respond(m, fmt.Errorf("no share %q in run %s", cm.Instance, c.run))
		return
	case in.lost:
		c.mu.Unlock()
		respond(m, fmt.Errorf("worker %s was counted lost; its items went to others", in.worker))
		return
	case cm.Seq <= in.seq:
		// Counted already: its answer was lost. Acks are idempotent: they
		// go again.
		c.mu.Unlock()
		if err := c.ack(cm.acks()); err != nil {
			respondRetry(m, err)
			return
		}
		respond(m, nil)
		return
	}
	// Acked, then counted once the server has the acks (if it has not, the
	// worker sends the commit again). The lock is not held meanwhile (the
	// workers' announcements need it), so the share may be counted lost in
	// between: its items are acked, not redelivered, and are counted all
	// the same, in the ledger by which a lost share is counted.
	c.mu.Unlock()
	if err := c.ack(cm.acks()); err != nil {
		respondRetry(m, err)
		return
	}
	c.mu.Lock()
	if cm.Seq > in.seq {
		in.seq = cm.Seq
		in.ledger.add(cm.Counts)
		now := time.Now()
		for _, it := range cm.Items {
			if c.countOnce(it.Queue+"/"+it.ID, now) {
				in.ledger.add(it.Counts)
			} else {
				c.dups++ // done twice (its message came back): counted once
			}
		}
	}
	c.mu.Unlock()
	respond(m, nil)
}

// countOnce reports whether an item (its queue and id) is counted for the
// first time, and remembers it for JetStream's duplicate window: an item
// whose message came back after a commit had counted it (a commit that
// reached the coordinator late, say) was done twice, and is counted once
// (c.mu held).
func (c *Coordinator) countOnce(key string, now time.Time) bool {
	if c.counted == nil {
		c.counted = map[string]bool{}
	}
	for len(c.countedAt) > 0 && now.Sub(c.countedAt[0].at) > 2*time.Minute {
		delete(c.counted, c.countedAt[0].key)
		c.countedAt = c.countedAt[1:]
	}
	if c.counted[key] {
		return false
	}
	c.counted[key] = true
	c.countedAt = append(c.countedAt, countedKey{key, now})
	return true
}

type countedKey struct {
	key string
	at  time.Time
}

// ack acks messages by their reply subjects and waits until the server
// has them; the worker keeps them from redelivery until it hears so.
func (c *Coordinator) ack(subjects []string) error {
	for _, subj := range subjects {
		if subj == "" {
			continue
		}
		if err := c.o.Conn.Publish(subj, []byte("+ACK")); err != nil {
			return err
		}
	}
	if err := c.o.Conn.FlushTimeout(2 * time.Second); err != nil {
		return err
	}
	return nil
}

func (c *Coordinator) sortedInstances() []*instance {
	var out []*instance
	for _, in := range c.instances {
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// merged builds the run's report from the instances' reports.
func (c *Coordinator) merged(status string, err error) *report.Report {
	// A run that completed (or drained) counts a restartable stage by
	// what every share committed, each item once (countOnce): the engines'
	// own counts would count twice an item done again after its message
	// came back. A run cut short counts what the engines saw.
	byLedger := err == nil && status != report.Aborted
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	rep := &report.Report{Spec: c.g.Filename, Stages: map[string]report.Stage{}, Edges: map[string]report.Edge{},
		Series: c.series, Diagnosis: []string{}, Started: c.start.Round(0), WallSeconds: now.Sub(c.start).Seconds()}
	if rep.Series == nil {
		rep.Series = []report.Sample{}
	}
	var reps []*report.Report
	byName := map[string]*report.Report{}
	worst := report.OK
	rank := map[string]int{report.OK: 0, report.Interrupted: 1, report.Aborted: 2, report.Failed: 3}
	for _, in := range c.sortedInstances() {
		if in.rep != nil {
			reps = append(reps, in.rep)
			byName[in.name] = in.rep
			if rank[in.rep.Status] > rank[worst] {
				worst = in.rep.Status
			}
		}
	}
	workerOf := func(inst string) string {
		if in := c.instances[inst]; in != nil {
			return in.worker
		}
		return inst
	}
	for _, s := range c.g.Stages {
		st := report.Stage{Node: s.Node}
		st.Metrics, _, _ = c.stageMetrics(s)
		for i := range s.Replicas {
			inst := c.place[s.Name][i]
			r := report.Replica{Index: i, Device: s.Device(i)}
			if own := byName[inst]; own != nil && i < len(own.Stages[s.Name].Replicas) {
				r = own.Stages[s.Name].Replicas[i]
			}
			r.Worker = workerOf(inst)
			for _, in := range c.sortedInstances() {
				if !in.lost {
					continue
				}
				if lr, ok := c.lostReplica(in, s, i); ok {
					r.ItemsIn += lr.ItemsIn
					r.ItemsOut += lr.ItemsOut
					r.BusySeconds += lr.Busy.Seconds()
					r.IdleSeconds += lr.Idle.Seconds()
					r.BlockedSeconds += lr.Blocked.Seconds()
					if total := r.BusySeconds + r.IdleSeconds + r.BlockedSeconds; total > 0 {
						r.Utilization = r.BusySeconds / total
					}
					if in.name != inst {
						r.Worker = in.worker + ">" + r.Worker
					}
				}
			}
			if byLedger && c.stateless(s) {
				r.ItemsIn = c.ledgerSum(replicaKey("i", s.Name, i))
				r.ItemsOut = c.ledgerSum(replicaKey("o", s.Name, i))
			}
			st.Replicas = append(st.Replicas, r)
		}
		rep.Stages[s.Name] = st
	}
	for _, e := range c.g.Edges {
		re := report.Edge{Policy: string(e.Policy), Capacity: e.Capacity, CapacityBytes: e.CapacityBytes}
		for _, q := range e.Queues {
			re.Queues = append(re.Queues, report.Queue{Producers: q.Producers, Consumers: q.Consumers})
		}
		for _, r := range reps {
			ed, ok := r.Edges[e.Name]
			if !ok {
				continue
			}
			re.Produced += ed.Produced
			re.Consumed += ed.Consumed
			for qi, q := range ed.Queues {
				if qi < len(re.Queues) {
					re.Queues[qi].MaxDepth = max(re.Queues[qi].MaxDepth, q.MaxDepth)
					re.Queues[qi].MeanDepth = max(re.Queues[qi].MeanDepth, q.MeanDepth)
				}
			}
		}
		for _, in := range c.instances {
			if in.lost {
				p, n := c.lostEdge(in, e)
				re.Produced += p
				re.Consumed += n
			}
		}
		if byLedger && c.stateless(e.From.Stage) {
			re.Produced = c.ledgerSum(edgeKey("p", e.Name))
		}
		if byLedger && c.stateless(e.To.Stage) {
			re.Consumed = c.ledgerSum(edgeKey("c", e.Name))
		}
		rep.Edges[e.Name] = re
	}
	rep.SetOrder(c.g.Names())
	switch {
	case err != nil:
		rep.Status = report.Failed
	case status == report.Aborted:
		rep.Status = report.Aborted
	case status == report.Interrupted && worst != report.Failed:
		rep.Status = report.Interrupted
	default:
		rep.Status = worst
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}

// ledgerSum adds key over every share's ledger (c.mu held).
func (c *Coordinator) ledgerSum(key string) int64 {
	var n int64
	for _, in := range c.instances {
		n += in.ledger[key]
	}
	return n
}

// failed is the report of a run that could not start.
func (c *Coordinator) failed(err error) *report.Report {
	rep := c.merged(report.Failed, err)
	return rep
}

// Run is the cluster's run id.
func (c *Coordinator) RunID() string { return c.run }
