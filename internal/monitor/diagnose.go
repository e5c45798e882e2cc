package monitor

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// Thresholds of the diagnosis rules, in shares of a replica's lifetime or
// of a queue's capacity.
const (
	busyBottleneck = 0.80 // a stage this busy on average limits throughput
	siblingGap     = 0.25 // a replica idle (or blocked) this much more than its siblings' median
	fullShare      = 0.90 // a queue this full on average is "always full"
	emptyDepth     = 0.05 // a queue this empty on average is "always empty"
	crossingShare  = 0.25 // an edge across hosts this full on average can hold its producer back
	minRunSeconds  = 0.05 // shorter runs are too short to judge
	minBusy        = 0.10 // a consumer busier than this is worth feeding faster
	dataWaitShare  = 0.30 // members waiting this much of each step for data are starved by their producers
)

// Diagnose reads a finished run's figures and says, in plain words, what
// limited it: the bottleneck stage, replicas starved or blocked far more
// than their siblings, queues always full or always empty, for a
// round_robin edge with uneven wiring the change that balances it, and
// for a key_hash edge whose keys are skewed the replica they overload. Each
// sentence cites the measured figures it rests on. A failed run gets none
// of these, only a deadlock's account where it deadlocked: what ended it
// was its error. predict, when not nil,
// estimates what switching an edge to "shared" would gain (the simulator,
// replaying this run's service times); its figure, with its spread, joins
// the suggestion.
func Diagnose(g *graph.Graph, rep *report.Report, predict Predictor) []string {
	out := []string{}
	if d := deadlocked(rep); d != "" {
		out = append(out, d)
	}
	// A failed run was cut short by its error (a deadlock above, a replica
	// that failed, a worker lost): its figures stop there and say nothing
	// of what limits the pipeline's throughput, so no advice on it.
	if rep.WallSeconds < minRunSeconds || rep.Status == report.Failed {
		return out
	}
	out = append(out, bottleneck(g, rep)...)
	for _, s := range g.Stages {
		out = append(out, dataWait(rep, s)...)
		out = append(out, siblings(g, rep, s, predict)...)
	}
	for _, e := range g.Edges {
		out = append(out, keySkew(rep, e)...)
		out = append(out, queueRules(g, rep, e)...)
	}
	return out
}

// dataWait says when a stage whose members measure their steps
// (report.DataWait and report.Compute: a group kind taking its input in
// steps, drafter_train) waits a large share of each step for data: the
// stages feeding it, not its compute, set its pace.
func dataWait(rep *report.Report, s *graph.Stage) []string {
	st := rep.Stages[s.Name]
	share, ok := st.DataWaitShare()
	if !ok || share < dataWaitShare {
		return nil
	}
	var from []string
	for _, in := range s.Inputs {
		for _, e := range in.Edges {
			if !slices.Contains(from, e.From.Stage.Name) {
				from = append(from, e.From.Stage.Name)
			}
		}
	}
	who, verb := "its producers", "are"
	switch len(from) {
	case 0:
		return nil
	case 1:
		who, verb = "stage "+from[0], "is"
	default:
		who = "stages " + strings.Join(from, ", ")
	}
	return []string{fmt.Sprintf("%s waits %s of each step for data (%.1fs waiting, %.1fs computing, over its %s): %s %s the bottleneck; "+
		"more %s replicas, or faster ones, would feed it",
		s.Name, pct(share), st.Metrics[report.DataWait], st.Metrics[report.Compute], plural(s.Replicas, "replica"), who, verb, strings.Join(from, " or "))}
}

// skewShare: a key_hash edge whose busiest consumer replica takes this
// many times the items of its least busy one is fed by skewed keys.
const skewShare = 1.5

// keySkew says when a key_hash edge's keys are skewed: its consumer
// replicas take uneven shares of the items (the frequent keys all go to
// the same few), so the replicas with the most limit the stage while the
// others wait. Per-replica counts are the consumers' items in, exact when
// the edge is the stage's only input.
func keySkew(rep *report.Report, e *graph.Edge) []string {
	s := e.To.Stage
	if e.Policy != graph.KeyHash || s.Replicas < 2 || len(s.Inputs) != 1 || len(s.Inputs[0].Edges) != 1 {
		return nil
	}
	st := rep.Stages[s.Name]
	if len(st.Replicas) != s.Replicas {
		return nil
	}
	var total int64
	top, low := 0, 0
	for i, r := range st.Replicas {
		total += r.ItemsIn
		if r.ItemsIn > st.Replicas[top].ItemsIn {
			top = i
		}
		if r.ItemsIn < st.Replicas[low].ItemsIn {
			low = i
		}
	}
	if total < 10*int64(s.Replicas) || float64(st.Replicas[top].ItemsIn) < skewShare*float64(st.Replicas[low].ItemsIn) {
		return nil
	}
	split := make([]string, len(st.Replicas))
	for i, r := range st.Replicas {
		split[i] = pct(float64(r.ItemsIn) / float64(total))
	}
	sh := shares(st)
	return []string{fmt.Sprintf("edge %s: the keys are skewed: key_hash splits the items [%s] over %s's replicas (even: %s each); "+
		"replica %d takes the most, busy %s, while replica %d waits for input %s of the time; every item of a key goes to one replica, "+
		"so more distinct keys, or splitting the hot keys, balance it (policy = \"shared\" does, if items of one key need not meet on one replica)",
		e.Name, strings.Join(split, " "), s.Name, pct(1/float64(s.Replicas)), top, pct(sh[top].busy), low, pct(sh[low].idle))}
}

