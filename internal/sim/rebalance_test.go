package sim

import (
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// rebalanced is the seed's shape with every edge shared and a rebalance
// block over target and drafter: src -> target -> drafter -> sink. The
// %d are the source's count, the target and drafter replicas, the
// budget; the %q the target's and drafter's service times; the last %s
// more of the block.
const rebalanced = `
stage "src" {
  node = "synthetic_source"
  config {
    count = %d
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time = %q
  }
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time = %q
  }
}
stage "sink" {
  node = "sink"
}
edge "tokens" {
  from = src.out
  to   = target.in
}
edge "hs" {
  from = target.out
  to   = drafter.in
}
edge "done" {
  from = drafter.out
  to   = sink.in
}
rebalance {
  stages   = ["target", "drafter"]
  replicas = %d
  %s
}`

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

// TestDecide: from the worst split of 8 (1 target of 50ms, 7 drafters of
// 25ms) the policy moves to the best (5+3: the targets' 100 items/s
// against the drafters' 120), four replicas at once, and predicts the
// rates a queueing model gives.
func TestDecide(t *testing.T) {
	g := load(t, fmt.Sprintf(rebalanced, 1000, 1, "50ms", 7, "25ms", 8, ""))
	look := Look{Split: map[string]int{"target": 1, "drafter": 7},
		Service: map[string]time.Duration{"target": ms(50), "drafter": ms(25)}, Total: 1000}
	d := Decide(g, look, Options{Registry: registry()})
	if !d.Move || d.Split["target"] != 5 || d.Split["drafter"] != 3 {
		t.Fatalf("decision %+v, want a move to 5+3", d)
	}
	if len(d.Transfers) != 1 || d.Transfers[0].From != "drafter" || d.Transfers[0].To != "target" || d.Transfers[0].Replicas != 4 {
		t.Errorf("transfers %+v, want 4 replicas drafter -> target", d.Transfers)
	}
	if !near(d.Rate, 20, 0.03) || !near(d.NewRate, 100, 0.03) {
		t.Errorf("rates %.1f -> %.1f items/s, want 20 -> 100", d.Rate, d.NewRate)
	}
	if !near(d.TimeLeft.Seconds(), 50, 0.03) || !near(d.Gain(), 0.8, 0.03) || !strings.Contains(d.Why, "predicted +80% over the") {
		t.Errorf("time left %v, gain %.3f (%s); want 50s and 0.8", d.TimeLeft, d.Gain(), d.Why)
	}
	// The same look, the same decision.
	if d2 := Decide(g, look, Options{Registry: registry()}); !maps.Equal(d2.Split, d.Split) || d2.Rate != d.Rate || d2.NewRate != d.NewRate {
		t.Errorf("not deterministic: %+v then %+v", d, d2)
	}
	// At the best split it stays.
	look.Split = map[string]int{"target": 5, "drafter": 3}
	if d := Decide(g, look, Options{Registry: registry()}); d.Move || !strings.Contains(d.Why, "is the fastest the simulator finds") {
		t.Errorf("at the best split: %+v", d)
	}
}

// TestDecideCost: a move whose cost outweighs the time it saves over the
// little work left is not made; with more work left it is.
func TestDecideCost(t *testing.T) {
	g := load(t, fmt.Sprintf(rebalanced, 1000, 1, "50ms", 7, "25ms", 8, `move_cost = "5s"`))
	look := Look{Split: map[string]int{"target": 1, "drafter": 7},
		Service: map[string]time.Duration{"target": ms(50), "drafter": ms(25)}, Done: 990, Total: 1000}
	d := Decide(g, look, Options{Registry: registry()})
	if d.Move || !strings.Contains(d.Why, "under min_gain 5%") {
		t.Errorf("10 items left (0.5s) and a 5s move: %+v", d)
	}
	look.Done = 0 // 50s left: 5s of 1 target, then 995 items at 100/s
	d = Decide(g, look, Options{Registry: registry()})
	if !d.Move || !near(d.Saved.Seconds(), 50-(5+(1000-20*5)/100.0), 0.03) {
		t.Errorf("1000 items left: saved %v, want about 36s: %+v", d.Saved, d)
	}
	// min_gain above what the move saves: no move.
	g = load(t, fmt.Sprintf(rebalanced, 1000, 1, "50ms", 7, "25ms", 8, `min_gain = 0.9`))
	if d := Decide(g, look, Options{Registry: registry()}); d.Move {
		t.Errorf("min_gain 0.9 against a gain of 0.8: %+v", d)
	}
}

// TestDecideHold: within hold of a move, no move back, even where the
// simulator ranks it best; after hold, the move back.
func TestDecideHold(t *testing.T) {
	g := load(t, fmt.Sprintf(rebalanced, 1000, 5, "50ms", 3, "25ms", 8, `hold = "60s"`))
	// The cost moved: drafters are now the bottleneck.
	look := Look{Elapsed: 10 * time.Second, Split: map[string]int{"target": 5, "drafter": 3},
		Service: map[string]time.Duration{"target": ms(10), "drafter": ms(50)}, Total: 1000,
		Moves: []report.Move{{T: 5, From: "drafter", To: "target", Replicas: 4}}}
	d := Decide(g, look, Options{Registry: registry()})
	if d.Move || !strings.Contains(d.Why, "moves no replica back within 1m0s") {
		t.Errorf("within hold: %+v", d)
	}
	look.Elapsed = 70 * time.Second
	if d := Decide(g, look, Options{Registry: registry()}); !d.Move || d.Split["drafter"] <= 3 {
		t.Errorf("after hold: %+v", d)
	}
}

// TestDecideOpenEnded: with no known total the time left is the horizon.
func TestDecideOpenEnded(t *testing.T) {
	g := load(t, fmt.Sprintf(rebalanced, 1000, 1, "50ms", 7, "25ms", 8, `horizon = "2m"`))
	look := Look{Split: map[string]int{"target": 1, "drafter": 7},
		Service: map[string]time.Duration{"target": ms(50), "drafter": ms(25)}, Done: 500}
	d := Decide(g, look, Options{Registry: registry()})
	if !d.Move || d.TimeLeft != 2*time.Minute || !near(d.Gain(), 0.8, 0.03) {
		t.Errorf("open-ended: %+v", d)
	}
	look.Service = map[string]time.Duration{"target": ms(50)}
	if d := Decide(g, look, Options{Registry: registry()}); d.Move || !strings.Contains(d.Why, "no service time measured for stage drafter") {
		t.Errorf("no drafter fit: %+v", d)
	}
}

// TestFit: the median over replicas of busy time per item in the window.
func TestFit(t *testing.T) {
	prev := []report.ReplicaSnapshot{{ItemsIn: 10, Busy: ms(500)}, {ItemsIn: 3, Busy: ms(900)}}
	now := []report.ReplicaSnapshot{{ItemsIn: 20, Busy: ms(1000)}, {ItemsIn: 3, Busy: ms(900)}, {ItemsIn: 5, Busy: ms(300)}, {ItemsIn: 1, Busy: ms(5000)}}
	// 50ms, none, 60ms, 5s (a spike): the median of three is 60ms.
	if f, ok := Fit(prev, now); !ok || f != ms(60) {
		t.Errorf("fit %v %v, want 60ms", f, ok)
	}
	if _, ok := Fit(now, now); ok {
		t.Error("a window of no items fitted something")
	}
}

// TestRebalancerDue: the first look comes once each stage has served a
// few items (or at every), the next every after the last.
func TestRebalancerDue(t *testing.T) {
	g := load(t, fmt.Sprintf(rebalanced, 1000, 1, "50ms", 2, "25ms", 8, `every = "10s"`))
	rb := NewRebalancer(g, Options{Registry: registry()})
	snap := func(at time.Duration, target, d0, d1 int64) *report.Snapshot {
		return &report.Snapshot{Elapsed: at, Stages: []report.StageSnapshot{
			{Name: "src", Source: true, Total: 1000, Replicas: []report.ReplicaSnapshot{{ItemsOut: target}}},
			{Name: "target", Replicas: []report.ReplicaSnapshot{{ItemsIn: target, Busy: time.Duration(target) * ms(50)}}},
			{Name: "drafter", Replicas: []report.ReplicaSnapshot{{ItemsIn: d0, Busy: time.Duration(d0) * ms(25)}, {ItemsIn: d1, Busy: time.Duration(d1) * ms(25)}}},
		}}
	}
	if rb.Due(snap(ms(200), 8, 4, 3)) {
		t.Error("due before the drafters served 8 items")
	}
	s := snap(ms(400), 8, 8, 0)
	if !rb.Due(s) {
		t.Fatal("not due once each stage served 8 items")
	}
	d := rb.Look(s)
	// 1+2 of a budget of 8: the spare five start, four targets and a
	// drafter.
	if !d.Move || d.Split["target"] != 5 || len(d.Transfers) != 2 || d.Transfers[0] != (report.Move{T: 0.4, From: "", To: "target", Replicas: 4,
		Reason: "target 100% busy, drafter 100%", PredictedGain: d.Gain()}) || d.Transfers[1].To != "drafter" || d.Transfers[1].Replicas != 1 {
		t.Errorf("first look: %+v", d)
	}
	rb.Moved(d)
	if got := rb.Split(); got["target"] != 5 || got["drafter"] != 3 || len(rb.Moves()) != 2 {
		t.Errorf("after the move: split %v, moves %v", got, rb.Moves())
	}
	if rb.Due(snap(ms(10300), 100, 50, 50)) || !rb.Due(snap(ms(10400), 100, 50, 50)) {
		t.Error("the next look is not every (10s) after the last")
	}
	if !NewRebalancer(g, Options{}).Due(snap(10*time.Second, 0, 0, 0)) {
		t.Error("the first look does not come at every when replicas served nothing")
	}
}

// TestRebalancerFitsUnmodelled: stages outside the rebalance whose kinds
// have no simulation model (a source with a known count, as text_reader;
// a sink) take the service times the look measures, so the policy
// predicts and moves (without them the simulator had no rate for any
// split, and a run of built-in kinds never moved).
func TestRebalancerFitsUnmodelled(t *testing.T) {
	reg := registry()
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "plain_source", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: graph.Any}}
		}},
		New:   func(*graph.Config) (nodes.Node, error) { return nil, fmt.Errorf("not run") },
		Total: func(*graph.Config) int64 { return 1000 },
	})
	src := strings.NewReplacer(`node = "synthetic_source"`, `node = "plain_source"`, "count = 1000\n", "", `node = "sink"`, `node = "opaque"`).
		Replace(fmt.Sprintf(rebalanced, 1000, 1, "50ms", 7, "25ms", 8, ""))
	src = strings.Replace(src, "  config {\n  }\n", "", 1)
	g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	drafters := make([]report.ReplicaSnapshot, 7)
	for i := range drafters {
		drafters[i] = report.ReplicaSnapshot{ItemsIn: 2, Busy: ms(50)}
	}
	d := NewRebalancer(g, Options{Registry: reg}).Look(&report.Snapshot{Elapsed: ms(800), Stages: []report.StageSnapshot{
		{Name: "src", Source: true, Total: 1000, Replicas: []report.ReplicaSnapshot{{ItemsOut: 30, Busy: ms(30)}}},
		{Name: "target", Replicas: []report.ReplicaSnapshot{{ItemsIn: 16, Busy: ms(800)}}},
		{Name: "drafter", Replicas: drafters},
		{Name: "sink", Replicas: []report.ReplicaSnapshot{{ItemsIn: 14, Busy: ms(14)}}},
	}})
	if !d.Move || d.Split["target"] != 5 || d.Split["drafter"] != 3 {
		t.Errorf("look: %+v; want a move to 5+3", d)
	}
}

