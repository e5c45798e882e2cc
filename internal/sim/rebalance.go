package sim

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// This file is the rebalance policy (a graph's rebalance block): Decide,
// a pure function from what a look measured to the split to move to, and
// Rebalancer, which says when to look and fits the service times from a
// run's snapshots.

// Look is what one decision point knows.
type Look struct {
	// Elapsed is the time since the run's start.
	Elapsed time.Duration
	// Split is the replicas each rebalanced stage has now.
	Split map[string]int
	// Service is each rebalanced stage's service time of an item, as
	// fitted from the measurements (Fit).
	Service map[string]time.Duration
	// Done and Total are the items the sources have emitted so far and
	// will emit in all; Total 0: an open-ended run (the block's Horizon
	// is its time left).
	Done, Total int64
	// Moves are the moves made so far, for the hysteresis (Hold).
	Moves []report.Move
}

// Decision is the policy's answer at one look.
type Decision struct {
	// Move says to move to Split, as many replicas at once as that takes.
	Move  bool
	Split map[string]int
	// Transfers are the moves that make Split from the look's, one per
	// pair of stages, largest first.
	Transfers []report.Move
	// Rate and NewRate are the predicted items per second (at the
	// sources) at the look's split and at Split.
	Rate, NewRate float64
	// TimeLeft is the predicted time left at the look's split, and Saved
	// the time Split saves over it, the moves' cost taken off.
	TimeLeft, Saved time.Duration
	// Why says in words why it moves or stays.
	Why string
}

// Gain is the predicted share of the time left the decision saves.
func (d Decision) Gain() float64 {
	if d.TimeLeft <= 0 {
		return 0
	}
	return d.Saved.Seconds() / d.TimeLeft.Seconds()
}

// maxSplits bounds the splits Decide simulates at one look; a budget with
// more splits than that is searched by moves between two stages at a
// time from the current split.
const maxSplits = 256

// Decide is the rebalance policy at one look, for g (with a Rebalance)
// and the models of opts for the stages it does not move. It asks the
// simulator the rate of each split of the budget (every stage at least
// one replica), the rebalanced stages taking look.Service an item, and
// chooses the fastest. It moves there when the time that saves over the
// work left, less the moves' cost, is at least the block's MinGain of the
// time left: during MoveCost the moved replicas do nothing (the stages
// run at the rate of the replicas that stay), after it the new split's
// rate holds. Within Hold of a move it never moves a replica back (a
// stage that gained then does not lose now, nor one that lost gain). The
// work left is Total - Done at the sources; an open-ended run (Total 0)
// has Horizon left. Same inputs, same decision.
func Decide(g *graph.Graph, look Look, opts Options) Decision {
	r := g.Rebalance
	stages := r.Stages
	cur := maps.Clone(look.Split)
	d := Decision{Split: cur}
	for _, s := range stages {
		if look.Service[s] <= 0 {
			d.Why = fmt.Sprintf("no service time measured for stage %s yet", s)
			return d
		}
	}
	rates := map[string]float64{}
	rate := func(split map[string]int) float64 {
		k := splitKey(stages, split)
		if v, ok := rates[k]; ok {
			return v
		}
		v := predictRate(g, split, look.Service, opts)
		rates[k] = v
		return v
	}
	d.Rate = rate(cur)
	if d.Rate <= 0 {
		d.Why = "the simulator predicts no rate for the current split"
		return d
	}
	left := float64(look.Total - look.Done)
	d.TimeLeft = time.Duration(left / d.Rate * float64(time.Second))
	if look.Total <= 0 {
		d.TimeLeft = r.Horizon
		left = d.Rate * r.Horizon.Seconds()
	}
	if left <= 0 {
		d.Why = "no work left"
		return d
	}
	best, bestRate := cur, d.Rate
	for _, split := range candidates(stages, r.Replicas, cur) {
		if back := movesBack(look, split, r.Hold); back != "" {
			continue
		}
		if v := rate(split); v > bestRate*(1+1e-9) {
			best, bestRate = split, v
		}
	}
	d.NewRate = bestRate
	if splitKey(stages, best) == splitKey(stages, cur) {
		d.Why = fmt.Sprintf("the split %s is the fastest the simulator finds (%.1f items/s) that moves no replica back within %v", splitWords(stages, cur), d.Rate, r.Hold)
		return d
	}
	// During the move the replicas that stay work; the moved ones start.
	after := time.Duration(left / bestRate * float64(time.Second))
	if r.MoveCost > 0 {
		stay := map[string]int{}
		for _, s := range stages {
			stay[s] = min(cur[s], best[s])
		}
		during := min(rate(stay)*r.MoveCost.Seconds(), left)
		after = r.MoveCost + time.Duration((left-during)/bestRate*float64(time.Second))
	}
	d.Saved = d.TimeLeft - after
	d.Transfers = transfers(stages, cur, best)
	if d.Saved <= 0 || d.Gain() < r.MinGain {
		d.Why = fmt.Sprintf("%s would save %s of the %v left (%.1f -> %.1f items/s, moves costing %v), under min_gain %.0f%%",
			splitWords(stages, best), pct(d.Gain()), d.TimeLeft.Round(time.Millisecond), d.Rate, bestRate, r.MoveCost*time.Duration(moved(d.Transfers)), 100*r.MinGain)
		d.Split, d.Transfers = cur, nil
		return d
	}
	d.Move, d.Split = true, best
	d.Why = fmt.Sprintf("predicted %s over the %v left (%.1f -> %.1f items/s)", signedPct(d.Gain()), d.TimeLeft.Round(time.Millisecond), d.Rate, bestRate)
	return d
}

