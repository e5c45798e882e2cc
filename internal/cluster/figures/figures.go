package figures

import (
	"slices"
	"sort"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Share is one share of a run, a worker's or a restart's, as the
// coordinator knows it.
type Share struct {
	Name, Worker string
	Lost         bool
	// Report is its report, once it is done (nil: none).
	Report *report.Report
	// Last is its latest snapshot (nil: none yet), LastAt when the
	// coordinator had it (its clock).
	Last   *report.Snapshot
	LastAt time.Time
	// Ran lists, once it is lost, the replicas it ran: stage -> indices.
	Ran map[string][]int
}

// Run is what the figures read of a run: what the coordinator knows of
// it. The coordinator builds it, and the figures read it, while it holds
// its lock; the figures keep nothing of it.
type Run struct {
	Graph    *graph.Graph
	Registry *nodes.Registry
	// Place is where each replica runs: stage -> share per replica.
	Place map[string][]string
	// Remote says which queues ride a stream, Chained which edges are
	// chains' (control.Place).
	Remote  map[string][]bool
	Chained map[string]bool
	// Start is when the run started (zero: not yet).
	Start time.Time
	// Shares are the run's shares, by name.
	Shares []*Share
	Series []report.Sample
	// End is what was read of the streams and records as the run ended.
	End End
}

// End is what the coordinator read of the run's streams and records once
// every share was done.
type End struct {
	// Depth is each remote queue's depth then (unread), by edge and queue
	// index (Unread).
	Depth map[[2]int]int
	// Streams are the edges' streams' totals, read once a run completed
	// or drained (nil: not read; the run was cut short). ReadEnd.
	Streams map[string]Stream
	// Chains are every share's chain record, Twice what heads settled
	// twice derived, by edge (wire.ChainTwice). ReadEnd.
	Chains map[string]wire.ChainRecord
	Twice  map[string]int64
}

// share is the share named (nil: none).
func (r *Run) share(name string) *Share {
	for _, sh := range r.Shares {
		if sh.Name == name {
			return sh
		}
	}
	return nil
}

// Snapshot is the run's snapshot at now, merged from the shares' latest:
// a lost one's counts are those of its last snapshot (lostReplica,
// lostEdge).
func Snapshot(r *Run, now time.Time) *report.Snapshot {
	out := &report.Snapshot{Time: now}
	if !r.Start.IsZero() {
		out.Elapsed = now.Sub(r.Start)
	}
	var tmpl *report.Snapshot
	var snaps []*report.Snapshot // the shares not lost
	byName := map[string]*report.Snapshot{}
	at := map[string]time.Time{}
	var lost []*Share
	for _, in := range r.Shares {
		if in.Lost {
			lost = append(lost, in)
		}
		if in.Last == nil {
			continue
		}
		if tmpl == nil {
			tmpl = in.Last
		}
		if !in.Lost {
			snaps = append(snaps, in.Last)
			byName[in.Name], at[in.Name] = in.Last, in.LastAt
		}
	}
	if tmpl == nil {
		return out
	}
	v := shareView{snaps: snaps, byName: byName, at: at, lost: lost}
	for si, st := range tmpl.Stages {
		out.Stages = append(out.Stages, mergeStage(r, v, si, st))
	}
	for ei, e := range tmpl.Edges {
		out.Edges = append(out.Edges, mergeEdge(r, v, ei, e))
	}
	for _, s := range snaps {
		out.Draining = out.Draining || s.Draining
	}
	return out
}

// shareView is what Snapshot reads of the shares: the latest snapshots of
// those not lost (by name too, with when the coordinator had each), and
// the lost ones.
type shareView struct {
	snaps  []*report.Snapshot
	byName map[string]*report.Snapshot
	at     map[string]time.Time
	lost   []*Share
}

// mergeStage merges stage si of the shares' snapshots: each replica's
// figures from the share that runs it, plus what lost shares did, and the
// stage's node metrics.
func mergeStage(run *Run, v shareView, si int, st report.StageSnapshot) report.StageSnapshot {
	byName, lost := v.byName, v.lost
	gs := run.Graph.Stage(st.Name)
	ms := report.StageSnapshot{Name: st.Name, Node: st.Node, Source: st.Source, Total: st.Total}
	var repMetrics []map[string]report.Metric
	if gs != nil {
		ms.Metrics, ms.Counters, repMetrics = stageMetrics(run, gs)
	}
	for i := range st.Replicas {
		r := st.Replicas[i]
		if s := byName[run.Place[st.Name][i]]; s != nil && si < len(s.Stages) && i < len(s.Stages[si].Replicas) {
			r = s.Stages[si].Replicas[i]
		} else {
			r.ItemsIn, r.ItemsOut = 0, 0
		}
		if i < len(repMetrics) {
			r.Metrics = repMetrics[i]
		}
		if in := run.share(run.Place[st.Name][i]); in != nil {
			r.Worker = in.Worker
		}
		for _, in := range lost {
			if gs != nil {
				if lr, ok := lostReplica(in, gs, i); ok {
					r = r.Plus(lr)
					if in.Name != run.Place[st.Name][i] {
						r.Worker = in.Worker + ">" + r.Worker
					}
				}
			}
		}
		ms.Replicas = append(ms.Replicas, r)
	}
	return ms
}

// mergeEdge merges edge ei of the shares' snapshots: the
// counts added up, a lost share's as it last said, each queue's depth as
// the share that runs one of its ends and said last read it (the largest
// any share read where none of those has said), or, once every share is
// done, a remote queue's as its stream has it then.
func mergeEdge(r *Run, v shareView, ei int, e report.EdgeSnapshot) report.EdgeSnapshot {
	snaps, lost := v.snaps, v.lost
	me := e.Empty()
	for _, s := range snaps {
		if ei < len(s.Edges) {
			me = me.Plus(s.Edges[ei])
		}
	}
	if ge := r.Graph.Edge(e.Name); ge != nil {
		for _, in := range lost {
			p, n := lostEdge(in, ge)
			me.Produced += p
			me.Consumed += n
		}
		for qi := range me.Queues {
			if d, ok := latestDepth(r, v, ge, ei, qi); ok {
				me.Queues[qi].Depth = d
			}
		}
	}
	return me
}

// latestDepth is queue qi of edge e (the ei-th) as the latest snapshot
// (by the coordinator's clock) of a share that runs one of its producers
// or consumers read it. A share done has said its last, as it ended: a
// producer's share done early read the queue full, and its consumers'
// shares, later, empty; the largest reading kept the first, and the run's
// last status line showed queues full at its end.
func latestDepth(r *Run, v shareView, e *graph.Edge, ei, qi int) (int, bool) {
	if qi >= len(e.Queues) {
		return 0, false
	}
	if d, ok := r.End.Depth[[2]int{ei, qi}]; ok {
		return d, true // every share done: as the stream has it
	}
	at := map[string]bool{}
	for _, p := range e.Queues[qi].Producers {
		if p < len(r.Place[e.From.Stage.Name]) {
			at[r.Place[e.From.Stage.Name][p]] = true
		}
	}
	for _, c := range e.Queues[qi].Consumers {
		if c < len(r.Place[e.To.Stage.Name]) {
			at[r.Place[e.To.Stage.Name][c]] = true
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
// snapshot: each replica's as the shares that ran it saw them (a lost
// share, then the one that took over), then over the replicas by each
// metric's rule, as one process merges them.
func stageMetrics(r *Run, s *graph.Stage) (values map[string]float64, counters map[string]bool, replicas []map[string]report.Metric) {
	kind, _ := r.Registry.Kind(s.Node)
	replicas = make([]map[string]report.Metric, s.Replicas)
	for i := range replicas {
		var seen []map[string]report.Metric
		for _, in := range r.Shares {
			if ss := in.Last.Stage(s.Name); ss != nil && i < len(ss.Replicas) {
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
func lostReplica(in *Share, s *graph.Stage, i int) (r report.ReplicaSnapshot, ok bool) {
	if !slices.Contains(in.Ran[s.Name], i) {
		return r, false
	}
	if ss := in.Last.Stage(s.Name); ss != nil && i < len(ss.Replicas) {
		r = ss.Replicas[i]
	}
	return r, true
}

// lostEdge is what the lost share in produced and consumed on e, as its
// last snapshot had it.
func lostEdge(in *Share, e *graph.Edge) (produced, consumed int64) {
	if in.Last == nil {
		return 0, 0
	}
	for _, es := range in.Last.Edges {
		if es.Name == e.Name {
			return es.Produced, es.Consumed
		}
	}
	return 0, 0
}

// Report is the run's report, merged from the shares' reports, and the
// run's error: err, or, where the report of a run that would end ok does
// not balance, its books' (checkBooks; the report then says failed). A
// run that completed (or drained) counts by the streams where they know
// (r.End.Streams): an item done twice (its worker lost before it was
// settled) is counted once. A run cut short counts what the engines saw.
func Report(r *Run, status string, err error) (*report.Report, error) {
	rep := merged(r, status, err)
	return rep, checkBooks(r, rep, err)
}

// merged is the run's report, its books not checked.
func merged(r *Run, status string, err error) *report.Report {
	totals := r.End.Streams
	now := time.Now()
	rep := &report.Report{Spec: r.Graph.Filename, Stages: map[string]report.Stage{}, Edges: map[string]report.Edge{},
		Series: r.Series, Diagnosis: []string{}, Started: r.Start.Round(0), WallSeconds: now.Sub(r.Start).Seconds()}
	if rep.Series == nil {
		rep.Series = []report.Sample{}
	}
	var reps []*report.Report
	byName := map[string]*report.Report{}
	worst := report.OK
	for _, in := range r.Shares {
		if in.Report != nil {
			reps = append(reps, in.Report)
			byName[in.Name] = in.Report
			worst = report.Worst(worst, in.Report.Status)
		}
	}
	for _, e := range r.Graph.Edges {
		rep.Edges[e.Name] = mergedEdge(r, e, reps)
	}
	for _, s := range r.Graph.Stages {
		rep.Stages[s.Name] = mergedStage(r, s, byName, totals != nil, rep.Edges)
	}
	rep.SetOrder(r.Graph.Names())
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

// mergedStage is stage s of the final report: each replica
// from the report of the share that runs it last, with what lost shares
// did before (named by its worker, "a>b" after a restart), and the node
// metrics merged. Over, a restartable stage's lost replicas are settled
// against its edges (settleLost).
func mergedStage(run *Run, s *graph.Stage, byName map[string]*report.Report, over bool, edges map[string]report.Edge) report.Stage {
	st := report.Stage{Node: s.Node}
	st.Metrics, _, _ = stageMetrics(run, s)
	lostIn, lostOut := make([]int64, s.Replicas), make([]int64, s.Replicas)
	anyLost := false
	for i := range s.Replicas {
		inst := run.Place[s.Name][i]
		r := report.Replica{Index: i, Device: s.Device(i)}
		if own := byName[inst]; own != nil && i < len(own.Stages[s.Name].Replicas) {
			r = own.Stages[s.Name].Replicas[i]
		}
		r.Worker = inst
		if in := run.share(inst); in != nil {
			r.Worker = in.Worker
		}
		for _, in := range run.Shares {
			if !in.Lost {
				continue
			}
			if lr, ok := lostReplica(in, s, i); ok {
				r = r.Plus(lr)
				lostIn[i] += lr.ItemsIn
				lostOut[i] += lr.ItemsOut
				anyLost = true
				if in.Name != inst {
					r.Worker = in.Worker + ">" + r.Worker
				}
			}
		}
		st.Replicas = append(st.Replicas, r)
	}
	if over && anyLost && wire.Restartable(run.Registry, s) {
		settleLost(run.Graph, s, st.Replicas, lostIn, lostOut, edges)
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
func settleLost(g *graph.Graph, s *graph.Stage, reps []report.Replica, lostIn, lostOut []int64, edges map[string]report.Edge) {
	var took, sent int64
	ports := map[string]bool{}
	for _, e := range g.Edges {
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

// mergedEdge is edge e of the final report: the shares' counts added up
// with what lost shares last said, or, where its stream knows
// (r.End.Streams), what the stream stored and what of it was consumed
// (one figure, not two, once Unread has found every stream empty: the
// books, books.go, set it against the stages' counts); each queue's depth
// the largest any share saw.
func mergedEdge(r *Run, e *graph.Edge, reps []*report.Report) report.Edge {
	totals := r.End.Streams
	re := report.Edge{Policy: string(e.Policy), Capacity: e.Capacity, CapacityBytes: e.CapacityBytes,
		Carried: control.Carried(e, r.Place, r.Remote[e.Name], r.Chained[e.Name])}
	for _, q := range e.Queues {
		re.Queues = append(re.Queues, report.Queue{Producers: q.Producers, Consumers: q.Consumers})
	}
	for _, sr := range reps {
		if ed, ok := sr.Edges[e.Name]; ok {
			re = re.Plus(ed)
		}
	}
	byChains := totals != nil && r.Chained[e.Name] // a run that completed
	for _, in := range r.Shares {
		rec := r.End.Chains[in.Name]
		switch {
		case byChains && in.Lost:
			// what it settled, as it recorded it (package settle's chain.go)
			re.Produced += rec.Committed[e.Name]
			re.Consumed += rec.Committed[e.Name]
		case byChains:
			// what it did again of a lost share's recorded heads
			re.Produced -= rec.Recounted[e.Name]
			re.Consumed -= rec.Recounted[e.Name]
		case in.Lost:
			p, n := lostEdge(in, e)
			re.Produced += p
			re.Consumed += n
		}
	}
	if byChains {
		re.Produced -= r.End.Twice[e.Name]
		re.Consumed -= r.End.Twice[e.Name]
	}
	if t, ok := totals[e.Name]; ok {
		re.Produced, re.Consumed = t.Stored, t.Stored-t.Left
	}
	return re
}
