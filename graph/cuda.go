//go:build cuda

package graph

// A cuda build runs nodes on "cuda:N" (internal/nn's CUDA backend).
func init() { CUDA = true }
