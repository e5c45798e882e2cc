package sim

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

func loadSeed(t *testing.T, sets ...string) *graph.Graph {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: registry(), Sets: sets}).LoadFile("../../specs/seed.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return g
}

func wallOf(t *testing.T, g *graph.Graph, opts Options) float64 {
	t.Helper()
	rep, err := Run(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep.WallSeconds
}

// TestPredictor: the predictor works from the graph in memory and gives
// the figures the spec re-read with --set edge.hs.policy=shared gives:
// the seed's 4.95s -> 3.03s (docs/policies.md), and the same again when
// replaying a report's service times.
func TestPredictor(t *testing.T) {
	g := loadSeed(t)
	opts := Options{Registry: registry()}
	before, after := wallOf(t, g, opts), wallOf(t, loadSeed(t, "edge.hs.policy=shared"), opts)
	predict := Predictor(g, opts)
	p, ok := predict("hs")
	if !ok || p.Before != before || p.After != after {
		t.Fatalf("predicted %+v (%v), want {%v %v} as from the spec with --set", p, ok, before, after)
	}
	if math.Abs(p.Before-4.95) > 0.05 || math.Abs(p.After-3.03) > 0.05 {
		t.Errorf("seed: %.2fs -> %.2fs, docs/policies.md has 4.95s -> 3.03s", p.Before, p.After)
	}
	if _, ok := predict("nope"); ok {
		t.Error("an unknown edge was predicted")
	}
	if g.Edge("hs").Policy != graph.RoundRobin {
		t.Error("the predictor changed the graph")
	}

	// Replaying a report: the same as the re-read spec under opts.From.
	rep, err := Run(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	replay := Options{Registry: registry(), From: rep, Seed: 7}
	p, ok = Predictor(g, replay)("hs")
	if want := wallOf(t, loadSeed(t, "edge.hs.policy=shared"), replay); !ok || p.Before != wallOf(t, g, replay) || p.After != want {
		t.Errorf("replayed: %+v, want after %v", p, want)
	}
}

// TestPredictorScalesLongRuns: a spec whose source emits more than the
// predictor simulates is simulated with its totals scaled down alike and
// its wall times scaled back up, within 1% of simulating every item, and
// with a replayed report's service times too; a spec within the bound is
// simulated whole, exactly.
func TestPredictorScalesLongRuns(t *testing.T) {
	g := load(t, fmt.Sprintf(seed, 50_000, "lognormal(10ms, 0.3)", "4ms"))
	rep, err := Run(g, Options{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []Options{{Registry: registry()}, {Registry: registry(), From: rep}} {
		whole, ok := predictor(g, opts, 0, 0)("hs")
		scaled, ok2 := predictor(g, opts, 10_000, 0)("hs")
		if !ok || !ok2 {
			t.Fatalf("no prediction: %v %v", ok, ok2)
		}
		if math.Abs(scaled.Before/whole.Before-1) > 0.01 || math.Abs(scaled.After/whole.After-1) > 0.01 {
			t.Errorf("from a report %v: scaled %+v, every item %+v: more than 1%% apart", opts.From != nil, scaled, whole)
		}
		if within, _ := predictor(g, opts, 50_000, 0)("hs"); within != whole {
			t.Errorf("from a report %v: a bound of the source's total gave %+v, want %+v", opts.From != nil, within, whole)
		}
		t.Logf("from a report %v: every item %+v, scaled from 10000 %+v", opts.From != nil, whole, scaled)
	}
}

// TestSplits: Splits ranks the seed's splits of 8 replicas as `dflow sim
// --split target,drafter=8` did by re-reading the spec per split (and as
// docs/policies.md prints them), with the bottleneck.
func TestSplits(t *testing.T) {
	g := loadSeed(t)
	opts := Options{Registry: registry()}
	got, err := Splits(g, "target", "drafter", 8, opts)
	if err != nil {
		t.Fatal(err)
	}
	// What the CLI did: a load with --set per split, stable-sorted.
	var want []Split
	for i := 1; i < 8; i++ {
		v := loadSeed(t, fmt.Sprintf("stage.target.replicas=%d", i), fmt.Sprintf("stage.drafter.replicas=%d", 8-i))
		rep, err := Run(v, opts)
		if err != nil {
			t.Fatal(err)
		}
		s := Split{A: i, B: 8 - i, WallSeconds: rep.WallSeconds, Throughput: Throughput(v, rep)}
		s.Bottleneck, s.Busy = Busiest(v, rep)
		want = append(want, s)
	}
	sort.SliceStable(want, func(i, j int) bool { return want[i].Throughput > want[j].Throughput })
	if !slices.Equal(got, want) {
		t.Errorf("splits:\n%+v\nwant, from the spec re-read:\n%+v", got, want)
	}
	var order, bottlenecks []string
	for _, s := range got {
		order = append(order, fmt.Sprintf("%d+%d", s.A, s.B))
		bottlenecks = append(bottlenecks, s.Bottleneck)
	}
	if o := strings.Join(order, " "); o != "4+4 6+2 5+3 3+5 2+6 7+1 1+7" {
		t.Errorf("ranking %s, docs/policies.md has 4+4 6+2 5+3 3+5 2+6 7+1 1+7", o)
	}
	if b := strings.Join(bottlenecks, " "); b != "target drafter target target target drafter target" {
		t.Errorf("bottlenecks %s", b)
	}
	if g.Stage("target").Replicas != 5 || g.Stage("drafter").Replicas != 3 || g.Edge("hs").Fanin() != "2-2-1" {
		t.Error("Splits changed the graph")
	}
	for _, tc := range []struct {
		a, b string
		n    int
		want string
	}{
		{"target", "drafter", 1, "at least 2"},
		{"target", "target", 8, "two different stages"},
		{"target", "drafters", 8, `no stage "drafters"; did you mean "drafter"?`},
	} {
		if _, err := Splits(g, tc.a, tc.b, tc.n, opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Splits(%s, %s, %d): %v, want %q", tc.a, tc.b, tc.n, err, tc.want)
		}
	}
}

// TestCompare: one variant per policy from the graph in memory, with the
// consumer's busy shares and the edge's queue depths.
func TestCompare(t *testing.T) {
	g := loadSeed(t)
	vs, err := Compare(g, "hs", []graph.Policy{graph.RoundRobin, graph.Shared}, Simulator(Options{Registry: registry()}))
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || vs[0].Speedup != 1 || vs[1].Speedup < 1.5 || vs[1].Speedup > 1.8 {
		t.Fatalf("variants %+v", vs)
	}
	if len(vs[0].Utilization) != 3 || len(vs[0].MeanDepth) != 3 || len(vs[1].MeanDepth) != 1 || vs[1].Graph.Edge("hs").Policy != graph.Shared {
		t.Errorf("round_robin %+v, shared %+v", vs[0], vs[1])
	}
	if d := vs[0].MeanDepth; d[2] > 0.5 || d[0] < 5 {
		t.Errorf("round_robin hs depths %v: drafter 2's queue should sit empty, the others full", d)
	}
	if math.Abs(vs[0].Throughput-60.6) > 1 || math.Abs(vs[1].Throughput-99) > 1 {
		t.Errorf("items/s %.1f and %.1f, docs/policies.md has 60.6 and 99.0", vs[0].Throughput, vs[1].Throughput)
	}
	if _, err := Compare(g, "hx", []graph.Policy{graph.Shared}, Simulator(Options{Registry: registry()})); err == nil || !strings.Contains(err.Error(), `no edge "hx"`) {
		t.Errorf("unknown edge: %v", err)
	}
	if g.Edge("hs").Policy != graph.RoundRobin {
		t.Error("Compare changed the graph")
	}
}
