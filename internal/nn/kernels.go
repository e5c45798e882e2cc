package nn

import (
	"math"

	"gonum.org/v1/gonum/blas"
)

// EmbeddingForward writes out[n] = table[tokens[n]] for N tokens of width D.
func EmbeddingForward(out []float32, tokens []int32, table []float32, N, D int) {
	for n := 0; n < N; n++ {
		copy(out[n*D:(n+1)*D], table[int(tokens[n])*D:int(tokens[n]+1)*D])
	}
}

// EmbeddingBackward accumulates dout into the rows of dtable.
func EmbeddingBackward(dtable []float32, tokens []int32, dout []float32, N, D int) {
	for n := 0; n < N; n++ {
		row := dtable[int(tokens[n])*D : int(tokens[n]+1)*D]
		for i, g := range dout[n*D : (n+1)*D] {
			row[i] += g
		}
	}
}

// RMSNormEps is the epsilon of every RMSNorm.
const RMSNormEps = 1e-5

// RMSNormForward normalizes each row by its root mean square and scales by
// weight; rstd keeps 1/rms per row for the backward pass.
func RMSNormForward(out, rstd, x, weight []float32, N, D int) {
	for n := 0; n < N; n++ {
		row := x[n*D : (n+1)*D]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		r := float32(1 / math.Sqrt(ss/float64(D)+RMSNormEps))
		rstd[n] = r
		o := out[n*D : (n+1)*D]
		for i, v := range row {
			o[i] = v * r * weight[i]
		}
	}
}

// RMSNormBackward accumulates dx and dweight.
func RMSNormBackward(dx, dweight, dout, x, weight, rstd []float32, N, D int) {
	for n := 0; n < N; n++ {
		row, g, r := x[n*D:(n+1)*D], dout[n*D:(n+1)*D], rstd[n]
		// y_i = x_i r w_i; dL/dx_j = r w_j g_j - r^3 x_j/D sum_i g_i w_i x_i
		var dot float32
		for i := range row {
			dot += g[i] * weight[i] * row[i]
			dweight[i] += g[i] * row[i] * r
		}
		c := r * r * r * dot / float32(D)
		dxr := dx[n*D : (n+1)*D]
		for i := range row {
			dxr[i] += r*weight[i]*g[i] - c*row[i]
		}
	}
}

// MatMulForward computes out[N, Out] = in[N, In] @ w[Out, In]^T + bias
// (bias may be nil).
func MatMulForward(out, in, w, bias []float32, N, In, Out int) {
	sgemm(blas.NoTrans, blas.Trans, N, Out, In, 1, in, In, w, In, 0, out, Out)
	if bias != nil {
		for n := 0; n < N; n++ {
			o := out[n*Out : (n+1)*Out]
			for i, b := range bias {
				o[i] += b
			}
		}
	}
}

// MatMulBackward accumulates din += dout @ w, dw += dout^T @ in and
// dbias += column sums of dout. din and dbias may be nil.
func MatMulBackward(din, dw, dbias, dout, in, w []float32, N, In, Out int) {
	if din != nil {
		sgemm(blas.NoTrans, blas.NoTrans, N, In, Out, 1, dout, Out, w, In, 1, din, In)
	}
	sgemm(blas.Trans, blas.NoTrans, Out, In, N, 1, dout, Out, in, In, 1, dw, In)
	if dbias != nil {
		for n := 0; n < N; n++ {
			for i, g := range dout[n*Out : (n+1)*Out] {
				dbias[i] += g
			}
		}
	}
}

// Add writes out = a + b elementwise (out may alias a or b).
func Add(out, a, b []float32) {
	for i := range out {
		out[i] = a[i] + b[i]
	}
}

// Accumulate adds src into dst.
func Accumulate(dst, src []float32) {
	for i, v := range src {
		dst[i] += v
	}
}

// SwiGLUForward reads h[N, 2H] as gate | up per row and writes
// out[N, H] = silu(gate) * up.
func SwiGLUForward(out, h []float32, N, H int) {
	for n := 0; n < N; n++ {
		gate, up, o := h[n*2*H:n*2*H+H], h[n*2*H+H:(n+1)*2*H], out[n*H:(n+1)*H]
		for i, g := range gate {
			o[i] = silu(g) * up[i]
		}
	}
}

// SwiGLUBackward accumulates dh from dout.
func SwiGLUBackward(dh, dout, h []float32, N, H int) {
	for n := 0; n < N; n++ {
		gate, up := h[n*2*H:n*2*H+H], h[n*2*H+H:(n+1)*2*H]
		dgate, dup, g := dh[n*2*H:n*2*H+H], dh[n*2*H+H:(n+1)*2*H], dout[n*H:(n+1)*H]
		for i, x := range gate {
			s := sigmoid(x)
			dup[i] += g[i] * x * s
			dgate[i] += g[i] * up[i] * s * (1 + x*(1-s))
		}
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }
func silu(x float32) float32    { return x * sigmoid(x) }

// CrossEntropyForward turns logits[N, V] into probs (softmax, kept for the
// backward pass) and returns the weighted mean of -log p(target):
// sum_n w_n * loss_n / sum_n w_n. weights may be nil (all 1); rows with
// target < 0 are skipped.
func CrossEntropyForward(probs, logits []float32, targets []int32, weights []float32, N, V int) float64 {
	var loss, wsum float64
	for n := 0; n < N; n++ {
		softmax(probs[n*V:(n+1)*V], logits[n*V:(n+1)*V])
		if targets[n] < 0 {
			continue
		}
		w := 1.0
		if weights != nil {
			w = float64(weights[n])
		}
		loss -= w * math.Log(math.Max(float64(probs[n*V+int(targets[n])]), 1e-30))
		wsum += w
	}
	if wsum == 0 {
		return 0
	}
	return loss / wsum
}

// CrossEntropyBackward accumulates into dlogits the gradient of the loss
// CrossEntropyForward returned.
func CrossEntropyBackward(dlogits, probs []float32, targets []int32, weights []float32, N, V int) {
	var wsum float64
	for n := 0; n < N; n++ {
		if targets[n] >= 0 {
			if weights != nil {
				wsum += float64(weights[n])
			} else {
				wsum++
			}
		}
	}
	if wsum == 0 {
		return
	}
	for n := 0; n < N; n++ {
		if targets[n] < 0 {
			continue
		}
		w := float32(1 / wsum)
		if weights != nil {
			w = float32(float64(weights[n]) / wsum)
		}
		p, d := probs[n*V:(n+1)*V], dlogits[n*V:(n+1)*V]
		for i, pi := range p {
			d[i] += w * pi
		}
		d[targets[n]] -= w
	}
}

// softmax writes the softmax of x into out, stably.
func softmax(out, x []float32) {
	mx := x[0]
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - mx))
		out[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range out {
		out[i] *= inv
	}
}

// MatMulBackwardInput accumulates only din += dout @ w, for a frozen
// weight.
func MatMulBackwardInput(din, dout, w []float32, N, In, Out int) {
	sgemm(blas.NoTrans, blas.NoTrans, N, In, Out, 1, dout, Out, w, In, 1, din, In)
}
