package sdktest

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/run"
	"github.com/zclconf/go-cty/cty"
)

// Result is what RunNode observed.
type Result struct {
	Outputs map[string][]any   // items per output port, in arrival order
	Metrics map[string]float64 // the node's metrics at the end
}

// RunNode runs a node kind as one stage of `replicas` replicas through the
// real runtime: inputs are fed to every input port, outputs are collected
// per port. config holds the stage's config values as Go values (ints,
// floats, strings, bools, slices of them), checked against the kind's
// schema and checks as a spec's would be.
func RunNode(spec nodes.Spec, config map[string]any, replicas int, inputs []any) (*Result, error) {
	reg := nodes.NewRegistry()
	reg.Register(spec)
	res := &Result{Outputs: map[string][]any{}}
	var mu sync.Mutex
	register(reg, inputs, res, &mu)

	b := graph.NewBuilder("sdktest", reg)
	var opts []graph.StageOption
	opts = append(opts, graph.Replicas(max(replicas, 1)))
	for k, v := range config {
		opts = append(opts, graph.ConfigAttr(k, v))
	}
	b.Stage("node", spec.Name, opts...)
	for _, p := range portsOf(spec, config) {
		if p.Dir == graph.In {
			b.Stage("feed_"+p.Name, "sdktest_feed")
			b.Edge("in_"+p.Name, "feed_"+p.Name+".out", "node."+p.Name)
		} else {
			b.Stage("collect_"+p.Name, "sdktest_collect", graph.ConfigAttr("port", p.Name))
			b.Edge("out_"+p.Name, "node."+p.Name, "collect_"+p.Name+".in")
		}
	}
	g, diags := b.Build()
	if diags.HasErrors() {
		return nil, fmt.Errorf("sdktest: %v", diags)
	}
	rep, err := run.Run(context.Background(), g, run.Options{Registry: reg})
	if err != nil {
		return nil, err
	}
	res.Metrics = rep.Stages["node"].Metrics
	return res, nil
}

// portsOf returns the kind's ports for config, with the kind's defaults
// for what config leaves out (a kind's ports may depend on its config;
// the builder checks the values themselves).
func portsOf(spec nodes.Spec, config map[string]any) []graph.PortSpec {
	vals := map[string]cty.Value{}
	for _, f := range spec.Config {
		if f.Default != cty.NilVal {
			vals[f.Name] = f.Default
		}
	}
	for k, v := range config {
		var cv cty.Value
		switch x := v.(type) {
		case int:
			cv = cty.NumberIntVal(int64(x))
		case float64:
			cv = cty.NumberFloatVal(x)
		case string:
			cv = cty.StringVal(x)
		case bool:
			cv = cty.BoolVal(x)
		default:
			continue // the builder converts it, or says why not
		}
		vals[k] = cv
	}
	return spec.Ports(graph.NewConfig(vals))
}

// register adds the feeding and collecting kinds.
func register(reg *nodes.Registry, inputs []any, res *Result, mu *sync.Mutex) {
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "sdktest_feed", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for _, it := range inputs {
					if err := r.Out("out").Send(ctx, it); err != nil {
						return err
					}
				}
				return nil
			}), nil
		},
	})
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "sdktest_collect", Config: []graph.Field{{Name: "port", Type: graph.String}},
			Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
			}},
		New: func(c *graph.Config) (nodes.Node, error) {
			port := c.String("port")
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					it, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					mu.Lock()
					res.Outputs[port] = append(res.Outputs[port], it)
					mu.Unlock()
				}
			}), nil
		},
	})
}
