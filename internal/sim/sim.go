package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Options tune a simulation.
type Options struct {
	// Registry supplies the nodes' simulation models; nodes.Default when
	// nil.
	Registry *nodes.Registry
	// From, when set, takes each replica's service times from a measured
	// run: a log-normal fitted to the body of the replica's measured
	// distribution, its median and the spread its mean allows, so that a
	// tail of load spikes is not taken for the stage's cost (fitBody).
	// Stages absent from the report keep their model.
	From *report.Report
	// Seed seeds the draws of service times that do not come from a
	// node's own seeded model (sim blocks, From).
	Seed uint64
	// Interval adds a series point (and an Observe call) every Interval of
	// virtual time; zero means none.
	Interval time.Duration
	Observe  func(*report.Snapshot)

	// probe: stages without a model take probeService an item and
	// sources without a total emit probeItems (ProbeDeadlock).
	probe bool
	// maxItems, when set, scales every source's total down alike so that
	// none emits more than this many items; sim.scale is the factor back
	// (Predictor).
	maxItems int64
	// Rebalance, for a graph with a rebalance block, simulates its
	// policy: at each look the Rebalancer decides, and the simulation
	// moves replicas as it says (a leaving replica finishes its item in
	// hand; a new one starts after the block's move_cost). The report's
	// Moves list them.
	Rebalance bool
	// Moved, if set, is called with each decision the simulation acts
	// on, once its moves are made (to say them as they happen).
	Moved func(at time.Duration, d Decision)
	// fixed, when set, gives stages a constant service time an item over
	// their models (the rebalance policy's fitted ones).
	fixed map[string]time.Duration
	// refit, when above zero, redraws the measured figures of From
	// within their precision before they are fitted: the predictor's
	// alternative fits, one per value (redraw).
	refit int
}

type state int8

const (
	busy state = iota
	idle
	blocked
	done
)

type phase int8

const (
	phaseStart   phase = iota // ready for the next item
	phaseRecv                 // waiting for an item
	phaseBarrier              // released from a sync step
	phaseServed               // the service time has elapsed
	phaseSend                 // sending the item on every output edge
)

type item struct {
	size int64
	key  string // synthetic_source's keys; "" for none
}

// Key makes an item nodes.Keyed for a key_hash edge's router.
func (it *item) Key() string { return it.key }

type proc struct {
	st        *sstage
	idx       int
	state     state
	since     time.Duration
	acc       [3]time.Duration // busy, idle, blocked
	phase     phase
	inputs    []*squeue // live input queues
	outs      []*sout
	sendIdx   int
	routed    bool // the item in hand has its queue on outs[sendIdx] (sout.cur)
	emitted   int64
	cur       item
	handoff   bool // cur was handed over by a producer while waiting
	left      bool // left the sync group
	retiring  bool // a rebalance moves it: it leaves once its item in hand is done
	retired   bool // it left so
	joining   bool // a rebalance started it: it joins its stage's group at its first step
	remaining int64
	items     int // items finished, for fail_after
	next      func() time.Duration
	// nextAt, when set, draws instead of next, knowing the time and the
	// stage's items started so far (nodes.SimModel.ServiceAt)
	nextAt  func(elapsed time.Duration, started int64) time.Duration
	in, out int64
	service []float64 // seconds
	waiting []*squeue // queues this replica waits on
	end     time.Duration
}

// sout is one output edge of a replica: its queues, the edge policy's
// router over them (nil: the only queue), and the queue the item in hand
// goes to.
type sout struct {
	queues []*squeue
	route  graph.Router
	cur    int
}

type sstage struct {
	g         *graph.Stage
	procs     []*proc
	sync      bool
	key       func(replica int, seq int64) string // synthetic_source's keys, or nil
	failAfter int
	itemBytes int64
	total     int64
	share     func(total int64, i, n int) int64 // a source's split of total over its replicas
	source    bool
	members   int
	started   int64 // items its replicas started serving
	newProc   func(i int) (*proc, error)
	arrived   []*proc
	metrics   map[string]float64
}

