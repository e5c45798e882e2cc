package graph_test

import (
	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/zclconf/go-cty/cty"
)

// testRegistry holds the synthetic kinds and typed_sink, isolated from
// nodes.Default.
func testRegistry() *nodes.Registry {
	r := nodes.NewRegistry()
	synthetic.Register(r)
	r.Register(nodes.Spec{Kind: graph.Kind{
		Name: "typed_sink",
		Doc:  "a test consumer whose input type comes from its config",
		Config: []graph.Field{
			{Name: "type", Type: graph.String, Default: cty.StringVal("tokens")},
		},
		Ports: func(cfg *graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: cfg.String("type")}}
		},
	}})
	return r
}
