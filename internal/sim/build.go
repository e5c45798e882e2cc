package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

func build(g *graph.Graph, opts Options) (*sim, error) {
	if opts.Registry == nil {
		opts.Registry = nodes.Default
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	s := &sim{g: g, opts: opts, scale: 1}
	byName := map[string]*sstage{}
	for si, gs := range g.Stages {
		st, err := s.buildStage(gs, uint64(si))
		if err != nil {
			return nil, err
		}
		s.stages = append(s.stages, st)
		byName[gs.Name] = st
	}
	s.scaleSources()
	if opts.Rebalance && g.Rebalance != nil {
		inner := opts
		inner.Rebalance, inner.Moved, inner.Interval, inner.Observe = false, nil, 0, nil
		s.rb = NewRebalancer(g, inner)
	}
	for _, ge := range g.Edges {
		e := &sedge{g: ge}
		for _, gq := range ge.Queues {
			q := &squeue{e: e, cap: ge.Capacity, capBytes: ge.CapacityBytes,
				producers: slices.Clone(gq.Producers), consumers: slices.Clone(gq.Consumers),
				producersLeft: len(gq.Producers), live: make([]bool, len(gq.Producers))}
			for i := range q.live {
				q.live[i] = true
			}
			e.queues = append(e.queues, q)
		}
		from, to := byName[ge.From.Stage.Name], byName[ge.To.Stage.Name]
		for i, p := range from.procs {
			o := &sout{route: ge.Policy.Router(ge, i)}
			for _, qi := range ge.ProducerQueues(i) {
				o.queues = append(o.queues, e.queues[qi])
			}
			p.outs = append(p.outs, o)
		}
		for i, p := range to.procs {
			p.inputs = append(p.inputs, e.queues[ge.ConsumerQueue(i)])
		}
		s.edges = append(s.edges, e)
	}
	return s, nil
}

// buildStage picks the stage's service model: measured (Options.From),
// else the node's own model, else the stage's sim block.
func (s *sim) buildStage(gs *graph.Stage, si uint64) (*sstage, error) {
	st := &sstage{g: gs, source: len(gs.Inputs) == 0, members: gs.Replicas, metrics: map[string]float64{}}
	spec, _ := s.opts.Registry.Spec(gs.Node)
	var model *nodes.SimModel
	if spec != nil && spec.Sim != nil {
		m, err := spec.Sim(gs.Config)
		if err != nil {
			return nil, fmt.Errorf("stage %q (%s): %w", gs.Name, gs.Node, err)
		}
		model = m
	}
	if model != nil {
		st.sync, st.failAfter = model.Sync, model.FailAfter
	}
	if spec != nil && spec.Sync != nil && gs.Replicas > 1 {
		st.sync = st.sync || spec.Sync(gs.Config)
	}
	if spec != nil && spec.Total != nil {
		st.total = spec.Total(gs.Config)
	}
	share := evenShare
	if model != nil && st.source {
		st.itemBytes = model.ItemBytes
		if model.Keys != nil {
			st.key = model.Keys(gs.Replicas)
		}
		if model.Share != nil {
			share = model.Share
		}
	}
	measured, hasMeasured := measuredStage(s.opts.From, gs.Name)
	if st.source && hasMeasured && st.total == 0 {
		for _, r := range measured.Replicas {
			st.total += r.ItemsOut
		}
	}
	if s.opts.probe {
		st.failAfter = 0
		if st.source {
			if st.total == 0 || st.total > probeMaxItems {
				st.total = max(min(st.total, probeMaxItems), probeItems(s.g))
			}
		}
	}
	if st.source && st.total == 0 {
		return nil, fmt.Errorf("stage %q (%s): a source must say how many items it emits to be simulated (node kind without a total, and no --from report)", gs.Name, gs.Node)
	}
	// newProc makes replica i with its service model: those of the
	// spec's replicas, and those a rebalance starts.
	st.newProc = func(i int) (*proc, error) {
		p := &proc{st: st, idx: i}
		rng := rand.New(rand.NewPCG(s.opts.Seed, si<<20|uint64(i)))
		switch fixed, isFixed := s.opts.fixed[gs.Name]; {
		case isFixed:
			p.next = func() time.Duration { return fixed }
		case hasMeasured:
			mean, sigma := s.measuredService(measured, si, i)
			p.next = lognormal(mean, sigma, rng)
		case model != nil && model.ServiceAt != nil:
			p.nextAt = model.ServiceAt(gs.Name, i)
		case model != nil:
			p.next = model.Service(gs.Name, i)
		case gs.Sim != nil:
			d, err := graph.ParseDistribution(gs.Sim.ServiceTime)
			if err != nil {
				return nil, fmt.Errorf("stage %q: sim service_time: %w", gs.Name, err)
			}
			p.next = func() time.Duration { return d.Sample(rng) }
		case s.opts.probe:
			p.next = func() time.Duration { return probeService }
		default:
			return nil, fmt.Errorf("stage %q: node kind %q has no simulation model; give the stage a sim { service_time = \"40ms\" } block, or simulate --from a report of a real run", gs.Name, gs.Node)
		}
		return p, nil
	}
	for i := 0; i < gs.Replicas; i++ {
		p, err := st.newProc(i)
		if err != nil {
			return nil, err
		}
		st.procs = append(st.procs, p)
	}
	st.share = share
	st.split()
	return st, nil
}

// split gives a source's replicas their shares of its total.
func (st *sstage) split() {
	if st.source {
		for i, p := range st.procs {
			p.remaining = st.share(st.total, i, len(st.procs))
		}
	}
}

// scaleSources scales every source's total down by one factor, so that
// none emits more than opts.maxItems, and records the factor in s.scale.
// A run long enough to need it is in its steady state for most of its
// items, so its wall time scales with them.
func (s *sim) scaleSources() {
	var most int64
	for _, st := range s.stages {
		if st.source {
			most = max(most, st.total)
		}
	}
	if s.opts.maxItems <= 0 || most <= s.opts.maxItems {
		return
	}
	s.scale = float64(most) / float64(s.opts.maxItems)
	for _, st := range s.stages {
		if st.source {
			st.total = max(1, int64(math.Round(float64(st.total)/s.scale)))
			st.split()
		}
	}
}

// evenShare is how many of total items replica i of n sources emits when
// the node's model does not say (nodes.SimModel.Share): an even split,
// the first total%n replicas one more.
func evenShare(total int64, i, n int) int64 {
	s := total / int64(n)
	if int64(i) < total%int64(n) {
		s++
	}
	return s
}

// measuredStage returns a stage's figures from a measured report.
func measuredStage(from *report.Report, name string) (report.Stage, bool) {
	if from == nil {
		return report.Stage{}, false
	}
	st, ok := from.Stages[name]
	return st, ok && len(st.Replicas) > 0
}

// observe adds a series point at a tick and calls Observe.
func (s *sim) observe() {
	snap := s.snapshot()
	s.series = append(s.series, snap.Sample(s.prev))
	s.prev = snap
	if s.opts.Observe != nil {
		s.opts.Observe(snap)
	}
}

// snapshot renders the simulation's state as the runtime's snapshot, so
// the status line, series and Prometheus code serve both.
func (s *sim) snapshot() *report.Snapshot {
	snap := &report.Snapshot{Elapsed: s.now}
	if s.rb != nil {
		snap.Moves = append([]report.Move(nil), s.moves...)
	}
	for _, st := range s.stages {
		ss := report.StageSnapshot{Name: st.g.Name, Node: st.g.Node, Source: st.source, Total: st.total, Metrics: st.metrics,
			Rebalanced: s.rb != nil && s.g.Rebalanced(st.g.Name)}
		for _, p := range st.procs {
			acc := p.acc
			if p.state != done {
				acc[p.state] += s.now - p.since
			}
			ss.Replicas = append(ss.Replicas, report.ReplicaSnapshot{ItemsIn: p.in, ItemsOut: p.out,
				Busy: acc[busy], Idle: acc[idle], Blocked: acc[blocked], Done: p.state == done, Left: p.retiring || p.retired})
		}
		snap.Stages = append(snap.Stages, ss)
	}
	for _, e := range s.edges {
		es := report.EdgeSnapshot{Name: e.g.Name, Policy: e.g.Policy, Capacity: e.g.Capacity,
			From: e.g.From.Stage.Name, To: e.g.To.Stage.Name}
		for _, q := range e.queues {
			es.Produced += q.produced
			es.Consumed += q.consumed
			qs := report.QueueSnapshot{Depth: q.depth(), Producers: q.producers, Consumers: q.consumers}
			for j, live := range q.live {
				if live {
					qs.Open = append(qs.Open, q.producers[j])
				}
			}
			es.Queues = append(es.Queues, qs)
		}
		snap.Edges = append(snap.Edges, es)
	}
	return snap
}

// report writes the simulation's figures in the run report's schema.
func (s *sim) report() *report.Report {
	rep := &report.Report{Spec: s.g.Filename, Status: report.OK, Simulated: true, WallSeconds: s.now.Seconds(),
		Stages: map[string]report.Stage{}, Edges: map[string]report.Edge{},
		Series: append([]report.Sample{}, s.series...), Diagnosis: []string{}, Moves: s.moves}
	if s.err != nil {
		rep.Status, rep.Error = report.Failed, s.err.Error()
	}
	for _, st := range s.stages {
		rs := report.Stage{Node: st.g.Node, Metrics: map[string]float64{}}
		for _, p := range st.procs {
			acc := p.acc
			if p.state != done {
				acc[p.state] += s.now - p.since
			}
			r := report.Replica{Index: p.idx, Device: st.g.Device(p.idx), ItemsIn: p.in, ItemsOut: p.out,
				BusySeconds: acc[busy].Seconds(), IdleSeconds: acc[idle].Seconds(), BlockedSeconds: acc[blocked].Seconds()}
			r.Utilization = report.Utilization(r.BusySeconds, r.IdleSeconds, r.BlockedSeconds)
			sorted := sortedCopy(p.service)
			if n := len(sorted); n > 0 {
				var sum float64
				for _, x := range sorted {
					sum += x
				}
				r.ServiceSeconds = report.Summary{Mean: sum / float64(n), P50: quantile(sorted, 0.5), P99: quantile(sorted, 0.99)}
			}
			rs.Replicas = append(rs.Replicas, r)
		}
		rep.Stages[st.g.Name] = rs
	}
	for _, e := range s.edges {
		re := report.Edge{From: e.g.From.Stage.Name, To: e.g.To.Stage.Name, Policy: string(e.g.Policy), Capacity: e.g.Capacity, CapacityBytes: e.g.CapacityBytes}
		for _, q := range e.queues {
			q.account(s)
			re.Produced += q.produced
			re.Consumed += q.consumed
			rq := report.Queue{Producers: q.producers, Consumers: q.consumers, MaxDepth: int64(q.maxDepth)}
			if s.now > 0 {
				rq.MeanDepth = q.area / s.now.Seconds()
			}
			re.Queues = append(re.Queues, rq)
		}
		rep.Edges[e.g.Name] = re
	}
	rep.SetOrder(s.g.Names())
	return rep
}
