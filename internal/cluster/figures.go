package cluster

// The coordinator's figures: the shares' snapshots and reports merged
// into the run's; a lost share's counts as its last snapshot had them, and,
// once the run is over, as the streams say (streamTotals, settleLost).

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
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
			m, err := c.o.Conn.Request(wire.SubjSnap(run, in.name), nil, time.Second)
			if err != nil {
				return
			}
			s := &report.Snapshot{}
			if json.Unmarshal(m.Data, s) == nil {
				c.mu.Lock()
				in.last, in.lastAt = s, time.Now()
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
// counts are those of its last snapshot (lostReplica, lostEdge).
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
	at := map[string]time.Time{}
	var lost []*instance
	for _, in := range c.sortedInstances() {
		if in.lost {
			lost = append(lost, in)
		}
		if in.last == nil {
			continue
		}
		if tmpl == nil {
			tmpl = in.last
		}
		if !in.lost {
			snaps = append(snaps, in.last)
			byName[in.name], at[in.name] = in.last, in.lastAt
		}
	}
	if tmpl == nil {
		return out
	}
	v := shareView{snaps: snaps, byName: byName, at: at, lost: lost}
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
// those not lost (by name too, with when the coordinator had each), and
// the lost ones.
type shareView struct {
	snaps  []*report.Snapshot
	byName map[string]*report.Snapshot
	at     map[string]time.Time
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
					r = r.Plus(lr)
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
// counts added up, a lost share's as it last said, each queue's depth as
// the share that runs one of its ends and said last read it (the largest
// any share read where none of those has said), or, once every share is
// done, a remote queue's as its stream has it then.
func (c *Coordinator) mergeEdge(v shareView, ei int, e report.EdgeSnapshot) report.EdgeSnapshot {
	snaps, lost := v.snaps, v.lost
	me := e.Empty()
	for _, s := range snaps {
		if ei < len(s.Edges) {
			me = me.Plus(s.Edges[ei])
		}
	}
	if ge := c.g.Edge(e.Name); ge != nil {
		for _, in := range lost {
			p, n := c.lostEdge(in, ge)
			me.Produced += p
			me.Consumed += n
		}
		for qi := range me.Queues {
			if d, ok := c.latestDepth(v, ge, ei, qi); ok {
				me.Queues[qi].Depth = d
			}
		}
	}
	return me
}

// latestDepth is queue qi of edge e (the ei-th) as the latest snapshot
// (by the coordinator's clock) of a share that runs one of its producers
// or consumers read it (c.mu held). A share done has said its last, as it ended: a producer's share
// done early read the queue full, and its consumers' shares, later,
// empty; the largest reading kept the first, and the run's last status
// line showed queues full at its end.
func (c *Coordinator) latestDepth(v shareView, e *graph.Edge, ei, qi int) (int, bool) {
	if qi >= len(e.Queues) {
		return 0, false
	}
	if d, ok := c.endDepth[[2]int{ei, qi}]; ok {
		return d, true // every share done: as the stream has it
	}
	at := map[string]bool{}
	for _, p := range e.Queues[qi].Producers {
		if p < len(c.place[e.From.Stage.Name]) {
			at[c.place[e.From.Stage.Name][p]] = true
		}
	}
	for _, r := range e.Queues[qi].Consumers {
		if r < len(c.place[e.To.Stage.Name]) {
			at[c.place[e.To.Stage.Name][r]] = true
		}
	}
	var last *report.Snapshot
	var lastAt time.Time
	for name := range at {
		s := v.byName[name]
		if s == nil || ei >= len(s.Edges) || qi >= len(s.Edges[ei].Queues) {
			continue
		}
		if last == nil || v.at[name].After(lastAt) {
			last, lastAt = s, v.at[name]
		}
	}
	if last == nil {
		return 0, false
	}
	return last.Edges[ei].Queues[qi].Depth, true
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

// lostReplica is what replica i of s did in the lost share in, as its
// last snapshot had it; ok is false when in did not run the replica.
func (c *Coordinator) lostReplica(in *instance, s *graph.Stage, i int) (r report.ReplicaSnapshot, ok bool) {
	if !slices.Contains(in.ran[s.Name], i) {
		return r, false
	}
	if ss := in.last.Stage(s.Name); ss != nil && i < len(ss.Replicas) {
		r = ss.Replicas[i]
	}
	return r, true
}

// lostEdge is what the lost share in produced and consumed on e, as its
// last snapshot had it.
func (c *Coordinator) lostEdge(in *instance, e *graph.Edge) (produced, consumed int64) {
	if in.last == nil {
		return 0, 0
	}
	for _, es := range in.last.Edges {
		if es.Name == e.Name {
			return es.Produced, es.Consumed
		}
	}
	return 0, 0
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
	// A run that completed (or drained) counts by the streams where they
	// know: an item done twice (its worker lost before it was settled) is
	// counted once. A run cut short counts what the engines saw.
	var totals map[string]streamTotal
	if err == nil && status != report.Aborted {
		totals = c.streamTotals()
		c.readChains()
	}
	return c.mergedBy(status, err, totals)
}

// mergedBy is merged with the streams' figures read (totals: nil for a
// run cut short).
func (c *Coordinator) mergedBy(status string, err error, totals map[string]streamTotal) *report.Report {
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
	for _, in := range c.sortedInstances() {
		if in.rep != nil {
			reps = append(reps, in.rep)
			byName[in.name] = in.rep
			worst = report.Worst(worst, in.rep.Status)
		}
	}
	for _, e := range c.g.Edges {
		rep.Edges[e.Name] = c.mergedEdge(e, reps, totals)
	}
	for _, s := range c.g.Stages {
		rep.Stages[s.Name] = c.mergedStage(s, byName, totals != nil, rep.Edges)
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
// from the report of the share that runs it last, with what lost shares
// did before (named by its worker, "a>b" after a restart), and the node
// metrics merged. Over, a restartable stage's lost replicas are settled
// against its edges (settleLost).
func (c *Coordinator) mergedStage(s *graph.Stage, byName map[string]*report.Report, over bool, edges map[string]report.Edge) report.Stage {
	st := report.Stage{Node: s.Node}
	st.Metrics, _, _ = c.stageMetrics(s)
	lostIn, lostOut := make([]int64, s.Replicas), make([]int64, s.Replicas)
	anyLost := false
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
				r = r.Plus(lr)
				lostIn[i] += lr.ItemsIn
				lostOut[i] += lr.ItemsOut
				anyLost = true
				if in.name != inst {
					r.Worker = in.worker + ">" + r.Worker
				}
			}
		}
		st.Replicas = append(st.Replicas, r)
	}
	if over && anyLost && c.restartable(s) {
		c.settleLost(s, st.Replicas, lostIn, lostOut, edges)
	}
	return st
}

// settleLost corrects what the lost shares did of restartable stage s
// (their last snapshots' counts, in lostIn and lostOut by replica) so that
// the stage's items add up to what its edges say it took and sent: an item
// a lost share took and had not settled was done again elsewhere (counted
// twice), and one it settled after its last snapshot is in no snapshot.
// The difference goes to the lost shares' part of the replicas, never
// below nothing, a replica's taking and sending together: first what the
// two differences share (an item taken and sent twice: by a replica and by
// its restart), to the largest lost parts; then what is left of either,
// to the replica whose lost part leans that way (a replica whose last
// snapshot had taken an item it had not sent yet, then done again by its
// restart, took one too many, not another replica). Apart, a replica could
// end taking one item less than it sent ("in=515 out=516"). The stage's
// counts then equal its edges' by construction: its books (books.go) see
// only a difference the lost parts could not take.
func (c *Coordinator) settleLost(s *graph.Stage, reps []report.Replica, lostIn, lostOut []int64, edges map[string]report.Edge) {
	var took, sent int64
	ports := map[string]bool{}
	for _, e := range c.g.Edges {
		if e.To.Stage == s {
			took += edges[e.Name].Consumed
		}
		if e.From.Stage == s && !ports[e.From.Name] {
			ports[e.From.Name] = true // one send on a port, whatever its edges
			sent += edges[e.Name].Produced
		}
	}
	var in, out int64
	for _, r := range reps {
		in += r.ItemsIn
		out += r.ItemsOut
	}
	lostIn, lostOut = slices.Clone(lostIn), slices.Clone(lostOut)
	// spread gives diff to the lost parts in order: a surplus (diff < 0)
	// taken from each in turn, never below nothing; a shortfall to the
	// first.
	spread := func(diff int64, lost []int64, order []int, set func(i int, d int64)) {
		for k, i := range order {
			d := diff
			if d < -lost[i] {
				d = -lost[i]
			}
			if d > 0 && k > 0 {
				d = 0
			}
			set(i, d)
			diff -= d
		}
	}
	// by lists the replicas by key, largest first (the larger lost part
	// first where equal, then by index)
	by := func(key func(i int) int64) []int {
		order := make([]int, len(reps))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool {
			i, j := order[a], order[b]
			if key(i) != key(j) {
				return key(i) > key(j)
			}
			return lostIn[i]+lostOut[i] > lostIn[j]+lostOut[j]
		})
		return order
	}
	dIn, dOut := took-in, int64(0)
	if len(ports) > 0 {
		dOut = sent - out
	}
	// both: what of the two differences goes to both counts of the same
	// replicas, as far as their lost parts share it (a surplus may find
	// less in common than it is: the rest goes below, with each count's)
	both := int64(0)
	switch {
	case dIn < 0 && dOut < 0:
		both = max(dIn, dOut)
	case dIn > 0 && dOut > 0:
		both = min(dIn, dOut)
	}
	if both != 0 {
		common := make([]int64, len(reps))
		for i := range common {
			common[i] = min(lostIn[i], lostOut[i])
		}
		applied := int64(0)
		spread(both, common, by(func(i int) int64 { return common[i] }), func(i int, d int64) {
			reps[i].ItemsIn += d
			reps[i].ItemsOut += d
			lostIn[i] += d
			lostOut[i] += d
			applied += d
		})
		both = applied
	}
	lean := func(a, b []int64, diff int64) []int {
		if diff < 0 { // took (or sent) too many: where the lost part has more of it
			return by(func(i int) int64 { return a[i] - b[i] })
		}
		return by(func(i int) int64 { return b[i] - a[i] })
	}
	if d := dIn - both; d != 0 {
		spread(d, lostIn, lean(lostIn, lostOut, d), func(i int, d int64) { reps[i].ItemsIn += d })
	}
	if d := dOut - both; d != 0 {
		spread(d, lostOut, lean(lostOut, lostIn, d), func(i int, d int64) { reps[i].ItemsOut += d })
	}
}

// streamTotal is what an edge's stream stored over the run, and stores
// still.
type streamTotal struct{ stored, left int64 }

// streamTotals reads the stream of every edge whose queues all ride one
// (nothing of theirs counted by an engine alone), by edge name: what
// every producer sent, duplicates dropped, and what is not yet consumed.
func (c *Coordinator) streamTotals() map[string]streamTotal {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]streamTotal{}
	for ei, e := range c.g.Edges {
		if slices.Contains(c.remote[e.Name], false) {
			continue
		}
		s, err := c.js.Stream(ctx, wire.StreamEdge(c.run, ei))
		if err != nil {
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			continue
		}
		out[e.Name] = streamTotal{stored: int64(info.State.LastSeq), left: int64(info.State.Msgs)}
	}
	return out
}

