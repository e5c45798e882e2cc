package graph_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

type keyed string

func (k keyed) Key() string { return string(k) }

func TestKeyHashWire(t *testing.T) {
	got := graph.Wire(graph.KeyHash, 2, 3)
	want := []graph.Queue{{0, []int{0, 1}, []int{0}}, {1, []int{0, 1}, []int{1}}, {2, []int{0, 1}, []int{2}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Wire(key_hash, 2, 3) = %v", got)
	}
	if graph.Wire(graph.KeyHash, 0, 3) != nil || graph.Wire("fair", 2, 3) != nil {
		t.Error("no replicas or an unknown policy: want no queues")
	}
}

// TestRouters: the one rotation, and key_hash's routing by hash(key).
func TestRouters(t *testing.T) {
	edge := func(pol graph.Policy, p, c int) *graph.Edge {
		src := &graph.Stage{Name: "src", Replicas: p}
		return &graph.Edge{Name: "e", Policy: pol, From: &graph.Port{Stage: src, Name: "out"}, Queues: graph.Wire(pol, p, c)}
	}
	for _, tc := range []struct {
		pol  graph.Policy
		p, c int
	}{{graph.Shared, 3, 2}, {graph.RoundRobin, 5, 3}, {graph.RoundRobin, 3, 3}} {
		if r := tc.pol.Router(edge(tc.pol, tc.p, tc.c), 0); r != nil {
			t.Errorf("%s %d on %d: a router over one queue (%T), want nil: the fast path", tc.pol, tc.p, tc.c, r)
		}
	}
	r := graph.RoundRobin.Router(edge(graph.RoundRobin, 2, 5), 0) // producer 0 feeds consumers 0, 2, 4
	var turns []int
	for range 7 {
		i, err := r.Route(nil)
		if err != nil {
			t.Fatal(err)
		}
		turns = append(turns, i)
	}
	if fmt.Sprint(turns) != "[0 1 2 0 1 2 0]" {
		t.Errorf("rotation = %v", turns)
	}

	e := edge(graph.KeyHash, 2, 3)
	kr := graph.KeyHash.Router(e, 1)
	for _, k := range []string{"a", "user-17", "k0", "k1", "k2"} {
		i, err := kr.Route(keyed(k))
		if err != nil || i != graph.KeyConsumer(k, 3) || i != int(graph.KeyHashOf(k)%3) {
			t.Errorf("key %q: queue %d, %v; want %d", k, i, err, graph.KeyConsumer(k, 3))
		}
	}
	for _, item := range []any{42, keyed("")} {
		_, err := kr.Route(item)
		if !errors.Is(err, graph.ErrNoKey) || !strings.Contains(err.Error(), `edge "e" (key_hash): stage "src" replica 1 sent a`) {
			t.Errorf("%v: err = %v", item, err)
		}
	}
	// One consumer: still a router, so that a missing key is an error.
	if graph.KeyHash.Router(edge(graph.KeyHash, 2, 1), 0) == nil {
		t.Error("key_hash over one queue: want a router")
	}
	// FNV-1a 64's published test vectors: the hash is stable everywhere.
	for s, h := range map[string]uint64{"": 0xcbf29ce484222325, "a": 0xaf63dc4c8601ec8c, "foobar": 0x85944171f73967e8} {
		if got := graph.KeyHashOf(s); got != h {
			t.Errorf("KeyHashOf(%q) = %#x, want %#x", s, got, h)
		}
	}
}

// TestPolicyNames: one list makes every hint; key_hash loads from HCL
// and --set.
func TestPolicyNames(t *testing.T) {
	if got := graph.PolicyList(); got != `"round_robin", "shared" and "key_hash"` {
		t.Errorf("PolicyList = %s", got)
	}
	for _, p := range graph.Policies {
		if !p.Known() || p.Name() != string(p) {
			t.Errorf("%s: known %v", p, p.Known())
		}
	}
	if graph.Policy("fair").Known() {
		t.Error(`"fair" is no policy`)
	}
	spec := keyedSpec
	g, diags := (&graph.Loader{Catalog: testRegistry()}).Load("k.hcl", []byte(spec))
	if diags.HasErrors() || g.Edge("hot").Policy != graph.KeyHash || len(g.Edge("hot").Queues) != 3 {
		t.Fatalf("key_hash spec: %v", diags)
	}
	g, diags = (&graph.Loader{Catalog: testRegistry(), Sets: []string{"edge.cold.policy=key_hash"}}).Load("k.hcl", []byte(spec))
	if diags.HasErrors() || g.Edge("cold").Policy != graph.KeyHash {
		t.Fatalf("--set key_hash: %v", diags)
	}
	_, diags = (&graph.Loader{Catalog: testRegistry(), Sets: []string{"edge.cold.policy=key-hash"}}).Load("k.hcl", []byte(spec))
	if want := `policy "key-hash" is not known; did you mean "key_hash"? The policies are "round_robin", "shared" and "key_hash".`; !strings.Contains(diags.Error(), want) {
		t.Errorf("--set key-hash: %v", diags)
	}
	_, diags = (&graph.Loader{Catalog: testRegistry()}).Load("k.hcl", []byte(strings.Replace(spec, `"shared"`, `"hashed"`, 1)))
	if want := `edge "cold": policy "hashed" is not known. The policies are "round_robin", "shared" and "key_hash".`; !strings.Contains(diags.Error(), want) {
		t.Errorf("hashed: %v", diags)
	}
	b := graph.NewBuilder("b", testRegistry())
	b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 1), graph.ConfigAttr("keys", 4))
	b.Stage("dst", "sink", graph.Replicas(2))
	b.Edge("e", "src.out", "dst.in", graph.KeyHash)
	if g, diags := b.Build(); diags.HasErrors() || g.Edge("e").Policy != graph.KeyHash {
		t.Errorf("builder: %v", diags)
	}
}

const keyedSpec = `
pipeline "keyed" {
  description = "key_hash: the key picks the consumer"
}
stage "src" {
  node     = "synthetic_source"
  replicas = 2
  config {
    count = 100
    keys  = 10
  }
}
stage "dst" {
  node     = "synthetic_work"
  replicas = 3
}
stage "done" {
  node = "sink"
}
edge "hot" {
  from   = src.out
  to     = dst.in
  policy = "key_hash"
}
edge "cold" {
  from   = dst.out
  to     = done.in
  policy = "shared"
}`

func TestRenderKeyHash(t *testing.T) {
	g, diags := (&graph.Loader{Catalog: testRegistry()}).Load("keyed.hcl", []byte(keyedSpec))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	for _, f := range graph.Formats {
		var b bytes.Buffer
		if err := graph.Render(&b, g, f); err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", "render", "keyed."+f)
		if *update {
			os.WriteFile(golden, b.Bytes(), 0o644)
		}
		want, _ := os.ReadFile(golden)
		if b.String() != string(want) {
			t.Errorf("%s differs from %s:\n%s", f, golden, b.String())
		}
		if !strings.Contains(b.String(), "key_hash") {
			t.Errorf("%s does not name the policy", f)
		}
	}
}
