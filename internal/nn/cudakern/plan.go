package cudakern

// Launch is one kernel launch's grid and block (x only: every kernel is
// one-dimensional).
type Launch struct {
	Grid, Block int
}

// MaxGrid caps the blocks of a grid-stride kernel: enough to fill a large
// GPU several times over (an H200 has 132 multiprocessors), few enough
// that a block does several elements of a large buffer.
const MaxGrid = 4096

// Elementwise is the launch of a grid-stride kernel over n elements (at
// least one block, so a kernel over 0 elements is a valid no-op launch).
func Elementwise(n int) Launch {
	g := (n + Block - 1) / Block
	return Launch{Grid: min(max(g, 1), MaxGrid), Block: Block}
}

// Rows is the launch of a kernel with one block per row.
func Rows(n int) Launch { return Launch{Grid: max(n, 1), Block: Block} }

// WarpsPerBlock is the rows per block of the warp-per-row kernels
// (attention's softmax and its backward).
const WarpsPerBlock = Block / 32

// WarpRows is the launch of a kernel with one warp per row.
func WarpRows(rows int) Launch {
	return Launch{Grid: max((rows+WarpsPerBlock-1)/WarpsPerBlock, 1), Block: Block}
}

// SumGrid is the blocks of sum_squares_k (its partial sums, added on the
// host in float64).
func SumGrid(n int) int { return min(max((n+Block-1)/Block, 1), 1024) }

// Gemm is one cuBLAS (column-major) sgemm call: C = alpha op(A) op(B) +
// beta C with C m x n, op(A) m x k, op(B) k x n. TransA and TransB say
// whether op transposes; A, B and C name which operand of the row-major
// product each is (RowMajor swaps them).
type Gemm struct {
	TransA, TransB bool
	M, N, K        int
	LDA, LDB, LDC  int
	SwapAB         bool // A is the row-major product's B, and B its A
}

// RowMajor translates a row-major product C[m, n] = op(A)[m, k] op(B)[k, n]
// (the gonum/CBLAS row-major convention of the CPU kernels, leading
// dimensions the row strides) into cuBLAS's column-major call: a
// row-major matrix is its transpose in column-major, and C^T = op(B)^T
// op(A)^T, so the call is (tB, tA, n, m, k, B, ldb, A, lda, C, ldc).
func RowMajor(transA, transB bool, m, n, k, lda, ldb, ldc int) Gemm {
	return Gemm{TransA: transB, TransB: transA, M: n, N: m, K: k, LDA: ldb, LDB: lda, LDC: ldc, SwapAB: true}
}

// The products of the linear layers (out = in @ W^T, W [Out, In]) and of
// attention, as the CPU kernels write them (kernels.go, attention.go),
// row-major; the backend passes them through RowMajor.

// Linear is out[N, Out] = in[N, In] @ w[Out, In]^T.
func Linear(N, In, Out int) Gemm { return RowMajor(false, true, N, Out, In, In, In, Out) }

// LinearDIn is din[N, In] += dout[N, Out] @ w[Out, In].
func LinearDIn(N, In, Out int) Gemm { return RowMajor(false, false, N, In, Out, Out, In, In) }

// LinearDW is dw[Out, In] += dout[N, Out]^T @ in[N, In].
func LinearDW(N, In, Out int) Gemm { return RowMajor(true, false, Out, In, N, Out, In, In) }

// The attention products per (batch, head): q, k and v are T x hs with rows
// 3C apart in qkv, out and dout rows C apart, the scores T x T.

// Scores is s[T, T] = q k^T (scaled).
func Scores(T, C, hs int) Gemm { return RowMajor(false, true, T, T, hs, 3*C, 3*C, T) }

// Weighted is out[T, hs] = s v.
func Weighted(T, C, hs int) Gemm { return RowMajor(false, false, T, hs, T, T, 3*C, C) }

// DV is dv[T, hs] += p^T dout.
func DV(T, C, hs int) Gemm { return RowMajor(true, false, T, hs, T, T, C, 3*C) }

// DP is ds[T, T] = dout v^T.
func DP(T, C, hs int) Gemm { return RowMajor(false, true, T, T, hs, C, 3*C, T) }

// DQ is dq[T, hs] += ds k.
func DQ(T, C, hs int) Gemm { return RowMajor(false, false, T, hs, T, T, 3*C, 3*C) }

// DK is dk[T, hs] += ds^T q.
func DK(T, C, hs int) Gemm { return RowMajor(true, false, T, hs, T, T, 3*C, 3*C) }
