package ui

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

// movedReport simulates specs/moving.hcl (a bottleneck that moves
// halfway) with its rebalance block acting, with a series, and returns
// its report and the spec's graph.
func movedReport(t *testing.T) (*report.Report, *graph.Graph) {
	t.Helper()
	g := loadSpec(t, "../../specs/moving.hcl")
	rep, err := sim.Run(g, sim.Options{Registry: registry(), Rebalance: true, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Moves) < 2 || len(rep.Series) < 5 {
		t.Fatalf("%d moves, %d samples: want a run that moves twice or more", len(rep.Moves), len(rep.Series))
	}
	return rep, g
}

// TestFramesCarryMoves: a frame gives the sizes of a rebalance's stages
// and the moves made since the previous frame, live (from snapshots) and
// from a saved report (each move at the first sample at or after it), so
// that the page sees every move once.
func TestFramesCarryMoves(t *testing.T) {
	stage := func(left ...bool) report.StageSnapshot {
		st := report.StageSnapshot{Name: "a", Rebalanced: true}
		for _, l := range left {
			st.Replicas = append(st.Replicas, report.ReplicaSnapshot{Left: l})
		}
		return st
	}
	m1 := report.Move{T: 1, From: "a", To: "b", Replicas: 1}
	m2 := report.Move{T: 2, From: "a", To: "b", Replicas: 1}
	s1 := &report.Snapshot{Elapsed: time.Second, Stages: []report.StageSnapshot{stage(false, false, false), {Name: "sink"}}, Moves: []report.Move{m1}}
	s2 := &report.Snapshot{Elapsed: 2 * time.Second, Stages: []report.StageSnapshot{stage(false, true, true), {Name: "sink"}}, Moves: []report.Move{m1, m2}}
	f1, f2 := frameOf(s1, nil), frameOf(s2, s1)
	if fmt.Sprint(f1.Replicas, len(f1.Moves), f2.Replicas, len(f2.Moves)) != "map[a:3] 1 map[a:1] 1" || f2.Moves[0].T != 2 {
		t.Errorf("frames: %v %v, then %v %v; want a's size 3 then 1 (the sink's not given), each move once", f1.Replicas, f1.Moves, f2.Replicas, f2.Moves)
	}

	rep, _ := movedReport(t)
	r := Saved(rep, nil, "moving")
	n := 0
	for i, f := range r.frames {
		n += len(f.Moves)
		for _, m := range f.Moves {
			if i > 0 && !f.Summary && (m.T > f.T || m.T <= r.frames[i-1].T) {
				t.Errorf("move at %.2fs in the frame at %.2fs (previous %.2fs)", m.T, f.T, r.frames[i-1].T)
			}
		}
		if !f.Summary && f.Replicas["target"]+f.Replicas["drafter"] != 8 {
			t.Errorf("frame at %.2fs: sizes %v, want the budget's 8", f.T, f.Replicas)
		}
	}
	if n != len(rep.Moves) {
		t.Errorf("%d moves in the frames, the report has %d", n, len(rep.Moves))
	}
}

// TestPageRebalance: a rebalanced run's page draws each move as a marker
// on every chart, titled with the move in words, the stages' sizes over
// the run as a chart of their own ahead of the others (a step line per
// stage of the rebalance), and each stage's size as the replay shows it
// in its box, which gains a row for each replica a move started (the
// spec's graph has the split it starts with).
func TestPageRebalance(t *testing.T) {
	rep, g := movedReport(t)
	ctx, done := serveSaved(t, 1400, Saved(rep, g, "moving"))
	defer done()

	type info struct {
		First   string
		Lines   int
		Legend  string
		Top     float64
		Markers []int
		Title   string
		Node    string
		Rows    int
		Gauges  int
	}
	got := eval[info](t, ctx, `(() => {
		const sizes = document.querySelector('[data-chart="rebalance/replicas"]');
		if (!sizes) return {};
		const charts = [...document.querySelectorAll('.chart:not([hidden])')];
		return {
			First: document.querySelector('.chart').dataset.chart,
			Lines: sizes.querySelectorAll('polyline.series').length,
			Legend: sizes.querySelector('.chart-legend').textContent,
			Top: Math.max(...[...sizes.querySelectorAll('.y-axis text')].map((e) => +e.textContent)),
			Markers: charts.map((c) => c.querySelectorAll('g.move').length),
			Title: charts[0].querySelector('g.move title').textContent,
			Node: document.querySelector('[data-node="target"]').textContent,
			Rows: document.querySelectorAll('[data-stage="drafter"] [data-replica]').length,
			Gauges: document.querySelectorAll('[data-queue-gauge^="hs/"]').length,
		};
	})()`)
	if got.First != "rebalance/replicas" || got.Lines != 2 {
		t.Fatalf("page: %+v; want the sizes chart first, a line each for target and drafter", got)
	}
	last := rep.Series[len(rep.Series)-1].Replicas
	if !strings.Contains(got.Legend, fmt.Sprintf("target %d", last["target"])) || !strings.Contains(got.Legend, fmt.Sprintf("drafter %d", last["drafter"])) {
		t.Errorf("sizes legend %q, want target %d and drafter %d at the end", got.Legend, last["target"], last["drafter"])
	}
	most := 0
	for _, p := range rep.Series {
		most = max(most, p.Replicas["target"], p.Replicas["drafter"])
	}
	if got.Top < float64(most) {
		t.Errorf("sizes chart's axis tops at %v: want the largest size, %d, within it", got.Top, most)
	}
	if len(got.Markers) < 5 {
		t.Errorf("%d charts shown", len(got.Markers))
	}
	for i, n := range got.Markers {
		if n != len(rep.Moves) {
			t.Errorf("chart %d: %d move markers, want %d", i, n, len(rep.Moves))
		}
	}
	m := rep.Moves[0]
	if want := fmt.Sprintf("the rebalance moved %d replica", m.Replicas); !strings.Contains(got.Title, want) || !strings.Contains(got.Title, m.From+" -> "+m.To) || !strings.Contains(got.Title, "predicted +") {
		t.Errorf("first marker's title %q: want %q, %s -> %s and the predicted gain", got.Title, want, m.From, m.To)
	}
	if want := fmt.Sprintf("×%d (×5 at the start)", last["target"]); last["target"] == 5 || !strings.HasSuffix(got.Node, want) {
		t.Errorf("target's box says %q, want %q", got.Node, want)
	}
	if ran := len(rep.Stages["drafter"].Replicas); ran <= 3 || got.Rows != ran || got.Gauges != 1 {
		t.Errorf("drafter's box has %d rows and hs %d queue gauges; want a row for each of the %d drafters that ran, and hs's one queue", got.Rows, got.Gauges, ran)
	}
}

// TestLiveRebalance: a live run that moves replicas (the seed's shape from
// 1 target and 7 drafters, every edge shared, its rebalance acting) gives
// the page each move once, in the frame after it is made or in the last,
// and the stages' sizes: 1 and 7 at first, never more than the budget's
// 8 (fewer while the replicas that leave finish their item in hand, their
// successors not started yet), more targets and 8 in all at the end.
func TestLiveRebalance(t *testing.T) {
	g := loadSpec(t, "../../specs/seed.hcl", "edge.hs.policy=shared", "stage.target.replicas=1", "stage.drafter.replicas=7",
		"stage.reader.config.count=300", "stage.target.config.service_time=10ms", "stage.drafter.config.service_time=5ms")
	g, diags := g.WithRebalance(graph.Rebalance{Stages: []string{"target", "drafter"}, FromFlag: true})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := run.New(g, run.Options{Registry: registry(), Rebalance: true})
	if err != nil {
		t.Fatal(err)
	}
	live := Live(g, "seed", p.Snapshot, 10*time.Millisecond)
	rep, err := p.Run(context.Background())
	if err != nil || rep.Status != report.OK || len(rep.Moves) == 0 {
		t.Fatalf("run: %v, status %s, moves %+v", err, rep.Status, rep.Moves)
	}
	live.Finish(rep)
	frames, ended, _ := live.since(0)
	if !ended {
		t.Fatal("the run has not ended on the page")
	}
	moved := 0
	var sizes []map[string]int
	for _, f := range frames {
		moved += len(f.Moves)
		if !f.Summary && f.Replicas != nil {
			sizes = append(sizes, f.Replicas)
		}
	}
	if moved != len(rep.Moves) {
		t.Errorf("%d moves on the page, %d in the report", moved, len(rep.Moves))
	}
	if len(sizes) < 2 {
		t.Fatalf("%d frames with sizes", len(sizes))
	}
	first, last := sizes[0], sizes[len(sizes)-1]
	if first["target"] != 1 || first["drafter"] != 7 || last["target"] <= 1 || last["target"]+last["drafter"] != 8 {
		t.Errorf("sizes %v at first, %v at the end; want 1+7, then more targets, 8 in all", first, last)
	}
	for _, n := range sizes {
		if s := n["target"] + n["drafter"]; s > 8 || n["target"] < 1 || n["drafter"] < 1 {
			t.Errorf("sizes %v: want one replica a stage or more, 8 at most", n)
		}
	}
}