// TestRebalanceSim: simulating the policy from the worst split of the
// seed's shape (1 target of 50ms, 7 drafters of 25ms stepping together,
// 2000 items: 20s at the best split)
// moves to the best early and carries at least 0.9x the best static
// split's throughput and 1.5x the starting split's; every item is counted
// once, the moves are in the report, and the replicas that left and
// started are too.
func TestRebalanceSim(t *testing.T) {
	for _, cost := range []string{"0s", "1s"} {
		src := fmt.Sprintf(rebalanced, 2000, 1, "lognormal(50ms, 0.1)", 7, "25ms", 8, `move_cost = "`+cost+`"`)
		src = strings.Replace(src, "service_time = \"25ms\"", "service_time = \"25ms\"\n    sync = true", 1)
		g := load(t, src)
		live := simulate(t, g, Options{Rebalance: true, Interval: time.Second}) // a series too
		static := simulate(t, g, Options{})
		best := simulate(t, load(t, src, "stage.target.replicas=5", "stage.drafter.replicas=3"), Options{})
		x, y := Throughput(g, live), Throughput(g, static)
		z := Throughput(g, best)
		t.Logf("move_cost %s: live %.1f items/s, best static %.1f, starting split %.1f; moves %+v", cost, x, z, y, live.Moves)
		if x < 0.9*z || x < 1.5*y {
			t.Errorf("move_cost %s: live %.1f items/s against the best static %.1f and the starting split's %.1f", cost, x, z, y)
		}
		if len(live.Moves) == 0 || live.Moves[0].From != "drafter" || live.Moves[0].To != "target" || live.Moves[0].T > 0.1*live.WallSeconds {
			t.Fatalf("move_cost %s: moves %+v in a run of %.2fs; want drafter -> target within its first tenth", cost, live.Moves, live.WallSeconds)
		}
		// 20 items/s before the move, about 100 after: the time left
		// shrank by about 0.8, as predicted.
		if g := live.Moves[0].MeasuredGain; g == nil || *g < 0.7 || *g > 0.85 {
			t.Errorf("move_cost %s: measured gain %v, want about 0.8", cost, deref(g))
		}
		if n := live.Edges["done"].Consumed; n != 2000 {
			t.Errorf("move_cost %s: the sink took %d items, want 2000", cost, n)
		}
		moved := 0
		for _, m := range live.Moves {
			moved += m.Replicas
		}
		if got := len(live.Stages["target"].Replicas); got != 1+moved {
			t.Errorf("move_cost %s: %d target replicas in the report, want the 1 it started with and %d started", cost, got, moved)
		}
		if cost == "1s" {
			// A started replica waits out the move's cost before its first item.
			if r := live.Stages["target"].Replicas[1]; r.IdleSeconds < 1 {
				t.Errorf("a target started with move_cost 1s was idle %.3fs", r.IdleSeconds)
			}
		}
		if static.Moves != nil {
			t.Errorf("a simulation without Rebalance moved: %+v", static.Moves)
		}
		// The series gives the split at each point: the budget's 8
		// throughout (the first point comes after the move), 1 + moved
		// targets at the end.
		for _, p := range live.Series {
			if n := p.Replicas; n["target"]+n["drafter"] != 8 || n["target"] != 1+moved {
				t.Errorf("move_cost %s: sizes %v at %.1fs; want target %d of 8", cost, n, p.T, 1+moved)
			}
		}
	}
}

