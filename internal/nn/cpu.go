package nn

import "math"

// cpuBackend is the CPU backend: buffers are Go slices and the kernels
// are this package's functions over them, so the CPU results are exactly
// those of the kernels called directly.
type cpuBackend struct{}

// cpuMem is one host allocation of the CPU backend.
type cpuMem struct {
	f []float32
	i []int32
}

func (*cpuMem) backend() Backend { return cpu }

// host is the slice a CPU buffer views (nil for none). A buffer of
// another backend panics: the CPU backend cannot read device memory.
func host(b Buffer) []float32 {
	if b.mem == nil {
		return nil
	}
	return b.mem.(*cpuMem).f[b.off : b.off+b.n : b.off+b.n]
}

func hostInts(b Ints) []int32 {
	if b.mem == nil {
		return nil
	}
	return b.mem.(*cpuMem).i[b.off : b.off+b.n : b.off+b.n]
}

// wrap makes a CPU buffer of a host slice, without copying: the buffer
// aliases the slice.
func wrap(x []float32) Buffer { return Buffer{&cpuMem{f: x}, 0, len(x)} }

func wrapInts(x []int32) Ints { return Ints{&cpuMem{i: x}, 0, len(x)} }

func (cpuBackend) Name() string { return blasName }

func (cpuBackend) Alloc(n int) Buffer     { return wrap(make([]float32, n)) }
func (cpuBackend) AllocInts(n int) Ints   { return wrapInts(make([]int32, n)) }
func (cpuBackend) Free(Buffer)            {}
func (cpuBackend) FreeInts(Ints)          {}
func (cpuBackend) Zero(b Buffer)          { clear(host(b)) }
func (cpuBackend) Copy(dst, src Buffer)   { mustLen(dst.n, src.n); copy(host(dst), host(src)) }
func (cpuBackend) Add(out, a, b Buffer)   { Add(host(out), host(a), host(b)) }
func (cpuBackend) Accumulate(d, s Buffer) { mustLen(d.n, s.n); Accumulate(host(d), host(s)) }

func (cpuBackend) FromHost(dst Buffer, src []float32) { mustLen(dst.n, len(src)); copy(host(dst), src) }
func (cpuBackend) ToHost(dst []float32, src Buffer)   { mustLen(len(dst), src.n); copy(dst, host(src)) }
func (cpuBackend) IntsFromHost(dst Ints, src []int32) {
	mustLen(dst.n, len(src))
	copy(hostInts(dst), src)
}
func (cpuBackend) IntsToHost(dst []int32, src Ints) {
	mustLen(len(dst), src.n)
	copy(dst, hostInts(src))
}

func mustLen(a, b int) {
	if a != b {
		panic("nn: buffers of different lengths")
	}
}

func (cpuBackend) Scale(b Buffer, f float32) {
	x := host(b)
	for i := range x {
		x[i] *= f
	}
}

func (cpuBackend) Embedding(out Buffer, tokens Ints, table Buffer, N, D int) {
	EmbeddingForward(host(out), hostInts(tokens), host(table), N, D)
}

func (cpuBackend) EmbeddingBackward(dtable Buffer, tokens Ints, dout Buffer, N, D int) {
	EmbeddingBackward(host(dtable), hostInts(tokens), host(dout), N, D)
}

func (cpuBackend) AddPositions(xb, wpeb Buffer, N, T, D int) {
	x, wpe := host(xb), host(wpeb)
	for n := 0; n < N; n++ {
		t := n % T
		row, pos := x[n*D:(n+1)*D], wpe[t*D:(t+1)*D]
		for i := range row {
			row[i] += pos[i]
		}
	}
}

func (cpuBackend) PositionsBackward(dwpeb, dxb Buffer, N, T, D int) {
	dwpe, dx := host(dwpeb), host(dxb)
	for n := 0; n < N; n++ {
		t := n % T
		row, g := dwpe[t*D:(t+1)*D], dx[n*D:(n+1)*D]
		for i := range row {
			row[i] += g[i]
		}
	}
}

func (cpuBackend) RMSNorm(out, rstd, x, weight Buffer, N, D int) {
	RMSNormForward(host(out), host(rstd), host(x), host(weight), N, D)
}

func (cpuBackend) RMSNormBackward(dx, dweight, dout, x, weight, rstd Buffer, N, D int) {
	RMSNormBackward(host(dx), host(dweight), host(dout), host(x), host(weight), host(rstd), N, D)
}

func (cpuBackend) MatMul(out, in, w, bias Buffer, N, In, Out int) {
	MatMulForward(host(out), host(in), host(w), host(bias), N, In, Out)
}

