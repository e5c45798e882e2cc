package nodes_test

import (
	"context"
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
