package run_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

// TestMain makes this test binary a local cluster's worker when started
// as one (`TEST worker --join URL --name N --once ...`, the arguments a
// run.Cluster with Local gives its WorkerCommand, as to dflow's): the
// tests below run on local clusters without building dflow.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(testWorker(os.Args[2:]))
	}
	testutil.RaceExitAtOnce()
	// and fails the package's tests if a goroutine they started outlives
	// them
	testutil.Main(m)
}

// testWorker is `dflow worker` for the synthetic kinds, through the
// public API (run.Worker): it joins, runs one job and leaves.
func testWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	o := run.WorkerOptions{Registry: nodes.NewRegistry()}
	synthetic.Register(o.Registry)
	fs.StringVar(&o.URL, "join", "", "")
	fs.StringVar(&o.Name, "name", "", "")
	fs.BoolVar(&o.Once, "once", false, "")
	for f, dirs := range map[string]*[]string{"plugins": &o.PluginDirs, "write": &o.Write, "read": &o.Read} {
		fs.Func(f, "", func(v string) error { *dirs = append(*dirs, v); return nil })
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := run.Worker(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "test worker:", err)
		return 1
	}
	return 0
}

// bottleneckSpec: a fast source, one slow worker, a sink; the worker
// limits the run, and the diagnosis says so.
const bottleneckSpec = `
variable "items" {
  default = 200
}
variable "service" {
  default = "2ms"
}
stage "src" {
  node = "synthetic_source"
  config {
    count = var.items
  }
}
stage "work" {
  node = "synthetic_work"
  config {
    service_time = var.service
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
}`

// TestDiagnosisThroughRun: a report from run carries the diagnosis
// (dflow run added it itself before; a Go program got none). Example_cluster
// shows it on a local cluster.
func TestDiagnosisThroughRun(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	g := load(t, reg, bottleneckSpec)
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	if err != nil || rep.Status != report.OK || rep.Edges["b"].Consumed != 200 {
		t.Fatalf("%v, status %s, %d through b", err, rep.Status, rep.Edges["b"].Consumed)
	}
	if len(rep.Diagnosis) == 0 || !strings.HasPrefix(rep.Diagnosis[0], "stage work limits throughput") {
		t.Errorf("diagnosis %q", rep.Diagnosis)
	}
	// The same as the caller's own, with the simulator's estimate.
	if again := run.Diagnose(g, rep, reg); strings.Join(again, "\n") != strings.Join(rep.Diagnosis, "\n") {
		t.Errorf("run.Diagnose %q, the report's %q", again, rep.Diagnosis)
	}

}

// TestClusterOptions: a cluster run asked for wrongly fails before
// anything starts, with words, and its report still lists the graph.
func TestClusterOptions(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	g := load(t, reg, bottleneckSpec) // loaded from bytes: no file to read
	for _, tc := range []struct {
		c    run.Cluster
		want string
	}{
		{run.Cluster{}, "exactly one of Cluster.URL, Cluster.Local and Cluster.Serve"},
		{run.Cluster{URL: "nats://127.0.0.1:1", Local: 2}, "exactly one of"},
		{run.Cluster{Local: -1, Serve: ""}, "Cluster.Local -1"},
		{run.Cluster{Serve: "127.0.0.1:0", Creds: "x.creds"}, "Cluster.Creds is for a server of your own"},
		{run.Cluster{Local: 1}, "give Cluster.Src"},
		{run.Cluster{Local: 1, Src: []byte(bottleneckSpec), WorkerCommand: []string{"/nonexistent/dflow"}, Log: io.Discard},
			"starting local worker 1 (/nonexistent/dflow)"},
	} {
		p, err := run.New(g, run.Options{Registry: reg, Cluster: &tc.c})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
			continue
		}
		rep, rerr := p.Run(context.Background())
		if rerr != err || rep.Status != report.Failed || len(rep.Stages) != 3 || len(rep.Edges) != 2 {
			t.Errorf("%+v: Run %v, status %s, %d stages", tc.c, rerr, rep.Status, len(rep.Stages))
		}
		p.Close()
	}
}
