package nn

import (
	"math"
	"runtime"
	"sync"
)

// AttentionForward is multi-head self-attention over qkv [B, T, 3C]
// (per position: q, then k, then v, each C = NH*hs wide). It writes the
// attention weights att [B, NH, T, T] (kept for backward) and out [B, T, C].
// causal limits position t to positions <= t; otherwise every position
// sees the whole sequence (the block drafter's non-causal pass).
func AttentionForward(out, att, qkv []float32, B, T, C, NH int, causal bool) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	parallelFor(B*NH, func(bh int) {
		b, h := bh/NH, bh%NH
		for t := 0; t < T; t++ {
			q := qkv[(b*T+t)*3*C+h*hs:][:hs]
			row := att[((b*NH+h)*T+t)*T:][:T]
			end := T
			if causal {
				end = t + 1
			}
			mx := float32(math.Inf(-1))
			for t2 := 0; t2 < end; t2++ {
				k := qkv[(b*T+t2)*3*C+C+h*hs:][:hs]
				var s float32
				for i, qi := range q {
					s += qi * k[i]
				}
				s *= scale
				row[t2] = s
				mx = max(mx, s)
			}
			var sum float32
			for t2 := 0; t2 < end; t2++ {
				e := float32(math.Exp(float64(row[t2] - mx)))
				row[t2] = e
				sum += e
			}
			for t2 := 0; t2 < T; t2++ {
				if t2 < end {
					row[t2] /= sum
				} else {
					row[t2] = 0
				}
			}
			o := out[(b*T+t)*C+h*hs:][:hs]
			clear(o)
			for t2 := 0; t2 < end; t2++ {
				v := qkv[(b*T+t2)*3*C+2*C+h*hs:][:hs]
				a := row[t2]
				for i, vi := range v {
					o[i] += a * vi
				}
			}
		}
	})
}

// AttentionBackward accumulates dqkv from dout. scratch must hold B*NH*T
// floats.
func AttentionBackward(dqkv, dout, qkv, att, scratch []float32, B, T, C, NH int, causal bool) {
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	parallelFor(B*NH, func(bh int) {
		b, h := bh/NH, bh%NH
		datt := scratch[bh*T:][:T]
		for t := 0; t < T; t++ {
			row := att[((b*NH+h)*T+t)*T:][:T]
			g := dout[(b*T+t)*C+h*hs:][:hs]
			end := T
			if causal {
				end = t + 1
			}
			// out = sum_t2 att[t2] v[t2]
			var dot float32 // sum_t2 att[t2] * datt[t2]
			for t2 := 0; t2 < end; t2++ {
				v := qkv[(b*T+t2)*3*C+2*C+h*hs:][:hs]
				dv := dqkv[(b*T+t2)*3*C+2*C+h*hs:][:hs]
				var d float32
				for i, gi := range g {
					d += gi * v[i]
					dv[i] += row[t2] * gi
				}
				datt[t2] = d
				dot += row[t2] * d
			}
			// softmax backward, then the scaled dot products
			q := qkv[(b*T+t)*3*C+h*hs:][:hs]
			dq := dqkv[(b*T+t)*3*C+h*hs:][:hs]
			for t2 := 0; t2 < end; t2++ {
				dpre := row[t2] * (datt[t2] - dot) * scale
				k := qkv[(b*T+t2)*3*C+C+h*hs:][:hs]
				dk := dqkv[(b*T+t2)*3*C+C+h*hs:][:hs]
				for i := range q {
					dq[i] += dpre * k[i]
					dk[i] += dpre * q[i]
				}
			}
		}
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
