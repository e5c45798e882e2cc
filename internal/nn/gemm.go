package nn

import "gonum.org/v1/gonum/blas/blas32"

// sgemm is the one matrix product every kernel uses (row-major, as
// gonum's blas32). By default it is gonum's pure-Go implementation, which
// works everywhere; building with -tags openblas (cgo, libopenblas-dev)
// swaps in OpenBLAS. blasName names the one in use (the CPU backend's Name).
//
// sgemm1 is the same product for callers that already run one per core
// (the attention heads): it adds no parallelism of its own where the
// backend lets it (OpenBLAS; gonum's sgemm always splits large products).
var (
	sgemm    = blas32.Implementation().Sgemm
	sgemm1   = blas32.Implementation().Sgemm
	blasName = "gonum"
)