// predictRate simulates g at a split, the rebalanced stages taking
// service an item, and returns the sources' items per second.
func predictRate(g *graph.Graph, split map[string]int, service map[string]time.Duration, opts Options) float64 {
	var changes []graph.Change
	for _, s := range slices.Sorted(maps.Keys(split)) {
		changes = append(changes, graph.SetReplicas(s, split[s]))
	}
	v, diags := g.With(changes...)
	if diags.HasErrors() {
		return 0
	}
	opts.Interval, opts.Observe, opts.maxItems, opts.Rebalance = 0, nil, rateItems, false
	opts.fixed = service
	s, err := build(v, opts)
	if err != nil {
		return 0
	}
	if s.run(); s.err != nil || s.now <= 0 {
		return 0
	}
	var items int64
	for _, st := range s.stages {
		if st.source {
			for _, p := range st.procs {
				items += p.out
			}
		}
	}
	return float64(items) / s.now.Seconds()
}

// candidates lists the splits of n replicas over stages, each at least
// one, in a fixed order; more than maxSplits: those that move replicas
// between two stages from cur.
func candidates(stages []string, n int, cur map[string]int) []map[string]int {
	if count := binomial(n-1, len(stages)-1); count <= maxSplits {
		var out []map[string]int
		var rec func(i, left int, acc map[string]int)
		rec = func(i, left int, acc map[string]int) {
			if i == len(stages)-1 {
				acc[stages[i]] = left
				out = append(out, maps.Clone(acc))
				return
			}
			for k := 1; k <= left-(len(stages)-1-i); k++ {
				acc[stages[i]] = k
				rec(i+1, left-k, acc)
			}
		}
		rec(0, n, map[string]int{})
		return out
	}
	var out []map[string]int
	for _, from := range stages {
		for _, to := range stages {
			if from == to {
				continue
			}
			for k := 1; k < cur[from]; k++ {
				s := maps.Clone(cur)
				s[from] -= k
				s[to] += k
				out = append(out, s)
			}
		}
	}
	return out
}

func binomial(n, k int) int {
	if k < 0 || k > n {
		return 0
	}
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i
		if r > 1<<20 {
			return r
		}
	}
	return r
}

