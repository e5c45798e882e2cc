package graph_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// seedShape is the seed's shape on synthetic kinds, every edge shared:
// reader -> target (5) -> drafter (3) -> done. %s is put at the end.
const seedShape = `
stage "reader" {
  node = "synthetic_source"
  config {
    count = 100
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = 5
  %s
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  %s
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from = reader.out
  to   = target.in
}
edge "hs" {
  from = target.out
  to   = drafter.in
}
edge "trained" {
  from = drafter.out
  to   = done.in
}
%s
`

func loadSeed(t *testing.T, target, drafter, rest string) (*graph.Graph, string) {
	t.Helper()
	l := &graph.Loader{Catalog: testRegistry()}
	src := strings.Replace(strings.Replace(strings.Replace(seedShape, "%s", target, 1), "%s", drafter, 1), "%s", rest, 1)
	g, diags := l.Load("spec.hcl", []byte(src))
	return g, printed(l, diags)
}

// TestRebalanceBlock: a valid block's attributes, and its defaults.
func TestRebalanceBlock(t *testing.T) {
	g, out := loadSeed(t, "", "", `rebalance {
  stages    = ["target", "drafter"]
  every     = "2s"
  min_gain  = 0.1
  move_cost = "20s"
  hold      = "30s"
  horizon   = "1h"
}`)
	if g == nil {
		t.Fatal(out)
	}
	r := g.Rebalance
	want := graph.Rebalance{Stages: []string{"target", "drafter"}, Replicas: 8, Every: 2 * time.Second, MinGain: 0.1,
		MoveCost: 20 * time.Second, Hold: 30 * time.Second, Horizon: time.Hour}
	if r == nil || !slices.Equal(r.Stages, want.Stages) || r.Replicas != want.Replicas || r.Every != want.Every ||
		r.MinGain != want.MinGain || r.MoveCost != want.MoveCost || r.Hold != want.Hold || r.Horizon != want.Horizon {
		t.Fatalf("rebalance %+v, want %+v", r, want)
	}
	if !g.Rebalanced("drafter") || g.Rebalanced("done") {
		t.Error("Rebalanced: want drafter in, done out")
	}
	g, out = loadSeed(t, "", "", "rebalance {\n  stages = [\"target\", \"drafter\"]\n  replicas = 10\n}")
	if g == nil {
		t.Fatal(out)
	}
	if r := g.Rebalance; r.Replicas != 10 || r.Every != graph.DefaultRebalanceEvery || r.MinGain != graph.DefaultRebalanceMinGain ||
		r.Hold != graph.DefaultRebalanceHold || r.Horizon != graph.DefaultRebalanceHorizon || r.MoveCost != 0 {
		t.Errorf("defaults: %+v", r)
	}
	// A copy made by With keeps it.
	v, diags := g.With(graph.SetReplicas("target", 4))
	if diags.HasErrors() || v.Rebalance == nil || v.Rebalance.Replicas != 10 {
		t.Errorf("With lost the rebalance: %v", diags)
	}
	if g, _ := loadSeed(t, "", "", ""); g.Rebalance != nil || g.Rebalanced("target") {
		t.Error("a spec without the block has a rebalance")
	}
	if w := g.WithoutRebalance(); w.Rebalance != nil || g.Rebalance == nil || w.Stage("target").Replicas != 5 {
		t.Errorf("WithoutRebalance: %+v, the original's %+v", w.Rebalance, g.Rebalance)
	}
}