// deadlocked leads the diagnosis of a run that ended in a deadlock (the
// engine's error names the cycle, then the fix on a line of its own).
func deadlocked(rep *report.Report) string {
	_, rest, ok := strings.Cut(rep.Error, "deadlock: no replica can move")
	if !ok {
		return ""
	}
	d := fmt.Sprintf("the run deadlocked after %.1fs: no replica could move, each waiting for another (the error names the cycle)", rep.WallSeconds)
	for _, line := range strings.Split(rest, "\n") {
		if fix, ok := strings.CutPrefix(strings.TrimSpace(line), "fix: "); ok {
			d += "; " + fix
		}
	}
	return d
}

func bottleneck(g *graph.Graph, rep *report.Report) []string {
	var best *graph.Stage
	var bestU, next float64
	for _, s := range g.Stages {
		u := rep.Stages[s.Name].Utilization()
		if u > bestU {
			best, bestU, next = s, u, bestU
		} else if u > next {
			next = u
		}
	}
	if best == nil || bestU < busyBottleneck {
		return nil
	}
	verb := "are"
	if best.Replicas == 1 {
		verb = "is"
	}
	return []string{fmt.Sprintf("stage %s limits throughput: its %s %s busy %s on average (the next busiest stage %s); more replicas or a faster %s would help",
		best.Name, plural(best.Replicas, "replica"), verb, pct(bestU), pct(next), best.Node)}
}

type share struct {
	idx                 int
	busy, idle, blocked float64
}

