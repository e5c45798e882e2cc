package nn

import (
	"math"
	"runtime"
	"sync"

	"gonum.org/v1/gonum/blas"
)

// AttentionForward is multi-head self-attention over qkv [B, T, 3C]
// (per position: q, then k, then v, each C = NH*hs wide). It writes the
// attention weights att [B, NH, T, T] (kept for backward) and out [B, T, C].
// causal limits position t to positions <= t; otherwise every position
// sees the whole sequence (the block drafter's non-causal pass).
//
// The scores and the weighted sum are matrix products per (batch, head),
// through sgemm1 (the heads already run one per core): QK^T into att, the softmax in place, then att V into out.
// A causal pass computes the whole score matrix and masks it: the products
// cost less in the GEMM than the masked half would save in a scalar loop.
func AttentionForward(out, att, qkv []float32, B, T, C, NH int, causal bool) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	parallelFor(B*NH, func(bh int) {
		b, h := bh/NH, bh%NH
		base := b * T * 3 * C
		s := att[bh*T*T:][:T*T]
		// s = scale * q k^T: q and k are T x hs, rows 3C apart in qkv.
		sgemm1(blas.NoTrans, blas.Trans, T, T, hs, scale, qkv[base+h*hs:], 3*C, qkv[base+C+h*hs:], 3*C, 0, s, T)
		for t := 0; t < T; t++ {
			row := s[t*T:][:T]
			end := T
			if causal {
				end = t + 1
			}
			mx := float32(math.Inf(-1))
			for _, v := range row[:end] {
				mx = max(mx, v)
			}
			var sum float32
			for t2, v := range row[:end] {
				e := float32(math.Exp(float64(v - mx)))
				row[t2] = e
				sum += e
			}
			inv := 1 / sum
			for t2 := range row[:end] {
				row[t2] *= inv
			}
			clear(row[end:])
		}
		// out = s v: v is T x hs, rows 3C apart; out rows are C apart.
		sgemm1(blas.NoTrans, blas.NoTrans, T, hs, T, 1, s, T, qkv[base+2*C+h*hs:], 3*C, 0, out[b*T*C+h*hs:], C)
	})
}

// AttentionBackward accumulates dqkv from dout. scratch must hold
// B*NH*T*T floats. Like the forward pass it is matrix products per
// (batch, head): dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P*dP))
// (the softmax's backward, scaled), dQ += dS K, dK += dS^T Q.
func AttentionBackward(dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int, causal bool) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	parallelFor(B*NH, func(bh int) {
		b, h := bh/NH, bh%NH
		base := b * T * 3 * C
		p := att[bh*T*T:][:T*T]
		ds := scratch[bh*T*T:][:T*T]
		do := dout[b*T*C+h*hs:]
		q, k, v := qkv[base+h*hs:], qkv[base+C+h*hs:], qkv[base+2*C+h*hs:]
		dq, dk, dv := dqkv[base+h*hs:], dqkv[base+C+h*hs:], dqkv[base+2*C+h*hs:]
		sgemm1(blas.Trans, blas.NoTrans, T, hs, T, 1, p, T, do, C, 1, dv, 3*C)
		sgemm1(blas.NoTrans, blas.Trans, T, T, hs, 1, do, C, v, 3*C, 0, ds, T)
		for t := 0; t < T; t++ {
			end := T
			if causal {
				end = t + 1
			}
			pr, dr := p[t*T:][:end], ds[t*T:][:T]
			var dot float32
			for t2, pv := range pr {
				dot += pv * dr[t2]
			}
			for t2, pv := range pr {
				dr[t2] = pv * (dr[t2] - dot) * scale
			}
			clear(dr[end:])
		}
		sgemm1(blas.NoTrans, blas.NoTrans, T, hs, T, 1, ds, T, k, 3*C, 1, dq, 3*C)
		sgemm1(blas.Trans, blas.NoTrans, T, hs, T, 1, ds, T, q, 3*C, 1, dk, 3*C)
	})
}

// parallelFor runs fn(0..n-1) over the machine's cores.
func parallelFor(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for w := 0; w < workers; w++ {
		lo, hi := w*chunk, min((w+1)*chunk, n)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
