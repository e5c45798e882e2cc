package sim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/nodes"
)

// skewed: 2 sources with 30 keys drawn Zipf(2) into 3 key_hash
// workers, then a round_robin rotation (2 on 4) to the sinks.
const skewed = `
stage "src" {
  node     = "synthetic_source"
  replicas = 2
  config {
    count        = 600
    keys         = 30
    key_skew     = 2
    service_time = "100us"
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "300us"
  }
}
stage "out" {
  node     = "synthetic_work"
  replicas = 2
}
stage "done" {
  node     = "sink"
  replicas = 4
}
edge "k" {
  from   = src.out
  to     = work.in
  policy = "key_hash"
}
edge "w" {
  from   = work.out
  to     = out.in
  policy = "round_robin"
}
edge "r" {
  from   = out.out
  to     = done.in
  policy = "round_robin"
}`

// TestKeyHashMatchesEngine: the simulator routes by the very keys the
// engine's run gives, so each replica gets the same number of items in
// both, and the diagnosis names the replica the skewed keys overload.
func TestKeyHashMatchesEngine(t *testing.T) {
	g := load(t, skewed)
	sim := simulate(t, g, Options{})
	real, err := engine.Run(context.Background(), g, engine.Options{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"work", "done"} {
		for i, r := range real.Stages[stage].Replicas {
			if s := sim.Stages[stage].Replicas[i].ItemsIn; s != r.ItemsIn {
				t.Errorf("%s replica %d: simulated %d items, the engine's run %d", stage, i, s, r.ItemsIn)
			}
		}
	}
	top := sim.Stages["work"].Replicas[graph.KeyConsumer("k0", 3)].ItemsIn
	if top < 300 {
		t.Errorf("the replica of k0, the most frequent key, got %d of 600 items", top)
	}
	diag := strings.Join(monitor.Diagnose(g, sim, nil), "\n")
	if want := "edge k: the keys are skewed: key_hash splits the items ["; !strings.Contains(diag, want) {
		t.Errorf("diagnosis lacks %q:\n%s", want, diag)
	}
}

// TestKeyHashNoKeySim: a source without keys on a key_hash edge fails
// the simulation as it fails the run.
func TestKeyHashNoKeySim(t *testing.T) {
	g := load(t, strings.Replace(strings.Replace(skewed, "keys         = 30", "", 1), "key_skew     = 2", "", 1))
	_, err := Run(g, Options{Registry: registry()})
	if !errors.Is(err, nodes.ErrNoKey) || !strings.Contains(err.Error(), `edge "k" (key_hash): stage "src" replica 0`) {
		t.Errorf("err = %v", err)
	}
}

// TestCompareKeyHash: compare takes key_hash as any policy.
func TestCompareKeyHash(t *testing.T) {
	g := load(t, skewed)
	vs, err := Compare(g, "k", []graph.Policy{graph.Shared, graph.KeyHash}, Simulator(Options{Registry: registry()}))
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || vs[1].Graph.Edge("k").Policy != graph.KeyHash || len(vs[1].MeanDepth) != 3 || vs[1].Throughput >= vs[0].Throughput {
		t.Errorf("variants: %+v", vs)
	}
}
