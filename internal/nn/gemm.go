package nn

import "gonum.org/v1/gonum/blas/blas32"

// sgemm is the one matrix product every kernel uses (row-major, as
// gonum's blas32). By default it is gonum's pure-Go implementation, which
// works everywhere; building with -tags openblas (cgo, libopenblas-dev)
// swaps in OpenBLAS. Backend names the one in use.
var (
	sgemm   = blas32.Implementation().Sgemm
	Backend = "gonum"
)