// movesBack names a move within hold that split would undo, or "".
func movesBack(look Look, split map[string]int, hold time.Duration) string {
	for _, m := range look.Moves {
		if look.Elapsed-time.Duration(m.T*float64(time.Second)) >= hold {
			continue
		}
		if split[m.To] < look.Split[m.To] || split[m.From] > look.Split[m.From] {
			return fmt.Sprintf("%s -> %s at %.1fs", m.From, m.To, m.T)
		}
	}
	return ""
}

// transfers turns the change from cur to next into moves between pairs of
// stages: the stages that lose give, in order, to those that gain, and
// the budget's spare replicas (From "") after them.
func transfers(stages []string, cur, next map[string]int) []report.Move {
	type delta struct {
		stage string
		n     int
	}
	var give, take []delta
	spare := 0
	for _, s := range stages {
		switch d := next[s] - cur[s]; {
		case d < 0:
			give = append(give, delta{s, -d})
		case d > 0:
			take = append(take, delta{s, d})
		}
		spare += next[s] - cur[s]
	}
	if spare > 0 { // replicas of the budget that no stage had
		give = append(give, delta{"", spare})
	}
	var out []report.Move
	for len(give) > 0 && len(take) > 0 {
		k := min(give[0].n, take[0].n)
		out = append(out, report.Move{From: give[0].stage, To: take[0].stage, Replicas: k})
		give[0].n -= k
		take[0].n -= k
		if give[0].n == 0 {
			give = give[1:]
		}
		if take[0].n == 0 {
			take = take[1:]
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Replicas > out[j].Replicas })
	return out
}

func moved(ts []report.Move) int {
	n := 0
	for _, t := range ts {
		n += t.Replicas
	}
	return n
}

func splitKey(stages []string, split map[string]int) string {
	var b strings.Builder
	for _, s := range stages {
		fmt.Fprintf(&b, "%d,", split[s])
	}
	return b.String()
}

// splitWords is "target 5 + drafter 3".
func splitWords(stages []string, split map[string]int) string {
	var parts []string
	for _, s := range stages {
		parts = append(parts, fmt.Sprintf("%s %d", s, split[s]))
	}
	return strings.Join(parts, " + ")
}

func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

func signedPct(x float64) string { return fmt.Sprintf("%+.0f%%", 100*x) }

// firstItems is how many items each rebalanced stage has served, over
// its replicas, when the first look comes, if that is before Every: a
// run that starts at a bad split leaves it after a few items, not a tenth
// of the run.
const firstItems = 8

// Rebalancer applies the policy to a run: Due says when a look is due,
// Look fits the service times from the snapshots since the last look and
// decides (Decide), and Moved records a move made. It is not safe for
// concurrent use.
type Rebalancer struct {
	g     *graph.Graph
	opts  Options
	split map[string]int
	// prev are the rebalanced stages' replicas at the last look, by
	// index: each look fits the service times of the window since.
	prev map[string][]report.ReplicaSnapshot
	// fit is the last fitted service time of each stage, kept when a
	// window measures nothing of it.
	fit    map[string]time.Duration
	looked bool
	last   time.Duration // the last look
	moves  []report.Move
	// at is the sources' progress at the last look, before at the one
	// before; open, the moves of the last look whose gain is measured
	// at the next (or at Finish)
	at, before progress
	open       *measure
}

// progress is how many items had gone through the rebalanced stages
// (the fewest any of them took in) at a time: their rate is the run's,
// and unlike the sources' it does not count the queues filling.
type progress struct {
	t    time.Duration
	done int64
}

// measure is a move's gain being measured: its moves (rb.moves[first:
// first+n]) and the sources' rate before it.
type measure struct {
	first, n int
	rate     float64
	from     progress
}

func rate(a, b progress) float64 {
	if b.t <= a.t {
		return 0
	}
	return float64(b.done-a.done) / (b.t - a.t).Seconds()
}

