package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/zclconf/go-cty/cty"
)

// TestResult is what RunNode observed.
type TestResult struct {
	Outputs map[string][]any   // items per output port, in arrival order
	Metrics map[string]float64 // the node's metrics at the end
}

// RunNode runs a plugin node in-process, exactly as dflow would run it as
// a stage, for plugin authors' tests: inputs are fed to the input port
// "in" (if the kind has one), outputs are collected per port. config holds
// the stage's config values (Go ints, floats, strings, bools).
func RunNode(spec nodes.Spec, config map[string]any, replicas int, inputs []any) (*TestResult, error) {
	vals := map[string]cty.Value{}
	for k, v := range config {
		cv, err := toCty(v)
		if err != nil {
			return nil, fmt.Errorf("sdk: config %q: %w", k, err)
		}
		vals[k] = cv
	}
	for _, f := range spec.Config {
		if _, ok := vals[f.Name]; !ok && f.Default != cty.NilVal {
			vals[f.Name] = f.Default
		}
	}
	cfg := graph.NewConfig(vals)
	if spec.Check != nil {
		if errs := spec.Check(cfg); len(errs) > 0 {
			return nil, fmt.Errorf("sdk: config: %v", errs[0])
		}
	}
	reg := nodes.NewRegistry()
	reg.Register(spec)
	res := &TestResult{Outputs: map[string][]any{}}
	var mu sync.Mutex
	g, err := testGraph(spec, cfg, replicas, reg, inputs, res, &mu)
	if err != nil {
		return nil, err
	}
	rep, err := engine.Run(context.Background(), g, engine.Options{Registry: reg})
	if err != nil {
		return nil, err
	}
	res.Metrics = rep.Stages["node"].Metrics
	return res, nil
}

func toCty(v any) (cty.Value, error) {
	switch x := v.(type) {
	case int:
		return cty.NumberIntVal(int64(x)), nil
	case float64:
		return cty.NumberFloatVal(x), nil
	case string:
		return cty.StringVal(x), nil
	case bool:
		return cty.BoolVal(x), nil
	}
	return cty.NilVal, fmt.Errorf("unsupported value %T", v)
}

// testGraph wires feeder -> node -> collectors through the real runtime.
func testGraph(spec nodes.Spec, cfg *graph.Config, replicas int, reg *nodes.Registry, inputs []any, res *TestResult, mu *sync.Mutex) (*graph.Graph, error) {
	ports := spec.Ports(cfg)
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "sdk_feed", Ports: func(*graph.Config) []graph.PortSpec {
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
		Kind: graph.Kind{Name: "sdk_collect", Config: []graph.Field{{Name: "port", Type: graph.String}},
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
	var body strings.Builder
	var raw map[string]json.RawMessage
	json.Unmarshal([]byte(ConfigJSON(cfg)), &raw)
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		fmt.Fprintf(&body, "    %s = %s\n", k, raw[k]) // JSON literals are HCL too
	}
	src := fmt.Sprintf("stage \"node\" {\n  node = %q\n  replicas = %d\n  config {\n%s  }\n}\n", spec.Name, max(replicas, 1), body.String())
	for _, p := range ports {
		if p.Dir == graph.In {
			src += fmt.Sprintf("stage \"feed_%s\" {\n  node = \"sdk_feed\"\n}\nedge \"in_%s\" {\n  from = feed_%s.out\n  to = node.%s\n}\n", p.Name, p.Name, p.Name, p.Name)
		} else {
			src += fmt.Sprintf("stage \"collect_%s\" {\n  node = \"sdk_collect\"\n  config {\n    port = %q\n  }\n}\nedge \"out_%s\" {\n  from = node.%s\n  to = collect_%s.in\n}\n", p.Name, p.Name, p.Name, p.Name, p.Name)
		}
	}
	l := &graph.Loader{Catalog: reg}
	g, diags := l.Load("sdk-test.hcl", []byte(src))
	if diags.HasErrors() {
		return nil, fmt.Errorf("sdk: %v", diags)
	}
	return g, nil
}
