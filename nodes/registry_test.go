package nodes_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

func spec(name string) nodes.Spec {
	return nodes.Spec{
		Kind: graph.Kind{Name: name, Ports: func(*graph.Config) []graph.PortSpec { return nil }},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(context.Context, nodes.Replica) error { return nil }), nil
		},
	}
}

func TestRegistry(t *testing.T) {
	r := nodes.NewRegistry()
	r.Register(spec("b"))
	r.Register(spec("a"))
	if got := r.KindNames(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("KindNames = %v", got)
	}
	if k, ok := r.Kind("a"); !ok || k.Name != "a" {
		t.Error("Kind(a) not found")
	}
	if _, ok := r.Kind("c"); ok {
		t.Error("Kind(c) found")
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a name twice must panic")
		}
	}()
	r.Register(spec("a"))
}

func TestDefaultIsolated(t *testing.T) {
	if _, ok := nodes.Default.Kind("a"); ok {
		t.Error("a test registry leaked into Default")
	}
}

// TestOutputs: the files stages declare, in stage order, and what the
// lines before and after a run say about them.
func TestOutputs(t *testing.T) {
	r := nodes.NewRegistry()
	w := spec("writer")
	w.Outputs = func(cfg *graph.Config) []string { return []string{cfg.String("out")} }
	w.Config = []graph.Field{{Name: "out", Type: graph.String}}
	w.Ports = func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "x"}}
	}
	r.Register(w)
	s := spec("sink")
	s.Ports = func(*graph.Config) []graph.PortSpec { return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "x"}} }
	r.Register(s)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.safetensors"), filepath.Join(dir, "b.safetensors")
	src := fmt.Sprintf(`
stage "w1" {
  node = "writer"
  config {
    out = %q
  }
}
stage "s" {
  node = "sink"
}
stage "w2" {
  node = "writer"
  config {
    out = %q
  }
}
edge "e1" {
  from = w1.out
  to   = s.in
}
edge "e2" {
  from = w2.out
  to   = s.in
}`, a, b)
	g, diags := (&graph.Loader{Catalog: r}).Load("o.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	os.WriteFile(b, []byte("left as it was"), 0o644)
	outs := r.Outputs(g)
	if len(outs) != 2 || outs[0].Stage != "w1" || outs[0].Path != a || outs[1].Stage != "w2" || outs[1].Path != b {
		t.Fatalf("Outputs = %v", outs)
	}
	var before, after strings.Builder
	nodes.PrintOutputs(&before, outs, false)
	os.WriteFile(a, []byte("x"), 0o644)
	nodes.PrintOutputs(&after, outs, true)
	if want := "dflow: stage w1 writes " + a + "\ndflow: stage w2 writes " + b + "\n"; before.String() != want {
		t.Errorf("before:\n%s\nwant:\n%s", before.String(), want)
	}
	if want := "dflow: stage w1 wrote " + a + "\ndflow: stage w2 wrote nothing to " + b + "\n"; after.String() != want {
		t.Errorf("after:\n%s\nwant:\n%s", after.String(), want)
	}
}
