package nodes_test

import (
	"context"
	"fmt"
	"io"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/run"
)

// A node kind: a source of the numbers 1..count, split over its replicas,
// and a consumer whose replicas step together, each step summing over
// the group what every replica received (a data-parallel step in
// miniature).
func Example() {
	reg := nodes.NewRegistry()
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "count",
			Config: []graph.Field{{Name: "to", Type: graph.Int, Required: true}},
			Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "number"}}
			}},
		New: func(cfg *graph.Config) (nodes.Node, error) {
			to := cfg.Int("to")
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for i := 1 + r.Index(); i <= to; i += r.Replicas() {
					if err := r.Out("out").Send(ctx, float32(i)); err != nil {
						return err
					}
				}
				return nil // the edge ends when every replica has returned
			}), nil
		},
	})
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "step", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "number"}}
		}},
		Sync: nodes.Always, // replicas meet at a collective per item
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				defer r.Group().Leave() // the others go on without this one
				for {
					item, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
					buf := []float32{item.(float32)}
					if _, err := r.Group().AllReduceSum(ctx, buf); err != nil {
						return err
					}
					if r.Index() == 0 {
						r.Metrics().Add("sum", float64(buf[0]))
					}
				}
			}), nil
		},
	})
	b := graph.NewBuilder("example", reg)
	b.Stage("count", "count", graph.ConfigAttr("to", 6))
	b.Stage("step", "step", graph.Replicas(2))
	b.Edge("numbers", "count.out", "step.in", graph.RoundRobin, graph.Capacity(2))
	g, diags := b.Build()
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rep.Status, rep.Edges["numbers"].Consumed, rep.Stages["step"].Metrics["sum"])
	// Output: ok 6 21
}