type sedge struct {
	g      *graph.Edge
	queues []*squeue
}

type squeue struct {
	e             *sedge
	buf           []item
	head          int
	cap           int
	capBytes      int64
	bytes         int64
	producersLeft int
	// producers and consumers are the wiring's, and the replicas a
	// rebalance started since
	producers, consumers []int
	live                 []bool // per producer: not yet finished
	waiters              []*proc
	blocked              []*proc
	produced             int64
	consumed             int64
	area                 float64 // depth x seconds
	last                 time.Duration
	maxDepth             int
}

type event struct {
	at   time.Duration
	seq  uint64
	p    *proc // nil for a monitoring tick or a look
	tick bool
	look bool // the rebalance policy's check
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type sim struct {
	g        *graph.Graph
	opts     Options
	now      time.Duration
	events   eventHeap
	seq      uint64
	runnable []*proc
	stages   []*sstage
	edges    []*sedge
	err      error
	// Events counts processed events, for the speed benchmark.
	Events int64
	series []report.Sample
	prev   *report.Snapshot
	// scale is what the sources' totals were divided by (maxItems): 1,
	// or more when they were scaled down.
	scale float64
	// rb is the rebalance policy (Options.Rebalance), moves the moves it
	// made.
	rb    *Rebalancer
	moves []report.Move
}

// Run simulates g and returns its report ("simulated": true).
func Run(g *graph.Graph, opts Options) (*report.Report, error) {
	s, err := build(g, opts)
	if err != nil {
		return failedReport(g, err), err
	}
	s.run()
	return s.report(), s.err
}

// Stats reports how much work a simulation did, for benchmarks.
func Stats(g *graph.Graph, opts Options) (events int64, err error) {
	s, err := build(g, opts)
	if err != nil {
		return 0, err
	}
	s.run()
	return s.Events, s.err
}

func failedReport(g *graph.Graph, err error) *report.Report {
	return &report.Report{Spec: g.Filename, Status: report.Failed, Error: err.Error(), Simulated: true,
		Stages: map[string]report.Stage{}, Edges: map[string]report.Edge{}, Series: []report.Sample{}, Diagnosis: []string{}}
}

func (s *sim) schedule(at time.Duration, p *proc, tick bool) {
	s.seq++
	heap.Push(&s.events, event{at: at, seq: s.seq, p: p, tick: tick})
}

// onlyTicks reports whether every event left is a monitoring tick or a
// look: no replica has anything left to do at any time.
func (s *sim) onlyTicks() bool {
	for _, ev := range s.events {
		if ev.p != nil {
			return false
		}
	}
	return len(s.events) > 0
}

func (s *sim) run() {
	if s.opts.Interval > 0 {
		s.schedule(s.opts.Interval, nil, true)
	}
	if s.rb != nil {
		s.scheduleLook()
	}
	for _, st := range s.stages {
		for _, p := range st.procs {
			s.runnable = append(s.runnable, p)
		}
	}
	for s.err == nil {
		for len(s.runnable) > 0 && s.err == nil {
			p := s.runnable[0]
			s.runnable = s.runnable[1:]
			s.step(p)
		}
		if len(s.events) == 0 || s.err != nil {
			break
		}
		if s.onlyTicks() {
			break // only the monitoring tick and the look are left: the run is over
		}
		ev := heap.Pop(&s.events).(event)
		s.now = ev.at
		s.Events++
		if ev.look {
			s.rebalanceLook()
			s.scheduleLook()
			continue
		}
		if ev.tick {
			s.observe()
			if len(s.events) > 0 || len(s.runnable) > 0 {
				s.schedule(s.now+s.opts.Interval, nil, true)
			}
			continue
		}
		s.step(ev.p)
	}
	if s.err == nil {
		s.checkFinished()
	}
	if s.rb != nil && len(s.moves) > 0 {
		s.moves = s.rb.Finish(s.snapshot())
	}
	if s.opts.Interval > 0 && (s.prev == nil || s.now-s.prev.Elapsed >= s.opts.Interval/2) {
		s.series = append(s.series, s.snapshot().Sample(s.prev))
	}
}

// checkFinished reports replicas left waiting when no event remains: a
// deadlock the model cannot resolve.
func (s *sim) checkFinished() {
	if st := s.stuck(); st != nil {
		s.err = st
	}
}

func (s *sim) setState(p *proc, st state) {
	if p.state != done {
		p.acc[p.state] += s.now - p.since
	}
	p.state, p.since = st, s.now
}

// step advances a replica until it waits or schedules its service end.
func (s *sim) step(p *proc) {
	for {
		switch p.phase {
		case phaseStart:
			if p.retiring || p.joining {
				if !s.startOrLeave(p) {
					return
				}
			}
			if p.st.failAfter > 0 && p.items == p.st.failAfter {
				s.err = fmt.Errorf("stage %q replica %d: injected failure after %d items (fail_after = %d), at %.3fs simulated",
					p.st.g.Name, p.idx, p.items, p.st.failAfter, s.now.Seconds())
				return
			}
			if p.st.source {
				if p.remaining == 0 {
					s.finish(p)
					return
				}
				p.remaining--
				p.cur = item{size: p.st.itemBytes}
				if p.st.key != nil {
					p.cur.key = p.st.key(p.idx, p.emitted)
				}
				p.emitted++
				s.serve(p)
				return
			}
			p.phase = phaseRecv
		case phaseRecv:
			got, eof := s.take(p)
			switch {
			case got:
				p.in++
				if p.st.sync && !s.arrive(p) {
					s.setState(p, blocked)
					p.phase = phaseBarrier
					return
				}
				s.serve(p)
				return
			case eof:
				s.leave(p)
				s.finish(p)
				return
			}
			s.setState(p, idle)
			for _, q := range p.inputs {
				q.waiters = append(q.waiters, p)
				p.waiting = append(p.waiting, q)
			}
			return
		case phaseBarrier:
			s.serve(p)
			return
		case phaseServed:
			p.items++
			p.phase, p.sendIdx = phaseSend, 0
		case phaseSend:
			for p.sendIdx < len(p.outs) {
				o := p.outs[p.sendIdx]
				if !p.routed {
					o.cur = 0
					if o.route != nil {
						i, err := o.route.Route(&p.cur)
						if err != nil {
							s.err = fmt.Errorf("%w, at %.3fs simulated", err, s.now.Seconds())
							return
						}
						o.cur = i
					}
					p.routed = true
				}
				q := o.queues[o.cur]
				if !s.offer(q, p.cur) {
					s.setState(p, blocked)
					q.blocked = append(q.blocked, p)
					return
				}
				p.sendIdx, p.routed = p.sendIdx+1, false
			}
			if len(p.outs) > 0 {
				p.out++
			}
			s.setState(p, busy)
			p.phase = phaseStart
		}
	}
}

// serve starts one service time.
func (s *sim) serve(p *proc) {
	var d time.Duration
	if p.nextAt != nil {
		// A simulation with its sources scaled down (maxItems) reaches
		// a change of cost as far into the run as the full one does.
		d = p.nextAt(time.Duration(float64(s.now)*s.scale), int64(float64(p.st.started)*s.scale))
	} else {
		d = p.next()
	}
	p.st.started++
	s.setState(p, busy)
	p.service = append(p.service, d.Seconds())
	p.phase = phaseServed
	s.schedule(s.now+d, p, false)
}

// take gives p an item from its live inputs; eof once all have ended.
func (s *sim) take(p *proc) (got, eof bool) {
	if p.handoff {
		p.handoff = false
		return true, false
	}
	for i := 0; i < len(p.inputs); {
		q := p.inputs[i]
		if q.depth() > 0 {
			p.cur = q.pop(s)
			s.unblock(q)
			return true, false
		}
		if q.producersLeft == 0 {
			p.inputs = append(p.inputs[:i], p.inputs[i+1:]...)
			continue
		}
		i++
	}
	return false, len(p.inputs) == 0
}

// offer puts an item on q, or hands it to a waiting consumer; false when
// q is full.
func (s *sim) offer(q *squeue, it item) bool {
	if len(q.waiters) > 0 {
		w := q.waiters[0]
		s.stopWaiting(w)
		w.cur, w.handoff = it, true
		q.produced++
		q.consumed++
		s.runnable = append(s.runnable, w)
		return true
	}
	if q.depth() >= q.cap || (q.capBytes > 0 && q.bytes > 0 && q.bytes+it.size > q.capBytes) {
		return false
	}
	q.push(s, it)
	return true
}

// unblock lets producers blocked on q put their items in as room frees.
func (s *sim) unblock(q *squeue) {
	for len(q.blocked) > 0 {
		b := q.blocked[0]
		if q.depth() >= q.cap || (q.capBytes > 0 && q.bytes > 0 && q.bytes+b.cur.size > q.capBytes) {
			return
		}
		q.blocked = q.blocked[1:]
		q.push(s, b.cur)
		b.sendIdx, b.routed = b.sendIdx+1, false
		s.runnable = append(s.runnable, b)
	}
}

func (s *sim) stopWaiting(w *proc) {
	for _, q := range w.waiting {
		for i, x := range q.waiters {
			if x == w {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				break
			}
		}
	}
	w.waiting = w.waiting[:0]
}

// arrive joins the stage's sync step; true when p completes it.
func (s *sim) arrive(p *proc) bool {
	st := p.st
	st.arrived = append(st.arrived, p)
	if len(st.arrived) < st.members {
		return false
	}
	s.release(st, p)
	return true
}

// release lets every replica waiting at the step go, except self, which
// is already running.
func (s *sim) release(st *sstage, self *proc) {
	for _, a := range st.arrived {
		if a != self {
			s.runnable = append(s.runnable, a)
		}
	}
	st.arrived = st.arrived[:0]
}

func (s *sim) leave(p *proc) {
	st := p.st
	if !st.sync || p.left {
		return
	}
	p.left = true
	st.members--
	if len(st.arrived) > 0 && len(st.arrived) >= st.members {
		s.release(st, nil)
	}
}

// finish ends a replica: its queues lose a producer.
func (s *sim) finish(p *proc) {
	s.setState(p, done)
	p.end = s.now
	for _, o := range p.outs {
		for _, q := range o.queues {
			q.producerDone(s, p.idx)
		}
	}
}

func (q *squeue) depth() int { return len(q.buf) - q.head }

func (q *squeue) account(s *sim) {
	q.area += float64(q.depth()) * (s.now - q.last).Seconds()
	q.last = s.now
}

func (q *squeue) push(s *sim, it item) {
	q.account(s)
	q.buf = append(q.buf, it)
	q.bytes += it.size
	q.produced++
	q.maxDepth = max(q.maxDepth, q.depth())
}

func (q *squeue) pop(s *sim) item {
	q.account(s)
	it := q.buf[q.head]
	q.head++
	if q.head > 1024 && q.head*2 > len(q.buf) {
		q.buf = append(q.buf[:0], q.buf[q.head:]...)
		q.head = 0
	}
	q.bytes -= it.size
	q.consumed++
	return it
}

func (q *squeue) producerDone(s *sim, replica int) {
	for i, p := range q.producers {
		if p == replica {
			q.live[i] = false
		}
	}
	q.producersLeft--
	if q.producersLeft == 0 && q.depth() == 0 {
		for _, w := range append([]*proc(nil), q.waiters...) {
			s.stopWaiting(w)
			s.runnable = append(s.runnable, w)
		}
	}
}

func (q *squeue) index() int {
	for i, x := range q.e.queues {
		if x == q {
			return i
		}
	}
	return 0
}

// lognormal draws with a given mean and log-space sigma.
func lognormal(mean time.Duration, sigma float64, r *rand.Rand) func() time.Duration {
	mu := math.Log(float64(mean)) - sigma*sigma/2
	return func() time.Duration {
		if mean <= 0 {
			return 0
		}
		return time.Duration(math.Exp(mu + sigma*r.NormFloat64()))
	}
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func sortedCopy(xs []float64) []float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s
}
