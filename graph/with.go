package graph

import (
	"slices"

	"github.com/hashicorp/hcl/v2"
)

// A Change is one edit of a built graph, for Graph.With: an edge's policy
// or capacity, a stage's replicas, devices or sim block. Make one with
// SetPolicy, SetCapacity, SetReplicas, or SetEdge and SetStage with the
// Builder's options.
type Change struct {
	kind, name string // kind "edge" or "stage"
	edge       []EdgeOption
	stage      []StageOption
}

// SetEdge changes the named edge's attributes with the Builder's edge
// options: a Policy, Capacity, CapacityBytes.
func SetEdge(edge string, opts ...EdgeOption) Change {
	return Change{kind: "edge", name: edge, edge: opts}
}

// SetStage changes the named stage's attributes with the Builder's stage
// options: Replicas, Devices, a Sim value. A stage's config decides its
// ports, so ConfigAttr is not a change With makes: build the graph again.
func SetStage(stage string, opts ...StageOption) Change {
	return Change{kind: "stage", name: stage, stage: opts}
}

// SetPolicy sets the named edge's policy: SetPolicy("hs", Shared).
func SetPolicy(edge string, p Policy) Change { return SetEdge(edge, p) }

// SetCapacity sets the bound of each of the named edge's queues.
func SetCapacity(edge string, n int) Change { return SetEdge(edge, Capacity(n)) }

// SetReplicas sets how many replicas run the named stage.
func SetReplicas(stage string, n int) Change { return SetStage(stage, Replicas(n)) }

// With returns a copy of g with the changes applied in order, checked as
// the Builder checks the same attributes (a known policy, counts of at
// least 1 and at most their limit, at least one known device) and its
// queues wired again (Wire) for the new policies and replica counts. g
// itself is left as it was, and the copy shares nothing with it that a
// change touches. An unknown edge or stage, or a bad value, is an error
// diagnostic naming the edge or stage, and the Graph is then nil, as with
// Builder.Build.
//
//	shared, diags := g.With(graph.SetPolicy("hs", graph.Shared))
func (g *Graph) With(changes ...Change) (*Graph, hcl.Diagnostics) {
	b := newBuilder(nil, g.Filename)
	b.g = g.clone()
	for _, c := range changes {
		b.change(c)
	}
	if b.diags.HasErrors() {
		sortDiagnostics(b.diags)
		return nil, b.diags
	}
	for _, e := range b.g.Edges {
		if e.From != nil && e.To != nil {
			e.Queues = Wire(e.Policy, e.From.Stage.Replicas, e.To.Stage.Replicas)
		}
	}
	return b.g, b.diags
}

func (b *Builder) change(c Change) {
	switch c.kind {
	case "edge":
		e, err := b.g.lookupEdge(c.name)
		if err != nil {
			b.errorf(hcl.Range{}, "unknown edge", "%s", sentence(err.Error()))
			return
		}
		d := &edgeDraft{name: e.Name}
		for _, o := range c.edge {
			o.applyEdge(d)
		}
		b.edgeAttrs(e, d)
	case "stage":
		s, err := b.g.lookupStage(c.name)
		if err != nil {
			b.errorf(hcl.Range{}, "unknown stage", "%s", sentence(err.Error()))
			return
		}
		d := &stageDraft{name: s.Name, node: s.Node}
		for _, o := range c.stage {
			o.applyStage(d)
		}
		if len(d.config) > 0 {
			b.errorf(hcl.Range{}, "config not changed", "stage %q: Graph.With does not change a stage's config "+
				"(config %s), which decides its ports; build the graph again with the new value.", s.Name, d.config[0].key)
			return
		}
		b.stageAttrs(s, d)
	default:
		b.errorf(hcl.Range{}, "empty change", "%s", "Graph.With: a Change is made with SetEdge, SetStage, SetPolicy, SetCapacity or SetReplicas.")
	}
}

// clone copies g's stages, ports, edges and queues, re-pointing every
// reference between them at the copies. Kinds, configs, sim blocks and
// plugins are shared: nothing changes them after Build (a Change replaces
// a stage's Sim and Devices rather than editing them).
func (g *Graph) clone() *Graph {
	c := &Graph{
		Filename:    g.Filename,
		Name:        g.Name,
		Description: g.Description,
		Lease:       g.Lease,
		Plugins:     slices.Clone(g.Plugins),
		Rebalance:   g.Rebalance,
		stages:      make(map[string]*Stage, len(g.Stages)),
		edges:       make(map[string]*Edge, len(g.Edges)),
	}
	ports := map[*Port]*Port{}
	copyPorts := func(s *Stage, ps []*Port) []*Port {
		out := make([]*Port, len(ps))
		for i, p := range ps {
			np := *p
			np.Stage = s
			ports[p], out[i] = &np, &np
		}
		return out
	}
	for _, s := range g.Stages {
		ns := *s
		ns.Devices = slices.Clone(s.Devices)
		ns.Inputs = copyPorts(&ns, s.Inputs)
		ns.Outputs = copyPorts(&ns, s.Outputs)
		c.Stages = append(c.Stages, &ns)
		c.stages[ns.Name] = &ns
	}
	edges := map[*Edge]*Edge{}
	for _, e := range g.Edges {
		ne := *e
		ne.From, ne.To = ports[e.From], ports[e.To]
		ne.Queues = make([]Queue, len(e.Queues))
		for i, q := range e.Queues {
			ne.Queues[i] = Queue{Index: q.Index, Producers: slices.Clone(q.Producers), Consumers: slices.Clone(q.Consumers)}
		}
		c.Edges = append(c.Edges, &ne)
		c.edges[ne.Name] = &ne
		edges[e] = &ne
	}
	for old, np := range ports {
		np.Edges = make([]*Edge, len(old.Edges))
		for i, e := range old.Edges {
			np.Edges[i] = edges[e]
		}
	}
	return c
}
