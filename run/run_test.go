package run_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

func load(t *testing.T, reg *nodes.Registry, src string) *graph.Graph {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return g
}

// TestDeadlockIsPublic: a deadlocked run's error is a *run.Deadlock a Go
// caller can inspect, with the cycle and the fix.
func TestDeadlockIsPublic(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	g := load(t, reg, `
stage "src" {
  node = "synthetic_source"
  config {
    count = 100000
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 3
}
stage "step" {
  node     = "synthetic_work"
  replicas = 2
  config {
    sync = true
  }
}
stage "done" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = work.in
  policy   = "round_robin"
  capacity = 2
}
edge "b" {
  from     = work.out
  to       = step.in
  policy   = "round_robin"
  capacity = 2
}
edge "c" {
  from = step.out
  to   = done.in
}`)
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	var d *run.Deadlock
	if !errors.As(err, &d) || len(d.Cycle) < 2 || !strings.Contains(d.Fix, "shared") {
		t.Fatalf("err %v (%T)", err, err)
	}
	if rep.Status != report.Failed || rep.Error != err.Error() {
		t.Errorf("report: %s %q", rep.Status, rep.Error)
	}
}

// TestFailedConstruction: a node that cannot be built fails New, and Run
// then returns the failed report (every stage, nothing run) and the same
// error without building anything again.
func TestFailedConstruction(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	builds := 0
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "broken", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) { builds++; return nil, errors.New("no weights") },
	})
	g := load(t, reg, `
stage "src" {
  node = "synthetic_source"
  config {
    count = 3
  }
}
stage "b" {
  node = "broken"
}
edge "e" {
  from = src.out
  to   = b.in
}`)
	p, err := run.New(g, run.Options{Registry: reg})
	if err == nil || !strings.Contains(err.Error(), "no weights") {
		t.Fatalf("New: %v", err)
	}
	rep, rerr := p.Run(context.Background())
	if rerr != err || rep.Status != report.Failed || len(rep.Stages) != 2 || rep.Edges["e"].Produced != 0 || builds != 1 {
		t.Errorf("Run: %v, status %s, %d stages, built %d times", rerr, rep.Status, len(rep.Stages), builds)
	}
}

// Example runs a two-stage pipeline whose consumer is a node kind of the
// caller's own, registered in a registry of its own.
func Example() {
	reg := nodes.NewRegistry()
	synthetic.Register(reg) // synthetic_source
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "count", Ports: func(*graph.Config) []graph.PortSpec {
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
					r.Metrics().Add("seen", 1)
				}
			}), nil
		},
	})
	g, diags := (&graph.Loader{Catalog: reg}).Load("example.hcl", []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 100
  }
}
stage "counter" {
  node     = "count"
  replicas = 2
}
edge "items" {
  from   = src.out
  to     = counter.in
  policy = "shared"
}`))
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	e := rep.Edges["items"]
	fmt.Println(rep.Status, e.Produced, e.Consumed, rep.Stages["counter"].Metrics["seen"])
	// Output: ok 100 100 100
}
