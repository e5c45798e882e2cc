package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"syscall"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/run"
)

// The program as a cluster's worker: `embed worker --join URL` joins the
// cluster whose server is at URL and runs the replicas its coordinators
// place here, as `dflow worker` does, with this program's node kinds (its
// own three and dflow's synthetic ones). `embed -local-cluster N` is such
// a cluster's coordinator: it starts N of these workers itself.

// The numbers cross between workers as 8 bytes, little-endian: an item
// type of one's own needs a wire encoding to leave its process.
func init() {
	items.Register(items.Codec{Wire: "embed.int", Type: reflect.TypeFor[int](),
		Encode: func(item any) [][]byte { return [][]byte{binary.LittleEndian.AppendUint64(nil, uint64(item.(int)))} },
		Decode: func(b []byte) (any, error) {
			if len(b) != 8 {
				return nil, fmt.Errorf("embed.int: %d bytes, want 8", len(b))
			}
			return int(binary.LittleEndian.Uint64(b)), nil
		}})
}

// registry has the kinds this program's workers build: a job's spec is
// loaded with it on every worker, so the workers of one cluster have the
// same kinds.
func registry() *nodes.Registry {
	reg := nodes.NewRegistry()
	register(reg)
	synthetic.Register(reg)
	return reg
}

// worker is `embed worker`: its flags are those of `dflow worker` that
// run.Cluster's Local passes its workers.
func worker(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	o := run.WorkerOptions{Registry: registry()}
	fs.StringVar(&o.URL, "join", "", "the cluster's server `URL`")
	fs.StringVar(&o.Name, "name", "", "the worker's `NAME` (default: host-pid)")
	fs.StringVar(&o.Token, "token", "", "the cluster's `TOKEN` (default $"+run.TokenEnv+")")
	fs.BoolVar(&o.Once, "once", false, "leave after one run")
	dirs := func(name, usage string, to *[]string) {
		fs.Func(name, usage, func(v string) error { *to = append(*to, v); return nil })
	}
	dirs("plugins", "a `DIR` of plugins this worker may start (repeatable)", &o.PluginDirs)
	dirs("write", "a `DIR` the jobs' nodes may write under (repeatable)", &o.Write)
	dirs("read", "a `DIR` the jobs' nodes may read under (repeatable)", &o.Read)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if o.URL == "" {
		return errors.New("worker: --join URL is required")
	}
	// SIGTERM leaves; so does Ctrl-C, but for a worker that a local
	// cluster started, which leaves the terminal's Ctrl-C to its
	// coordinator (that drains the run).
	stop := []os.Signal{syscall.SIGTERM}
	if os.Getenv(run.LocalWorkerEnv) == "" {
		stop = append(stop, os.Interrupt)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), stop...)
	defer cancel()
	return run.Worker(ctx, o)
}

// clusterSpec is the pipeline of main.go in HCL: a cluster's workers load
// a job's graph from its source.
const clusterSpec = `
stage "numbers" {
  node = "numbers"
  config {
    count = %d
  }
}
stage "square" {
  node     = "square"
  replicas = 3
}
stage "sum" {
  node = "sum"
}
edge "n" {
  from     = numbers.out
  to       = square.in
  policy   = "shared"
  capacity = 16
}
edge "s" {
  from = square.out
  to   = sum.in
}
`

// onCluster runs the pipeline on a local cluster of workers workers,
// each this program (`embed worker ...`), with the sum on the last; the
// cluster's lines go to log.
func onCluster(n, workers int, w, log io.Writer) error {
	src := fmt.Appendf(nil, clusterSpec, n)
	g, diags := (&graph.Loader{Catalog: registry()}).Load("embed.hcl", src)
	if diags.HasErrors() {
		return diags
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: registry(), Cluster: &run.Cluster{
		Local: workers, Src: src, Log: log,
		Place: map[string][]string{"sum": {fmt.Sprintf("local%d", workers)}},
	}})
	if err != nil {
		return err
	}
	rep.Summarize(w)
	var on []string
	for _, name := range rep.StageNames() {
		for _, r := range rep.Stages[name].Replicas {
			on = append(on, r.Worker)
		}
	}
	slices.Sort(on)
	fmt.Fprintf(w, "sum of squares of 1..%d = %.0f, on workers %v\n", n, rep.Stages["sum"].Metrics["sum"], slices.Compact(on))
	return nil
}
