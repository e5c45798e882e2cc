//go:build cuda

package gpuguard

// The guard runs before gorgonia.org/cu's init (see the package comment).
func init() { Check() }
