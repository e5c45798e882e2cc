package graph_test

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

func render(t *testing.T, g *graph.Graph) string {
	t.Helper()
	var b bytes.Buffer
	if err := graph.Render(&b, g, "text"); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestWith: a changed graph is a call on the graph in memory. It leaves
// the original as it was, wires the queues again (round_robin 5 on 3 is
// 2-2-1, shared one queue) and equals the graph loaded with the same
// --set overrides.
func TestWith(t *testing.T) {
	g := mustLoad(t, &graph.Loader{}, "../specs/seed.hcl")
	before := render(t, g)
	hs := g.Edge("hs")
	if hs.Fanin() != "2-2-1" || len(hs.Queues) != 3 {
		t.Fatalf("seed hs: %s, %d queues", hs.Fanin(), len(hs.Queues))
	}

	shared, diags := g.With(graph.SetPolicy("hs", graph.Shared))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if q := shared.Edge("hs").Queues; len(q) != 1 || !reflect.DeepEqual(q[0].Producers, []int{0, 1, 2, 3, 4}) || !reflect.DeepEqual(q[0].Consumers, []int{0, 1, 2}) {
		t.Errorf("shared hs queues: %+v", q)
	}
	if render(t, g) != before || g.Edge("hs").Policy != graph.RoundRobin || g.Edge("hs").Fanin() != "2-2-1" {
		t.Errorf("With changed the original:\n%s", render(t, g))
	}
	// The copy's references point at the copy.
	if e := shared.Edge("hs"); e.From.Stage != shared.Stage("target") || e.To.Edges[0] != e || shared.Stage("drafter").Port("in").Edges[0] != e {
		t.Error("the copy's ports and edges point outside it")
	}

	for _, tc := range []struct {
		changes []graph.Change
		sets    []string
	}{
		{[]graph.Change{graph.SetPolicy("hs", graph.Shared)}, []string{"edge.hs.policy=shared"}},
		{[]graph.Change{graph.SetReplicas("target", 6)}, []string{"stage.target.replicas=6"}},
		{[]graph.Change{graph.SetReplicas("target", 2), graph.SetReplicas("drafter", 6), graph.SetCapacity("hs", 3)},
			[]string{"stage.target.replicas=2", "stage.drafter.replicas=6", "edge.hs.capacity=3"}},
		{[]graph.Change{graph.SetEdge("tokens", graph.Policy(graph.RoundRobin), graph.CapacityBytes(4096))},
			[]string{"edge.tokens.policy=round_robin", "edge.tokens.capacity_bytes=4096"}},
	} {
		got, diags := g.With(tc.changes...)
		if diags.HasErrors() {
			t.Errorf("%v: %v", tc.sets, diags)
			continue
		}
		want := mustLoad(t, &graph.Loader{Sets: tc.sets}, "../specs/seed.hcl")
		if render(t, got) != render(t, want) {
			t.Errorf("With %v:\n%s\nwant, as loaded with those --set:\n%s", tc.sets, render(t, got), render(t, want))
		}
	}
	if got, _ := g.With(graph.SetReplicas("target", 6)); got.Edge("hs").Fanin() != "2-2-2" {
		t.Errorf("6 on 3: %s", got.Edge("hs").Fanin())
	}
	if render(t, g) != before {
		t.Error("With changed the original")
	}
}

// TestWithErrors: a change With cannot make is an error diagnostic naming
// the edge or stage, as the Builder words it, and no graph.
func TestWithErrors(t *testing.T) {
	g := mustLoad(t, &graph.Loader{}, "../specs/seed.hcl")
	before := render(t, g)
	for _, tc := range []struct {
		change graph.Change
		want   string
	}{
		{graph.SetPolicy("hx", graph.Shared), `no edge "hx"; did you mean "hs"?`},
		{graph.SetReplicas("targte", 2), `no stage "targte"; did you mean "target"?`},
		{graph.SetReplicas("target", 0), `stage "target": replicas must be at least 1; got 0.`},
		{graph.SetCapacity("hs", -1), `edge "hs": capacity must be at least 1; got -1.`},
		{graph.SetPolicy("hs", "fair"), `edge "hs": policy "fair" is not known.`},
		{graph.SetStage("drafter", graph.Devices()), `stage "drafter": devices must list at least one device`},
		{graph.SetStage("drafter", graph.Devices("tpu")), `stage "drafter": device "tpu" is not known`},
		{graph.SetStage("drafter", graph.Sim{ServiceTime: "fast"}), `stage "drafter": sim service_time`},
		{graph.SetStage("drafter", graph.ConfigAttr("sync", false)), `stage "drafter": Graph.With does not change a stage's config`},
	} {
		got, diags := g.With(graph.SetCapacity("hs", 4), tc.change)
		if got != nil || !diags.HasErrors() || len(diags) != 1 || !strings.Contains(diags[0].Detail, tc.want) {
			t.Errorf("%s: graph %v, diagnostics %v", tc.want, got != nil, diags)
		}
	}
	if render(t, g) != before {
		t.Error("a failed With changed the original")
	}
	// A stage's devices and sim block change like its replicas.
	got, diags := g.With(graph.SetStage("drafter", graph.Devices("cpu", "cpu"), graph.Sim{ServiceTime: "10ms"}))
	if diags.HasErrors() || got.Stage("drafter").Device(1) != "cpu" || got.Stage("drafter").Sim.ServiceTime != "10ms" || g.Stage("drafter").Sim != nil {
		t.Errorf("devices and sim: %v", diags)
	}
}
