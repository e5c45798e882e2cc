package nodes

import (
	"context"
	"time"
)

// RankPlace is where a replica of a group stage runs as a distributed
// rank sees it (torchrun's environment: MASTER_ADDR, MASTER_PORT,
// LOCAL_RANK, LOCAL_WORLD_SIZE).
type RankPlace struct {
	// MasterAddr and MasterPort are where rank 0 listens for the others:
	// rank 0's host as the others reach it, and a port free there, fresh
	// for each attempt of the group, the same for every member.
	MasterAddr string
	MasterPort int
	// LocalRank is the replica's rank among the group's members on its
	// host, LocalWorldSize how many those are.
	LocalRank, LocalWorldSize int
	// LocalDevices are the devices of the group's members on the
	// replica's host, by local rank ("cpu", "cuda:N" in dflow's
	// numbering); nil: only the replica's own is known.
	LocalDevices []string
	// PeerLoss, for a group that restarts whole (Spec.Whole), is how long
	// a rank whose process failed waits for the runtime to stop the group
	// and start it again before its failure fails the run: a rank whose
	// peer's host was lost fails at once (its collective's connection
	// closed), while the runtime counts that host lost only after its
	// lease. 0: it fails the run at once.
	PeerLoss time.Duration
}

// RankPlacer says where replica r runs as a distributed rank sees it.
type RankPlacer func(ctx context.Context, r Replica) (RankPlace, error)

type rankPlacerKey struct{}

// WithRankPlacer returns ctx carrying f: a runtime that puts a group
// stage's replicas on several hosts (a cluster's worker) gives the
// stage's node a context that says where each rank runs, for a node that
// starts distributed ranks (a plugin's group kind).
func WithRankPlacer(ctx context.Context, f RankPlacer) context.Context {
	return context.WithValue(ctx, rankPlacerKey{}, f)
}

// RankPlacerFrom returns the RankPlacer ctx carries, or nil.
func RankPlacerFrom(ctx context.Context) RankPlacer {
	f, _ := ctx.Value(rankPlacerKey{}).(RankPlacer)
	return f
}