// TestRebalanceDeviceKinds: the stages of a rebalance run on one kind of
// device, and so do the budget's devices; the error points at the block's
// stages (or devices) in the file.
func TestRebalanceDeviceKinds(t *testing.T) {
	defer func(was bool) { graph.CUDA = was }(graph.CUDA)
	graph.CUDA = true
	block := "rebalance {\n  stages = [\"target\", \"drafter\"]\n}"
	g, out := loadSeed(t, `devices = ["cpu"]`, `devices = ["cuda:0", "cuda:1"]`, block)
	if g != nil || !strings.Contains(out, "spec.hcl:34:12: error: stages on different devices") ||
		!strings.Contains(out, "(target on cpu, drafter on cuda)") {
		t.Errorf("cpu and cuda stages:\n%s", out)
	}
	g, out = loadSeed(t, `devices = ["cpu"]`, `devices = ["cpu", "cuda:1"]`, block)
	if g != nil || !strings.Contains(out, "spec.hcl:16:13: error: stage cannot rebalance") ||
		!strings.Contains(out, `Stage "drafter" runs on both CPUs and GPUs (devices ["cpu", "cuda:1"])`) {
		t.Errorf("a stage on both:\n%s", out)
	}
	g, out = loadSeed(t, "", "", "rebalance {\n  stages = [\"target\", \"drafter\"]\n  devices = [\"cuda:0\", \"cuda:1\"]\n}")
	if g != nil || !strings.Contains(out, "spec.hcl:35:13: error: stages on different devices") ||
		!strings.Contains(out, "The budget's devices are cuda devices, and the stages run on cpu") {
		t.Errorf("cuda budget for cpu stages:\n%s", out)
	}
	g, out = loadSeed(t, `devices = ["cuda:0"]`, `devices = ["cuda:1"]`, "rebalance {\n  stages = [\"target\", \"drafter\"]\n  devices = [\"cuda:0\", \"cuda:1\", \"cuda:2\", \"cuda:3\", \"cuda:4\", \"cuda:5\", \"cuda:6\", \"cuda:7\"]\n}")
	if g == nil {
		t.Fatalf("a cuda budget for cuda stages:\n%s", out)
	}
	if r := g.Rebalance; r.Replicas != 8 || len(r.Devices) != 8 {
		t.Errorf("the budget is the devices: %+v", r)
	}
}

// TestWithRebalance: the stages that can move, and a rebalance made in Go
// (`dflow run --rebalance`) checked as the block is.
func TestWithRebalance(t *testing.T) {
	g, out := loadSeed(t, "", "", "")
	if g == nil {
		t.Fatal(out)
	}
	stages, why := graph.Movable(g)
	if !slices.Equal(stages, []string{"target", "drafter", "done"}) || len(why) != 1 || !strings.Contains(why[0], `stage "reader" is a source`) {
		t.Errorf("Movable: %v, why not %q", stages, why)
	}
	v, diags := g.WithRebalance(graph.Rebalance{Stages: []string{"target", "drafter"}, FromFlag: true})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if r := v.Rebalance; r.Replicas != 8 || r.Every != graph.DefaultRebalanceEvery || !r.FromFlag || g.Rebalance != nil {
		t.Errorf("WithRebalance: %+v (the original's %+v)", r, g.Rebalance)
	}
	rr, diags := g.With(graph.SetPolicy("hs", graph.RoundRobin))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	stages, why = graph.Movable(rr)
	if !slices.Equal(stages, []string{"done"}) || !slices.ContainsFunc(why, func(s string) bool { return strings.Contains(s, `edge "hs" into stage "drafter" is round_robin`) }) {
		t.Errorf("Movable with hs round_robin: %v, why not %q", stages, why)
	}
	_, diags = rr.WithRebalance(graph.Rebalance{Stages: []string{"target", "drafter"}})
	if len(diags) != 1 || !strings.Contains(diags[0].Detail, `Edge "hs" into stage "drafter" is round_robin`) ||
		!strings.Contains(diags[0].Detail, `Use policy = "shared"`) {
		t.Errorf("round_robin edge in Go: %v", diags)
	}
	_, diags = g.WithRebalance(graph.Rebalance{Stages: []string{"target", "drafter"}, Replicas: 1})
	if !diags.HasErrors() || !strings.Contains(diags[0].Detail, "rebalance: A budget of 1 replica cannot give each of the 2 stages one") {
		t.Errorf("budget of 1: %v", diags)
	}
}

// TestWithKeepsLease: a copy made by With or WithoutRebalance keeps the
// pipeline block's lease (a run across hosts reads it from the graph).
func TestWithKeepsLease(t *testing.T) {
	g, out := loadSeed(t, "", "", "pipeline \"p\" {\n  lease = \"30s\"\n}")
	if g == nil {
		t.Fatal(out)
	}
	v, diags := g.With(graph.SetReplicas("target", 4))
	if diags.HasErrors() || v.Lease != 30*time.Second || g.WithoutRebalance().Lease != 30*time.Second {
		t.Errorf("lease after With: %v %v", v.Lease, diags)
	}
}