func (cpuBackend) MatMulBackward(din, dw, dbias, dout, in, w Buffer, N, In, Out int) {
	MatMulBackward(host(din), host(dw), host(dbias), host(dout), host(in), host(w), N, In, Out)
}

func (cpuBackend) MatMulBackwardInput(din, dout, w Buffer, N, In, Out int) {
	MatMulBackwardInput(host(din), host(dout), host(w), N, In, Out)
}

func (cpuBackend) SwiGLU(out, h Buffer, N, H int) { SwiGLUForward(host(out), host(h), N, H) }

func (cpuBackend) SwiGLUBackward(dh, dout, h Buffer, N, H int) {
	SwiGLUBackward(host(dh), host(dout), host(h), N, H)
}

func (cpuBackend) Attention(out, att, qkv Buffer, B, T, C, NH int, causal bool) {
	AttentionForward(host(out), host(att), host(qkv), B, T, C, NH, causal)
}

func (cpuBackend) AttentionBackward(dqkv, dout, qkv, att, scratch Buffer, B, T, C, NH int, causal bool) {
	AttentionBackward(host(dqkv), host(dout), host(qkv), host(att), host(scratch), B, T, C, NH, causal)
}

func (cpuBackend) CrossEntropy(probs, logits Buffer, targets Ints, weights Buffer, N, V int) float64 {
	return CrossEntropyForward(host(probs), host(logits), hostInts(targets), host(weights), N, V)
}

func (cpuBackend) CrossEntropyBackward(dlogits, probs Buffer, targets Ints, weights Buffer, N, V int) {
	CrossEntropyBackward(host(dlogits), host(probs), hostInts(targets), host(weights), N, V)
}

func (cpuBackend) ArgmaxRows(outb Ints, xb Buffer, N, V int) {
	out, x := hostInts(outb), host(xb)
	for n := 0; n < N; n++ {
		out[n] = Argmax(x[n*V : (n+1)*V])
	}
}

func (cpuBackend) BlockInput(x0b Buffer, anchorsb Ints, wteb, maskb, wpeb Buffer, S, P, D int) {
	x0, anchors, wte, mask, wpe := host(x0b), hostInts(anchorsb), host(wteb), host(maskb), host(wpeb)
	for s := 0; s < S; s++ {
		for j := 0; j < P; j++ {
			row := x0[(s*P+j)*D : (s*P+j+1)*D]
			src := mask
			if j == 0 {
				src = wte[int(anchors[s])*D : int(anchors[s]+1)*D]
			}
			for i := range row {
				row[i] = src[i] + wpe[j*D+i]
			}
		}
	}
}

func (cpuBackend) BlockInputBackward(dwpeb, dmaskb, dxb Buffer, S, P, D int) {
	dwpe, dmask, dx := host(dwpeb), host(dmaskb), host(dxb)
	for s := 0; s < S; s++ {
		for j := 0; j < P; j++ {
			g := dx[(s*P+j)*D : (s*P+j+1)*D]
			Accumulate(dwpe[j*D:(j+1)*D], g)
			if j > 0 {
				Accumulate(dmask, g)
			}
		}
	}
}

func (cpuBackend) AddContext(outb, xb, ctxb Buffer, N, P, D int) {
	out, x, ctx := host(outb), host(xb), host(ctxb)
	for n := 0; n < N; n++ {
		Add(out[n*D:(n+1)*D], x[n*D:(n+1)*D], ctx[(n/P)*D:(n/P+1)*D])
	}
}

func (cpuBackend) ContextBackward(dctxb, doutb Buffer, N, P, D int) {
	dctx, dout := host(dctxb), host(doutb)
	for n := 0; n < N; n++ {
		Accumulate(dctx[(n/P)*D:(n/P+1)*D], dout[n*D:(n+1)*D])
	}
}

func (cpuBackend) SumSquares(b Buffer) float64 {
	var s float64
	for _, x := range host(b) {
		s += float64(x) * float64(x)
	}
	return s
}

func (cpuBackend) AdamW(pb, gb, mb, vb, db Buffer, s AdamWStep) {
	params, grads, m, v, decay := host(pb), host(gb), host(mb), host(vb), host(db)
	for i, g := range grads {
		g *= s.Scale
		m[i] = s.Beta1*m[i] + (1-s.Beta1)*g
		v[i] = s.Beta2*v[i] + (1-s.Beta2)*g*g
		mh, vh := m[i]/s.BC1, v[i]/s.BC2
		wd := s.WeightDecay
		if decay != nil && decay[i] == 0 {
			wd = 0
		}
		params[i] -= s.LR * (mh/(float32(math.Sqrt(float64(vh)))+s.Eps) + wd*params[i])
	}
}