// TestRebalanceSimMovingBottleneck: with costs that change halfway
// (specs/moving.hcl's shape) the simulated policy beats every static
// split of the same budget.
func TestRebalanceSimMovingBottleneck(t *testing.T) {
	src := fmt.Sprintf(rebalanced, 1000, 5, "lognormal(50ms, 0.1)", 3, "25ms", 8, "every = \"2s\"\n  hold = \"10s\"")
	src = strings.Replace(src, "service_time = \"lognormal(50ms, 0.1)\"", "service_time = \"lognormal(50ms, 0.1)\"\n    changed_service_time = \"lognormal(20ms, 0.1)\"\n    change_after = 500", 1)
	src = strings.Replace(src, "service_time = \"25ms\"", "service_time = \"25ms\"\n    changed_service_time = \"60ms\"\n    change_after = 500", 1)
	g := load(t, src)
	live := simulate(t, g, Options{Rebalance: true})
	splits, err := Splits(g, "target", "drafter", 8, Options{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	x := Throughput(g, live)
	t.Logf("live %.1f items/s, best static %d+%d %.1f; moves %+v", x, splits[0].A, splits[0].B, splits[0].Throughput, live.Moves)
	if x <= splits[0].Throughput {
		t.Errorf("live %.1f items/s does not beat the best static split (%d+%d, %.1f)", x, splits[0].A, splits[0].B, splits[0].Throughput)
	}
	for _, m := range live.Moves {
		if m.From != "target" || m.To != "drafter" || m.T < 4 {
			t.Errorf("move %+v: want targets to drafters after the change (about 5s in)", m)
		}
	}
}

func deref(g *float64) any {
	if g == nil {
		return nil
	}
	return *g
}
