package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
)

func registry() *nodes.Registry {
	r := nodes.NewRegistry()
	synthetic.Register(r)
	r.Register(nodes.Spec{
		Kind: graph.Kind{Name: "opaque", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					if _, err := r.In("in").Recv(ctx); err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
				}
			}), nil
		},
	})
	return r
}

func load(t testing.TB, src string, sets ...string) *graph.Graph {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: registry(), Sets: sets}).Load("t.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return g
}

func simulate(t testing.TB, g *graph.Graph, opts Options) *report.Report {
	t.Helper()
	opts.Registry = registry()
	rep, err := Run(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Simulated || rep.Status != report.OK {
		t.Fatalf("report: simulated %v status %s", rep.Simulated, rep.Status)
	}
	for name, e := range rep.Edges {
		if e.Produced != e.Consumed {
			t.Fatalf("edge %s: produced %d consumed %d", name, e.Produced, e.Consumed)
		}
	}
	return rep
}

const pipeline = `
stage "src" {
  node = "synthetic_source"
  config {
    count        = %d
    service_time = %q
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time = %q
  }
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = work.in
  capacity = %d
}
edge "b" {
  from = work.out
  to   = sink.in
}`

// TestSaturatedPipeline: a pipeline fed faster than it works runs at its
// bottleneck's capacity: 100 items over 4 replicas of 10ms take 250ms.
func TestSaturatedPipeline(t *testing.T) {
	g := load(t, fmt.Sprintf(pipeline, 100, "0s", 4, "10ms", 8))
	rep := simulate(t, g, Options{})
	if math.Abs(rep.WallSeconds-0.250) > 1e-6 {
		t.Errorf("wall %.6fs, want 0.250s", rep.WallSeconds)
	}
	for _, r := range rep.Stages["work"].Replicas {
		if r.ItemsIn != 25 || math.Abs(r.Utilization-1) > 1e-6 {
			t.Errorf("replica %d: %d items, utilization %.4f", r.Index, r.ItemsIn, r.Utilization)
		}
	}
}

// TestMM1: exponential arrivals (mean 10ms) into one exponential server
// (mean 5ms), unbounded queue: utilization rho = 0.5 and mean queue length
// rho^2/(1-rho) = 0.5 (M/M/1).
func TestMM1(t *testing.T) {
	g := load(t, fmt.Sprintf(pipeline, 100000, "exponential(10ms)", 1, "exponential(5ms)", 1<<20))
	rep := simulate(t, g, Options{})
	const rho = 0.5
	if u := rep.Stages["work"].Replicas[0].Utilization; math.Abs(u-rho) > 0.02 {
		t.Errorf("utilization %.3f, want %.2f", u, rho)
	}
	if lq := rep.Edges["a"].Queues[0].MeanDepth; math.Abs(lq-rho*rho/(1-rho)) > 0.05 {
		t.Errorf("mean queue length %.3f, want %.2f", lq, rho*rho/(1-rho))
	}
}

const seed = `
stage "reader" {
  node = "synthetic_source"
  config {
    count = %d
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = 5
  config {
    service_time = %q
  }
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = %q
    sync         = true
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from     = reader.out
  to       = target.in
  capacity = 16
}
edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin"
  capacity = 8
}
edge "trained" {
  from = drafter.out
  to   = done.in
}`

// TestRoundRobin221Sync: 5 targets of 10ms wired 2-2-1 to 3 drafters that
// step together run at 3 items per 10ms: three times the feed rate of the
// drafter with one producer. Shared runs at the targets' 5 per 10ms.
func TestRoundRobin221Sync(t *testing.T) {
	for policy, want := range map[string]float64{"round_robin": 300, "shared": 500} {
		var snaps []*report.Snapshot
		g := load(t, fmt.Sprintf(seed, 2000, "10ms", "1ms"), "edge.hs.policy="+policy)
		simulate(t, g, Options{Interval: 500 * time.Millisecond, Observe: func(s *report.Snapshot) { snaps = append(snaps, s) }})
		if len(snaps) < 3 {
			t.Fatalf("%s: %d snapshots", policy, len(snaps))
		}
		// Steady state, between 0.5s and 1.0s.
		rate := float64(snaps[1].Edges[1].Consumed-snaps[0].Edges[1].Consumed) / 0.5
		if math.Abs(rate-want) > want*0.02 {
			t.Errorf("%s: hs carries %.1f items/s, want %.0f", policy, rate, want)
		}
	}
}

// TestDeterministic: same spec, same seeds, same report.
func TestDeterministic(t *testing.T) {
	src := fmt.Sprintf(seed, 500, "lognormal(10ms, 0.3)", "exponential(3ms)")
	a, _ := json.Marshal(simulate(t, load(t, src), Options{Interval: 100 * time.Millisecond}))
	b, _ := json.Marshal(simulate(t, load(t, src), Options{Interval: 100 * time.Millisecond}))
	if string(a) != string(b) {
		t.Error("two simulations of the same spec differ")
	}
	c, _ := json.Marshal(simulate(t, load(t, src, "stage.target.config.seed=2"), Options{Interval: 100 * time.Millisecond}))
	if string(a) == string(c) {
		t.Error("another seed gave the same report")
	}
}

// TestShapes: fan-out, fan-in, P < C rotation and uneven sync ends all
// terminate with exact counts.
func TestShapes(t *testing.T) {
	fan := load(t, `
stage "source" {
  node     = "synthetic_source"
  replicas = 2
  config {
    count        = 201
    service_time = "uniform(1ms, 3ms)"
  }
}
stage "narrow" {
  node = "synthetic_work"
  config {
    service_time = "2ms"
  }
}
stage "wide" {
  node     = "synthetic_work"
  replicas = 4
  config {
    service_time = "exponential(6ms)"
    sync         = true
  }
}
stage "sink" {
  node = "sink"
}
edge "to_narrow" {
  from = source.out
  to   = narrow.in
}
edge "to_wide" {
  from     = source.out
  to       = wide.in
  policy   = "round_robin"
  capacity = 1
}
edge "narrow_done" {
  from = narrow.out
  to   = sink.in
}
edge "wide_done" {
  from = wide.out
  to   = sink.in
}`)
	rep := simulate(t, fan, Options{})
	if got := rep.Stages["sink"].Replicas[0].ItemsIn; got != 402 {
		t.Errorf("sink got %d, want 402 (201 items on two paths)", got)
	}
	// Round-robin with P < C: producer 0 (101 items) alternates over
	// consumers 0 and 2, producer 1 (100) over 1 and 3.
	wide := rep.Stages["wide"].Replicas
	if wide[0].ItemsIn != 51 || wide[2].ItemsIn != 50 || wide[1].ItemsIn != 50 || wide[3].ItemsIn != 50 {
		t.Errorf("rotation: wide got %d %d %d %d", wide[0].ItemsIn, wide[1].ItemsIn, wide[2].ItemsIn, wide[3].ItemsIn)
	}
}

func TestFailAfter(t *testing.T) {
	g := load(t, fmt.Sprintf(pipeline, 100, "0s", 2, "1ms", 8), "stage.work.config.fail_after=5")
	rep, err := Run(g, Options{Registry: registry()})
	if err == nil || rep.Status != report.Failed || !strings.Contains(err.Error(), `stage "work" replica`) {
		t.Fatalf("err %v status %s", err, rep.Status)
	}
}

func TestModels(t *testing.T) {
	src := `
stage "src" {
  node = "synthetic_source"
  config {
    count = 10
  }
}
stage "x" {
  node = "opaque"
%s
}
edge "e" {
  from = src.out
  to   = x.in
}`
	_, err := Run(load(t, fmt.Sprintf(src, "")), Options{Registry: registry()})
	if err == nil || !strings.Contains(err.Error(), `stage "x": node kind "opaque" has no simulation model; give the stage a sim`) {
		t.Errorf("no model: %v", err)
	}
	rep := simulate(t, load(t, fmt.Sprintf(src, "  sim {\n    service_time = \"10ms\"\n  }")), Options{})
	if math.Abs(rep.WallSeconds-0.1) > 1e-6 {
		t.Errorf("sim block: wall %.4fs, want 0.1s", rep.WallSeconds)
	}
}

// TestFidelity runs real pipelines and simulates the same specs: counts
// match exactly and simulated wall time stays close to the measured one.
// The bound is loose (15%) because a loaded CI machine stretches real
// sleeps; docs/policies.md records the fidelity measured on a quiet one.
// A load that comes and goes stretches one run's sleeps and not the next
// (a replay at 1.27x its run, once, beside the whole suite on 2 cores):
// each case has three tries to land within the bounds, and a simulator
// that has drifted misses all three.
func TestFidelity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real pipelines")
	}
	for _, tc := range []struct{ name, src string }{
		{"seed-5on3-sync-round_robin", fmt.Sprintf(seed, 120, "lognormal(20ms, 0.1)", "10ms")},
		{"pipeline-4-workers", fmt.Sprintf(pipeline, 200, "1ms", 4, "uniform(5ms, 15ms)", 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := load(t, tc.src)
			var missed []string
			for range 3 {
				real, err := engine.Run(context.Background(), g, engine.Options{Registry: registry()})
				if err != nil {
					t.Fatal(err)
				}
				simd := simulate(t, g, Options{})
				for name, e := range real.Edges {
					if simd.Edges[name].Consumed != e.Consumed {
						t.Fatalf("edge %s: real %d items, simulated %d", name, e.Consumed, simd.Edges[name].Consumed)
					}
				}
				// Replaying the measured service times lands close too.
				replay := simulate(t, g, Options{From: real})
				ratio, rratio := simd.WallSeconds/real.WallSeconds, replay.WallSeconds/real.WallSeconds
				if ratio >= 0.85 && ratio <= 1.05 && rratio >= 0.85 && rratio <= 1.15 {
					return
				}
				missed = append(missed, fmt.Sprintf("simulated %.3fs, replayed %.3fs against real %.3fs (ratios %.3f, %.3f)",
					simd.WallSeconds, replay.WallSeconds, real.WallSeconds, ratio, rratio))
				t.Log(missed[len(missed)-1])
			}
			t.Errorf("outside 0.85-1.05 simulated or 0.85-1.15 replayed in every try:\n%s", strings.Join(missed, "\n"))
		})
	}
}

// BenchmarkSim simulates a million items through source -> 5 workers ->
// 3 sinks; it reports simulated items and events per second of real time.
func BenchmarkSim(b *testing.B) {
	src := `
stage "src" {
  node = "synthetic_source"
  config {
    count        = 1000000
    service_time = "exponential(1ms)"
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 5
  config {
    service_time = "lognormal(4ms, 0.3)"
  }
}
stage "sink" {
  node     = "sink"
  replicas = 3
  config {
    service_time = "2ms"
  }
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from   = work.out
  to     = sink.in
  policy = "round_robin"
}`
	g := load(b, src)
	var events int64
	start := time.Now()
	for range b.N {
		n, err := Stats(g, Options{Registry: registry()})
		if err != nil {
			b.Fatal(err)
		}
		events += n
	}
	secs := time.Since(start).Seconds()
	b.ReportMetric(float64(events)/secs, "events/s")
	b.ReportMetric(float64(b.N)*1e6/secs, "items/s")
}
