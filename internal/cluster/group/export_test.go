package group

import (
	"context"
)

// For package group_test's tests, which play a member against a real
// host (package host, which imports this one): an all-reduce whose
// arrival's id the test gives, and the request of a part of one.

// ReduceAs is g's all-reduce of replica's f, its arrival's id given.
func (g *Member) ReduceAs(ctx context.Context, replica int, f []float32, id string) (int, error) {
	return g.reduceAs(ctx, replica, f, id)
}

var ReducePart = reducePart
