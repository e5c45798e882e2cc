package cluster

// The coordinator's figures: the shares' snapshots and reports merged
// into the run's, a lost share's counts as it committed them.

import (
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

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
	v := shareView{snaps: snaps, byName: byName, lost: lost}
	for si, st := range tmpl.Stages {
		out.Stages = append(out.Stages, c.mergeStage(v, si, st))
	}
	for ei, e := range tmpl.Edges {
		out.Edges = append(out.Edges, c.mergeEdge(v, ei, e))
	}
	for _, s := range snaps {
		out.Draining = out.Draining || s.Draining
	}
	return out
}

// shareView is what merge reads of the shares: the latest snapshots of
// those not lost (by name too), and the lost ones.
type shareView struct {
	snaps  []*report.Snapshot
	byName map[string]*report.Snapshot
	lost   []*instance
}

// mergeStage merges stage si of the shares' snapshots (c.mu held): each
// replica's figures from the share that runs it, plus what lost shares
// did, and the stage's node metrics.
func (c *Coordinator) mergeStage(v shareView, si int, st report.StageSnapshot) report.StageSnapshot {
	byName, lost := v.byName, v.lost
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
	return ms
}

// mergeEdge merges edge ei of the shares' snapshots (c.mu held): the
// counts added up, a lost share's as it committed, each queue's depth the
// largest any share read.
func (c *Coordinator) mergeEdge(v shareView, ei int, e report.EdgeSnapshot) report.EdgeSnapshot {
	snaps, lost := v.snaps, v.lost
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
	return me
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
	for _, s := range c.g.Stages {
		rep.Stages[s.Name] = c.mergedStage(s, byName, byLedger)
	}
	for _, e := range c.g.Edges {
		rep.Edges[e.Name] = c.mergedEdge(e, reps, byLedger)
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

// mergedStage is stage s of the final report (c.mu held): each replica
// from the report of the share that ran it last, with what lost shares
// did before, named by its worker ("a>b" after a restart); a restartable
// stage's items by the ledger (byLedger); the node metrics merged.
func (c *Coordinator) mergedStage(s *graph.Stage, byName map[string]*report.Report, byLedger bool) report.Stage {
	st := report.Stage{Node: s.Node}
	st.Metrics, _, _ = c.stageMetrics(s)
	for i := range s.Replicas {
		inst := c.place[s.Name][i]
		r := report.Replica{Index: i, Device: s.Device(i)}
		if own := byName[inst]; own != nil && i < len(own.Stages[s.Name].Replicas) {
			r = own.Stages[s.Name].Replicas[i]
		}
		r.Worker = inst
		if in := c.instances[inst]; in != nil {
			r.Worker = in.worker
		}
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
	return st
}

// mergedEdge is edge e of the final report (c.mu held): the shares'
// counts added up with what lost shares committed, a restartable side's
// by the ledger (byLedger), each queue's depth the largest any share saw.
func (c *Coordinator) mergedEdge(e *graph.Edge, reps []*report.Report, byLedger bool) report.Edge {
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
	return re
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
