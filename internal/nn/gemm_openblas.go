//go:build openblas && cgo

package nn

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"runtime"
	"unsafe"

	"gonum.org/v1/gonum/blas"
)

// OpenBLAS runs single-threaded, in the calling goroutine's thread, and
// Go splits each large product across GOMAXPROCS goroutines. With its own
// thread pool, OpenBLAS's idle workers spin (sched_yield) for a long while
// after every product, and between products the Go kernels (attention,
// SwiGLU, norms) run on the same cores: the spinning took about 40% of the
// CPU of a forward pass and left the Go kernels one core of two. Splitting
// in Go made the forward pass 1.5x faster on 2 cores (docs/performance.md).
func init() {
	C.openblas_set_num_threads(1)
	sgemm, sgemm1 = openblasSgemm, cblasSgemm
	blasName = "openblas"
}

// Products smaller than this many multiply-adds, or with fewer rows per
// goroutine than minRowsPerWorker, are not worth a goroutine.
const (
	minParallelMACs  = 1 << 18
	minRowsPerWorker = 32
)

// openblasSgemm has gonum's Sgemm signature over OpenBLAS's cblas_sgemm,
// splitting the rows of c across goroutines for large products.
func openblasSgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	workers := min(runtime.GOMAXPROCS(0), m/minRowsPerWorker)
	if workers <= 1 || m*n*k < minParallelMACs {
		cblasSgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	rows := (m + workers - 1) / workers
	parallelFor(workers, func(w int) {
		lo, hi := w*rows, min((w+1)*rows, m)
		if lo >= hi {
			return
		}
		// Rows lo..hi of op(A): rows of A, or columns of A when it is
		// transposed.
		aoff := lo * lda
		if tA == blas.Trans {
			aoff = lo
		}
		cblasSgemm(tA, tB, hi-lo, n, k, alpha, a[aoff:], lda, b, ldb, beta, c[lo*ldc:], ldc)
	})
}

func cTrans(t blas.Transpose) C.enum_CBLAS_TRANSPOSE {
	if t == blas.NoTrans {
		return C.CblasNoTrans
	}
	return C.CblasTrans
}

// cblasSgemm is one cblas_sgemm call.
func cblasSgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	C.cblas_sgemm(C.CblasRowMajor, cTrans(tA), cTrans(tB), C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}
