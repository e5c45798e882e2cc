package share

import (
	"context"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
)

// ranked gives the node of a stage whose replicas step together the
// places of their ranks across the workers (nodes.WithRankPlacer; package
// ranks).
func (l *links) ranked(s *graph.Stage, n nodes.Node) nodes.Node {
	if l.syncs == nil || !l.syncs(s) {
		return n
	}
	place := func(ctx context.Context, r nodes.Replica) (nodes.RankPlace, error) {
		return l.ranks.Place(ctx, s, r.Index())
	}
	run := nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		return n.Run(nodes.WithRankPlacer(ctx, place), r)
	})
	return engine.Wrapped(n, run)
}
