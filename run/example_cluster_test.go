package run_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/run"
)

// Example_cluster runs a pipeline on a local cluster: an embedded server
// on loopback and two worker processes, the source and its consumer on
// the first (Place), the sink on the second. The workers load the spec
// from its source; the report merges theirs and carries the diagnosis.
//
// The worker processes are this program's own executable (the default
// Cluster.WorkerCommand), started as `PROGRAM worker --join URL ...`:
// right for dflow, and here for the test binary, which TestMain makes a
// worker. A program of your own sets WorkerCommand to []string{"dflow"}.
//
// Stage work takes 100 ms an item, so that what an item costs between the
// workers (a few milliseconds on a loaded machine) leaves it well above
// the 80% busy at which the diagnosis names it.
func Example_cluster() {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	src := []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 40
  }
}
stage "work" {
  node = "synthetic_work"
  config {
    service_time = "100ms"
  }
}
stage "done" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = work.in
  capacity = 8
}
edge "b" {
  from = work.out
  to   = done.in
}`)
	g, diags := (&graph.Loader{Catalog: reg}).Load("pipeline.hcl", src)
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg, Cluster: &run.Cluster{
		Local: 2, Src: src, Log: io.Discard,
		Place: map[string][]string{"src": {"local1"}, "work": {"local1"}, "done": {"local2"}},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	var workers []string
	for _, name := range rep.StageNames() {
		for _, r := range rep.Stages[name].Replicas {
			workers = append(workers, r.Worker)
		}
	}
	slices.Sort(workers)
	fmt.Println(rep.Status, rep.Edges["b"].Consumed, slices.Compact(workers))
	if len(rep.Diagnosis) > 0 {
		first, _, _ := strings.Cut(rep.Diagnosis[0], ":") // the figures vary from run to run
		fmt.Println(first)
	}
	// Output:
	// ok 40 [local1 local2]
	// stage work limits throughput
}
