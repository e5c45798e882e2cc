package lm

import (
	"github.com/dflow-dev/dflow/graph"
	"github.com/zclconf/go-cty/cty"
)

func configOf(vals map[string]float64) *graph.Config {
	m := map[string]cty.Value{}
	for k, v := range vals {
		m[k] = cty.NumberFloatVal(v)
	}
	return graph.NewConfig(m)
}
