package main

import (
	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// announceOutputs prints where g's stages write their models and
// checkpoints (nodes.Spec.Outputs) and returns the function that prints,
// after the run, which of them it wrote.
func (e *env) announceOutputs(g *graph.Graph) (written func()) {
	outs := e.registry.Outputs(g)
	nodes.PrintOutputs(e.stderr, outs, false)
	return func() { nodes.PrintOutputs(e.stderr, outs, true) }
}
