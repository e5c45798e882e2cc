// Command embed runs a dflow pipeline from Go, with no HCL: it registers a
// node kind of its own, builds a graph with graph.NewBuilder, runs it with
// package run, and prints the report's summary.
//
// The pipeline squares the numbers 1..N on three replicas fed from one
// shared queue and sums the squares:
//
//	numbers --n (shared)--> square x3 --s--> sum
//
// With -local-cluster N it runs the same pipeline, loaded from HCL, on a
// local cluster of N worker processes, each this program started as
// `embed worker --join URL ...`: a worker with this program's own node
// kinds (worker.go). `embed worker` also joins a cluster of one's own,
// beside `dflow worker`s.
//
// It lives in a module of its own (see go.mod), so it can import only
// dflow's public packages, as any user's program.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/run"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := worker(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "embed:", err)
			os.Exit(1)
		}
		return
	}
	n := flag.Int("n", 1000, "square and sum the numbers 1..N (the sum, a float64 metric, is exact for N up to 300000, its sums below 2^53)")
	local := flag.Int("local-cluster", 0, "run on a local cluster of `N` worker processes of this program")
	log := flag.Bool("log", false, "with -local-cluster, print the cluster's lines (where each replica runs, restarts) on stderr")
	flag.Parse()
	var err error
	if *local > 0 {
		logw := io.Discard
		if *log {
			logw = os.Stderr
		}
		err = onCluster(*n, *local, os.Stdout, logw)
	} else {
		err = pipeline(*n, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func pipeline(n int, w io.Writer) error {
	reg := nodes.NewRegistry()
	register(reg)
	b := graph.NewBuilder("embed", reg)
	b.Stage("numbers", "numbers", graph.ConfigAttr("count", n))
	b.Stage("square", "square", graph.Replicas(3))
	b.Stage("sum", "sum")
	b.Edge("n", "numbers.out", "square.in", graph.Shared, graph.Capacity(16))
	b.Edge("s", "square.out", "sum.in")
	g, diags := b.Build()
	if diags.HasErrors() {
		return diags
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	if err != nil {
		return err
	}
	rep.Summarize(w)
	fmt.Fprintf(w, "sum of squares of 1..%d = %.0f\n", n, rep.Stages["sum"].Metrics["sum"])
	return nil
}

// register adds the three node kinds: a source of the numbers 1..count,
// a stage that squares each, and a sink that adds them up.
func register(reg *nodes.Registry) {
	port := func(name string, dir graph.Direction) graph.PortSpec {
		return graph.PortSpec{Name: name, Dir: dir, Type: "int"}
	}
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "numbers", Doc: "emits the numbers 1..count",
			Config: []graph.Field{{Name: "count", Type: graph.Int, Required: true, Doc: "how many"}},
			Ports:  func(*graph.Config) []graph.PortSpec { return []graph.PortSpec{port("out", graph.Out)} }},
		New: func(cfg *graph.Config) (nodes.Node, error) {
			count := cfg.Int("count")
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for i := r.Index() + 1; i <= count; i += r.Replicas() {
					if err := r.Out("out").Send(ctx, i); err != nil {
						return err
					}
				}
				return nil
			}), nil
		},
		Total: func(cfg *graph.Config) int64 { return int64(cfg.Int("count")) },
		// the same numbers on every start: on a cluster, a replica lost
		// with its worker resumes elsewhere
		Resumes: true,
	})
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "square", Doc: "squares each number",
			Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{port("in", graph.In), port("out", graph.Out)}
			}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					item, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil // every producer has finished: the runtime says so
					} else if err != nil {
						return err
					}
					x := item.(int)
					if err := r.Out("out").Send(ctx, x*x); err != nil {
						return err
					}
				}
			}), nil
		},
		// one number out for each in, nothing kept between them: on a
		// cluster, a replica lost with its worker restarts elsewhere
		Stateless: true, OneForOne: true,
	})
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "sum", Doc: "adds up what it receives, as the metric sum",
			Ports: func(*graph.Config) []graph.PortSpec { return []graph.PortSpec{port("in", graph.In)} }},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					item, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
					r.Metrics().Add("sum", float64(item.(int)))
				}
			}), nil
		},
	})
}