// mergedEdge is edge e of the final report (c.mu held): the shares'
// counts added up with what lost shares last said, or, where its stream
// knows (totals), what the stream stored and what of it was consumed
// (one figure, not two, once unread has found every stream empty: the
// books, books.go, set it against the stages' counts); each queue's depth
// the largest any share saw.
func (c *Coordinator) mergedEdge(e *graph.Edge, reps []*report.Report, totals map[string]streamTotal) report.Edge {
	re := report.Edge{Policy: string(e.Policy), Capacity: e.Capacity, CapacityBytes: e.CapacityBytes,
		Carried: control.Carried(e, c.place, c.remote[e.Name], c.chained[e.Name])}
	for _, q := range e.Queues {
		re.Queues = append(re.Queues, report.Queue{Producers: q.Producers, Consumers: q.Consumers})
	}
	for _, r := range reps {
		if ed, ok := r.Edges[e.Name]; ok {
			re = re.Plus(ed)
		}
	}
	byChains := totals != nil && c.chained[e.Name] // a run that completed
	for _, in := range c.instances {
		rec := c.chainRecs[in.name]
		switch {
		case byChains && in.lost:
			// what it settled, as it recorded it (chain.go)
			re.Produced += rec.Committed[e.Name]
			re.Consumed += rec.Committed[e.Name]
		case byChains:
			// what it did again of a lost share's recorded heads
			re.Produced -= rec.Recounted[e.Name]
			re.Consumed -= rec.Recounted[e.Name]
		case in.lost:
			p, n := c.lostEdge(in, e)
			re.Produced += p
			re.Consumed += n
		}
	}
	if byChains {
		re.Produced -= c.chainTwice[e.Name]
		re.Consumed -= c.chainTwice[e.Name]
	}
	if t, ok := totals[e.Name]; ok {
		re.Produced, re.Consumed = t.stored, t.stored-t.left
	}
	return re
}

// failed is the report of a run that could not start.
func (c *Coordinator) failed(err error) *report.Report {
	rep := c.merged(report.Failed, err)
	return rep
}
