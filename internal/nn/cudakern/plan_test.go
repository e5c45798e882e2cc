package cudakern

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// rowMajor is the reference: C = alpha op(A) op(B) + beta C, row-major.
func rowMajor(tA, tB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	at := func(i, p int) float64 {
		if tA {
			return a[p*lda+i]
		}
		return a[i*lda+p]
	}
	bt := func(p, j int) float64 {
		if tB {
			return b[j*ldb+p]
		}
		return b[p*ldb+j]
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				s += at(i, p) * bt(p, j)
			}
			c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
		}
	}
}

// colMajor is what cuBLAS computes for a Gemm, column-major.
func colMajor(g Gemm, alpha float64, a, b []float64, beta float64, c []float64) {
	at := func(i, p int) float64 {
		if g.TransA {
			return a[i*g.LDA+p]
		}
		return a[p*g.LDA+i]
	}
	bt := func(p, j int) float64 {
		if g.TransB {
			return b[p*g.LDB+j]
		}
		return b[j*g.LDB+p]
	}
	for i := 0; i < g.M; i++ {
		for j := 0; j < g.N; j++ {
			var s float64
			for p := 0; p < g.K; p++ {
				s += at(i, p) * bt(p, j)
			}
			c[j*g.LDC+i] = alpha*s + beta*c[j*g.LDC+i]
		}
	}
}

func rnd(r *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	return x
}

// TestRowMajor: every row-major product the backend issues, through the
// translation to column-major, is the row-major product (including
// leading dimensions wider than the matrix, as attention's 3C rows).
func TestRowMajor(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	type tc struct {
		name                   string
		ta, tb                 bool
		m, n, k, lda, ldb, ldc int
	}
	N, In, Out, T, C, hs := 5, 7, 3, 4, 6, 2
	cases := []tc{
		{"linear", false, true, N, Out, In, In, In, Out},
		{"din", false, false, N, In, Out, Out, In, In},
		{"dw", true, false, Out, In, N, Out, In, In},
		{"scores", false, true, T, T, hs, 3 * C, 3 * C, T},
		{"weighted", false, false, T, hs, T, T, 3 * C, C},
		{"dv", true, false, T, hs, T, T, C, 3 * C},
		{"dq", false, false, T, hs, T, T, 3 * C, 3 * C},
		{"dk", true, false, T, hs, T, T, 3 * C, 3 * C},
	}
	for _, c := range cases {
		rowsA, rowsB := c.m, c.k
		if c.ta {
			rowsA = c.k
		}
		if c.tb {
			rowsB = c.n
		}
		a, b := rnd(r, rowsA*c.lda), rnd(r, rowsB*c.ldb)
		c0 := rnd(r, c.m*c.ldc)
		want := append([]float64(nil), c0...)
		rowMajor(c.ta, c.tb, c.m, c.n, c.k, 0.5, a, c.lda, b, c.ldb, 1, want, c.ldc)
		g := RowMajor(c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc)
		got := append([]float64(nil), c0...)
		colMajor(g, 0.5, b, a, 1, got) // SwapAB: cuBLAS's A is the row-major B
		for i := range want {
			if d := want[i] - got[i]; d > 1e-12 || d < -1e-12 {
				t.Fatalf("%s: value %d is %v, want %v", c.name, i, got[i], want[i])
			}
		}
	}
	// The named plans are these products.
	for _, p := range []struct {
		name string
		got  Gemm
		want Gemm
	}{
		{"Linear", Linear(N, In, Out), RowMajor(false, true, N, Out, In, In, In, Out)},
		{"LinearDIn", LinearDIn(N, In, Out), RowMajor(false, false, N, In, Out, Out, In, In)},
		{"LinearDW", LinearDW(N, In, Out), RowMajor(true, false, Out, In, N, Out, In, In)},
		{"Scores", Scores(T, C, hs), RowMajor(false, true, T, T, hs, 3*C, 3*C, T)},
		{"DK", DK(T, C, hs), RowMajor(true, false, T, hs, T, T, 3*C, 3*C)},
	} {
		if p.got != p.want {
			t.Errorf("%s = %+v, want %+v", p.name, p.got, p.want)
		}
	}
	// cuBLAS's own constraints: ld >= rows of the column-major operand.
	for _, g := range []Gemm{Linear(N, In, Out), LinearDIn(N, In, Out), LinearDW(N, In, Out), Scores(T, C, hs), Weighted(T, C, hs), DV(T, C, hs), DP(T, C, hs), DQ(T, C, hs), DK(T, C, hs)} {
		ra, rb := g.M, g.K
		if g.TransA {
			ra = g.K
		}
		if g.TransB {
			rb = g.N
		}
		if g.LDA < max(ra, 1) || g.LDB < max(rb, 1) || g.LDC < max(g.M, 1) {
			t.Errorf("%+v: a leading dimension below its operand's rows", g)
		}
	}
}

// TestLaunches: each launch covers its work and stays in CUDA's limits.
func TestLaunches(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 1 << 20, 1 << 30} {
		l := Elementwise(n)
		if l.Grid < 1 || l.Grid > MaxGrid || l.Block != Block {
			t.Errorf("Elementwise(%d) = %+v", n, l)
		}
		if n <= MaxGrid*Block && l.Grid*l.Block < n {
			t.Errorf("Elementwise(%d) = %+v covers fewer", n, l)
		}
	}
	for _, rows := range []int{1, 7, 8, 9, 4096} {
		l := WarpRows(rows)
		if l.Grid*WarpsPerBlock < rows || (l.Grid-1)*WarpsPerBlock >= rows {
			t.Errorf("WarpRows(%d) = %+v", rows, l)
		}
	}
	if Rows(0).Grid != 1 || Rows(12).Grid != 12 {
		t.Error("Rows")
	}
	if Block%32 != 0 || Block > 1024 || Block&(Block-1) != 0 {
		t.Error("Block must be a power of two multiple of 32 (argmax_rows_k's tree, block_sum's warps)")
	}
	if SumGrid(1) != 1 || SumGrid(1<<30) != 1024 {
		t.Error("SumGrid")
	}
}

// TestNames: every kernel named is defined in Source as extern "C"
// __global__, and every __global__ of Source is named.
func TestNames(t *testing.T) {
	defined := map[string]bool{}
	for _, line := range strings.Split(Source, "\n") {
		if rest, ok := strings.CutPrefix(line, "__global__ void "); ok {
			defined[rest[:strings.IndexByte(rest, '(')]] = true
		}
	}
	for _, n := range Names {
		if !defined[n] {
			t.Errorf("%s is not a __global__ of Source", n)
		}
		delete(defined, n)
	}
	for n := range defined {
		t.Errorf("%s is defined but not in Names", n)
	}
	if !strings.Contains(Source, `extern "C" {`) {
		t.Error("Source's kernels must be extern \"C\" (unmangled names)")
	}
}