func shares(st report.Stage) []share {
	out := make([]share, len(st.Replicas))
	for i, r := range st.Replicas {
		sh := r.Shares()
		out[i] = share{i, sh.Busy, sh.Idle, sh.Blocked}
	}
	return out
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// siblings finds replicas idle far more than their siblings (starved) and
// says why when a round_robin edge's wiring explains it.
func siblings(g *graph.Graph, rep *report.Report, s *graph.Stage, predict Predictor) []string {
	if s.Replicas < 2 {
		return nil
	}
	sh := shares(rep.Stages[s.Name])
	var out []string
	for _, r := range sh {
		var others []share
		var idle, busy, blocked []float64
		for _, o := range sh {
			if o.idx != r.idx {
				others = append(others, o)
				idle = append(idle, o.idle)
				busy = append(busy, o.busy)
				blocked = append(blocked, o.blocked)
			}
		}
		if r.idle-median(idle) < siblingGap {
			continue
		}
		msg := fmt.Sprintf("%s replica %d idle %s while replicas %s are busy %s",
			s.Name, r.idx, pct(r.idle), indexList(others), pct(median(busy)))
		if median(blocked) >= siblingGap {
			msg += fmt.Sprintf(" and blocked %s (waiting for it at each sync step)", pct(median(blocked)))
		}
		if e, why := unevenFeed(s, r.idx); e != nil {
			msg = fmt.Sprintf("edge %s: %s; %s; policy = \"shared\" balances it", e.Name, msg, why)
			if predict != nil {
				if p, ok := predict(e.Name); ok {
					msg += fmt.Sprintf(" (simulated: %s, %.2fs -> %.2fs)", faster(p), p.Before, p.After)
				}
			}
		}
		out = append(out, msg)
	}
	return out
}

// unevenFeed returns the round_robin edge into s that gives replica c
// fewer producers than its siblings, and says so.
func unevenFeed(s *graph.Stage, c int) (*graph.Edge, string) {
	for _, in := range s.Inputs {
		for _, e := range in.Edges {
			if e.Policy != graph.RoundRobin {
				continue
			}
			mine := len(e.Queues[e.ConsumerQueue(c)].Producers)
			most := 0
			for _, q := range e.Queues {
				most = max(most, len(q.Producers))
			}
			if mine < most {
				return e, fmt.Sprintf("round_robin feeds it %s against %d (wiring %s)", plural(mine, "producer"), most, e.Fanin())
			}
		}
	}
	return nil, ""
}

func queueRules(g *graph.Graph, rep *report.Report, e *graph.Edge) []string {
	re, ok := rep.Edges[e.Name]
	if !ok {
		return nil
	}
	var out []string
	consumers := rep.Stages[e.To.Stage.Name].Replicas
	for i, q := range re.Queues {
		name := fmt.Sprintf("edge %s", e.Name)
		if len(re.Queues) > 1 {
			name = fmt.Sprintf("edge %s queue %d (to %s %s)", e.Name, i, e.To.Stage.Name, indexList(nil, q.Consumers...))
		}
		var busy, idle, blocked []float64
		for _, c := range q.Consumers {
			if c < len(consumers) {
				sh := shares(report.Stage{Replicas: consumers[c : c+1]})[0]
				busy, idle, blocked = append(busy, sh.busy), append(idle, sh.idle), append(blocked, sh.blocked)
			}
		}
		who := fmt.Sprintf("%s (busy %s", e.To.Stage.Name, pct(median(busy)))
		if median(blocked) >= siblingGap {
			who += fmt.Sprintf(", blocked %s", pct(median(blocked)))
		}
		who += ")"
		switch {
		case q.MeanDepth >= fullShare*float64(re.Capacity):
			// A consumer blocked on outputs that are full themselves is
			// not the cause: what holds it back is further downstream.
			why, advice := "cannot keep up", ""
			if median(blocked) >= siblingGap {
				if full := fullEdgesFrom(g, rep, e.To.Stage); len(full) > 0 {
					why = "is held back in turn by " + strings.Join(full, ", ")
				} else if across, said := crossingEdgesFrom(g, rep, e.To.Stage); len(across) > 0 {
					why = "is held back in turn by " + strings.Join(across, ", ")
					advice = "; " + strings.Join(said, ", ") + ": a send across hosts waits for its consumer's worker to say, through the server, that there is room, " +
						"a round trip for each capacity's worth of items, so a larger capacity there lets more go at once"
				}
			}
			out = append(out, fmt.Sprintf("%s is always full (mean depth %.1f of %d): %s %s and holds back %s%s",
				name, q.MeanDepth, re.Capacity, who, why, e.From.Stage.Name, advice))
		case q.MeanDepth <= emptyDepth && re.Produced > 0 && len(idle) > 0 &&
			median(idle) >= siblingGap && median(busy) >= minBusy:
			out = append(out, fmt.Sprintf("%s is always empty (mean depth %.2f): %s waits for input %s of the time",
				name, q.MeanDepth, e.To.Stage.Name, pct(median(idle))))
		}
	}
	return out
}

// fullEdgesFrom names the edges leaving stage s with a queue that is
// always full ("edge hs"): mean depth at fullShare of the capacity or
// more.
func fullEdgesFrom(g *graph.Graph, rep *report.Report, s *graph.Stage) []string {
	var names []string
	for _, e := range g.Edges {
		re, ok := rep.Edges[e.Name]
		if e.From.Stage != s || !ok {
			continue
		}
		for _, q := range re.Queues {
			if q.MeanDepth >= fullShare*float64(re.Capacity) {
				names = append(names, "edge "+e.Name)
				break
			}
		}
	}
	return names
}

// crossingEdgesFrom names the edges leaving stage s that cross hosts and
// are a quarter full or more ("edge s"), and says so of each ("edge s
// crosses hosts (mean depth 3.9 of 8)"): a producer blocked on one waits
// for its credit, turned by a round trip through the server, though the
// depth the stream reports stays below the capacity.
func crossingEdgesFrom(g *graph.Graph, rep *report.Report, s *graph.Stage) (names, said []string) {
	for _, e := range g.Edges {
		re, ok := rep.Edges[e.Name]
		if e.From.Stage != s || !ok || re.Carried != report.CarriedCrosses {
			continue
		}
		depth := 0.0
		for _, q := range re.Queues {
			depth = max(depth, q.MeanDepth)
		}
		if depth >= crossingShare*float64(re.Capacity) {
			names = append(names, "edge "+e.Name)
			said = append(said, fmt.Sprintf("edge %s crosses hosts (mean depth %.1f of %d)", e.Name, depth, re.Capacity))
		}
	}
	return names, said
}

// Prediction is a simulated before/after wall time, in seconds, and the
// spread of the speedup (Before/After) over the alternative fits of the
// measured figures: Low and High, equal where there is none.
type Prediction struct{ Before, After, Low, High float64 }

// Predictor estimates the effect of setting an edge's policy to "shared".
// internal/sim's Predictor makes one from a graph in memory by simulating
// it both ways; the dependency runs sim -> monitor, never back.
type Predictor func(edge string) (Prediction, bool)

// faster writes a prediction's speedup, "1.67x faster", with its spread
// where it has one at that precision: "1.67x faster (1.61-1.70x)".
func faster(p Prediction) string {
	x := fmt.Sprintf("%.2fx faster", p.Before/p.After)
	lo, hi := fmt.Sprintf("%.2f", p.Low), fmt.Sprintf("%.2f", p.High)
	if lo == hi || p.Low <= 0 {
		return x
	}
	return fmt.Sprintf("%s (%s-%sx)", x, lo, hi)
}

func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// indexList writes replica indices compactly: "0-1", "0, 2, 5".
func indexList(sh []share, idx ...int) string {
	for _, s := range sh {
		idx = append(idx, s.idx)
	}
	sort.Ints(idx)
	var parts []string
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", idx[i], idx[j]))
		} else {
			parts = append(parts, fmt.Sprint(idx[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