// through is the fewest items any rebalanced stage has taken in.
func (rb *Rebalancer) through(snap *report.Snapshot) int64 {
	least := int64(-1)
	for _, s := range rb.g.Rebalance.Stages {
		var n int64
		if ss := stageOf(snap, s); ss != nil {
			for _, r := range ss.Replicas {
				n += r.ItemsIn
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	return max(least, 0)
}

// measureTo closes the open measurement at now: the moves' measured gain
// is 1 less the rate before them over the rate since.
func (rb *Rebalancer) measureTo(now progress) {
	m := rb.open
	if m == nil {
		return
	}
	rb.open = nil
	after := rate(m.from, now)
	if m.rate <= 0 || after <= 0 {
		return
	}
	g := 1 - m.rate/after
	for i := m.first; i < m.first+m.n && i < len(rb.moves); i++ {
		rb.moves[i].MeasuredGain = &g
	}
}

// Finish measures the gain of the last moves up to snap, the run's end,
// and returns every move made.
func (rb *Rebalancer) Finish(snap *report.Snapshot) []report.Move {
	rb.measureTo(progress{snap.Elapsed, rb.through(snap)})
	return rb.Moves()
}

// NewRebalancer starts the policy for g (with a Rebalance) at its
// split; opts are the models of the stages it does not move.
func NewRebalancer(g *graph.Graph, opts Options) *Rebalancer {
	rb := &Rebalancer{g: g, opts: opts, split: map[string]int{}, prev: map[string][]report.ReplicaSnapshot{}, fit: map[string]time.Duration{}}
	for _, s := range g.Rebalance.Stages {
		rb.split[s] = g.Stage(s).Replicas
	}
	return rb
}

// Split is the split the policy last moved to (or started at).
func (rb *Rebalancer) Split() map[string]int { return maps.Clone(rb.split) }

// Moves are the moves recorded so far.
func (rb *Rebalancer) Moves() []report.Move { return slices.Clone(rb.moves) }

// Due reports whether a look is due at snap: Every after the last look,
// and the first as soon as each rebalanced stage has served firstItems
// items over its replicas (or at Every, whichever comes first).
func (rb *Rebalancer) Due(snap *report.Snapshot) bool {
	every := rb.g.Rebalance.Every
	if rb.looked {
		return snap.Elapsed-rb.last >= every
	}
	if snap.Elapsed >= every {
		return true
	}
	for _, s := range rb.g.Rebalance.Stages {
		ss := stageOf(snap, s)
		if ss == nil {
			return false
		}
		var n int64
		for _, r := range ss.Replicas {
			n += r.ItemsIn
		}
		if n < firstItems {
			return false
		}
	}
	return true
}

// Look fits each rebalanced stage's service time from the window since
// the last look (Fit) and decides. It does not move: the caller makes the
// decision's transfers and calls Moved.
func (rb *Rebalancer) Look(snap *report.Snapshot) Decision {
	rb.looked, rb.last = true, snap.Elapsed
	now := progress{snap.Elapsed, rb.through(snap)}
	rb.measureTo(now)
	rb.before, rb.at = rb.at, now
	look := Look{Elapsed: snap.Elapsed, Split: maps.Clone(rb.split), Service: map[string]time.Duration{}, Moves: rb.moves}
	for _, s := range rb.g.Rebalance.Stages {
		ss := stageOf(snap, s)
		if ss == nil {
			continue
		}
		if f, ok := Fit(rb.prev[s], ss.Replicas); ok {
			rb.fit[s] = f
		}
		look.Service[s] = rb.fit[s]
		rb.prev[s] = slices.Clone(ss.Replicas)
	}
	// A stage outside the rebalance that the simulator has no model of
	// (a built-in kind without one, as text_reader; no sim block) takes
	// its fitted time too, a source's over the items it emitted.
	for _, gs := range rb.g.Stages {
		if slices.Contains(rb.g.Rebalance.Stages, gs.Name) || rb.modelled(gs) {
			continue
		}
		ss := stageOf(snap, gs.Name)
		if ss == nil {
			continue
		}
		now := ss.Replicas
		if ss.Source {
			now = emitted(now)
		}
		if f, ok := Fit(rb.prev[gs.Name], now); ok {
			rb.fit[gs.Name] = max(f, time.Nanosecond)
		}
		if f, ok := rb.fit[gs.Name]; ok {
			look.Service[gs.Name] = f
		}
		rb.prev[gs.Name] = slices.Clone(now)
	}
	total := int64(0)
	open := false
	for _, ss := range snap.Stages {
		if !ss.Source {
			continue
		}
		for _, r := range ss.Replicas {
			look.Done += r.ItemsOut
		}
		if ss.Total <= 0 {
			open = true
		}
		total += ss.Total
	}
	if !open {
		look.Total = total
	}
	d := Decide(rb.g, look, rb.opts)
	if d.Move {
		reason := rb.reason(snap)
		for i := range d.Transfers {
			d.Transfers[i].T = snap.Elapsed.Seconds()
			d.Transfers[i].Reason = reason
			d.Transfers[i].PredictedGain = d.Gain()
		}
	}
	return d
}

// Moved records that the decision's transfers were made, at the last
// look: their gain is measured from the interval before that look to the
// one after it.
func (rb *Rebalancer) Moved(d Decision) {
	rb.open = &measure{first: len(rb.moves), n: len(d.Transfers), rate: rate(rb.before, rb.at), from: rb.at}
	rb.split = maps.Clone(d.Split)
	rb.moves = append(rb.moves, d.Transfers...)
}

// reason says how busy each rebalanced stage's replicas were, from the
// start: "target 100% busy, drafter 41%".
func (rb *Rebalancer) reason(snap *report.Snapshot) string {
	var parts []string
	for i, s := range rb.g.Rebalance.Stages {
		ss := stageOf(snap, s)
		if ss == nil {
			continue
		}
		var busy, life time.Duration
		for _, r := range ss.Replicas {
			busy += r.Busy
			life += r.Busy + r.Idle + r.Blocked
		}
		u := 0.0
		if life > 0 {
			u = busy.Seconds() / life.Seconds()
		}
		word := ""
		if i == 0 {
			word = " busy"
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%%s", s, 100*u, word))
	}
	return strings.Join(parts, ", ")
}

// Fit is a stage's service time of an item over a window, robustly: the
// median over its replicas of each one's busy time over the items it
// took in the window (prev the replicas at the window's start, by index;
// a replica absent there started in it). Replicas that took no item in
// the window are left out; none took one: false.
func Fit(prev, now []report.ReplicaSnapshot) (time.Duration, bool) {
	var per []float64
	for i, r := range now {
		var p report.ReplicaSnapshot
		if i < len(prev) {
			p = prev[i]
		}
		if n := r.ItemsIn - p.ItemsIn; n > 0 {
			per = append(per, float64(r.Busy-p.Busy)/float64(n))
		}
	}
	if len(per) == 0 {
		return 0, false
	}
	sort.Float64s(per)
	m := per[len(per)/2]
	if len(per)%2 == 0 {
		m = (per[len(per)/2-1] + per[len(per)/2]) / 2
	}
	return time.Duration(math.Round(m)), true
}

// modelled reports whether the simulator has a model of gs's service
// times without measuring them: its kind's, or the stage's sim block.
func (rb *Rebalancer) modelled(gs *graph.Stage) bool {
	if gs.Sim != nil {
		return true
	}
	reg := rb.opts.Registry
	if reg == nil {
		reg = nodes.Default
	}
	spec, ok := reg.Spec(gs.Node)
	return ok && spec.Sim != nil
}

// emitted is a source's replicas with the items each emitted counted as
// taken, for Fit.
func emitted(rs []report.ReplicaSnapshot) []report.ReplicaSnapshot {
	out := slices.Clone(rs)
	for i := range out {
		out[i].ItemsIn = out[i].ItemsOut
	}
	return out
}

func stageOf(snap *report.Snapshot, name string) *report.StageSnapshot {
	for i := range snap.Stages {
		if snap.Stages[i].Name == name {
			return &snap.Stages[i]
		}
	}
	return nil
}
