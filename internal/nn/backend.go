package nn

import "fmt"

// Buffer is an opaque handle to Len() float32 values in a backend's
// memory: host memory for the CPU backend, device memory for a device
// backend. It is a small value (an allocation, an offset and a length);
// copying it copies the handle, not the values. Slice views part of it
// without allocating. The zero Buffer is "none" (an optional argument
// left out, such as a bias).
type Buffer struct {
	mem    memory
	off, n int
}

// Ints is Buffer's counterpart for int32 values (tokens, targets).
type Ints struct {
	mem    memory
	off, n int
}

// memory is one allocation of a backend. Each backend has its own
// concrete type and reaches its data with a type assertion.
type memory interface {
	backend() Backend
}

// Len is the number of values.
func (b Buffer) Len() int { return b.n }

// IsNil says the buffer is the zero Buffer, "none".
func (b Buffer) IsNil() bool { return b.mem == nil }

// Backend is the backend whose memory holds the values (nil for none).
func (b Buffer) Backend() Backend {
	if b.mem == nil {
		return nil
	}
	return b.mem.backend()
}

// Slice is the view of n values from off: it shares the memory.
func (b Buffer) Slice(off, n int) Buffer {
	if off < 0 || n < 0 || off+n > b.n {
		panic(fmt.Sprintf("nn: Slice(%d, %d) of a buffer of %d", off, n, b.n))
	}
	return Buffer{b.mem, b.off + off, n}
}

// Len is the number of values.
func (b Ints) Len() int { return b.n }

// IsNil says the buffer is the zero Ints, "none".
func (b Ints) IsNil() bool { return b.mem == nil }

// Slice is the view of n values from off: it shares the memory.
func (b Ints) Slice(off, n int) Ints {
	if off < 0 || n < 0 || off+n > b.n {
		panic(fmt.Sprintf("nn: Slice(%d, %d) of ints of %d", off, n, b.n))
	}
	return Ints{b.mem, b.off + off, n}
}

// Backend runs the kernels over buffers in its own memory. Every model
// type (Model, Workspace, Drafter, DrafterWork, AdamW) runs through one;
// host slices cross only through FromHost, ToHost, IntsFromHost and
// IntsToHost. doc.go says what an implementation must guarantee.
//
// Shapes and semantics are those of the CPU kernels of the same name in
// kernels.go and attention.go (Embedding is EmbeddingForward, and so on):
// a kernel named ...Backward, Accumulate and AdamW accumulate into or
// update their first arguments; the others overwrite them.
type Backend interface {
	// Name names the backend ("gonum", "openblas", "cuda").
	Name() string

	// Alloc returns n zeroed values; AllocInts n zeroed int32s.
	Alloc(n int) Buffer
	AllocInts(n int) Ints
	// Free releases an allocation (a buffer Alloc returned, not a view).
	// The buffer and its views must not be used after.
	Free(b Buffer)
	FreeInts(b Ints)

	// The crossings to and from the host: len(host) must equal Len().
	FromHost(dst Buffer, src []float32)
	ToHost(dst []float32, src Buffer)
	IntsFromHost(dst Ints, src []int32)
	IntsToHost(dst []int32, src Ints)

	// Zero sets every value to 0; Copy copies src into dst (same Len,
	// not overlapping); Scale multiplies every value by f.
	Zero(b Buffer)
	Copy(dst, src Buffer)
	Scale(b Buffer, f float32)
	// Add writes out = a + b (out may alias a or b); Accumulate adds src
	// into dst.
	Add(out, a, b Buffer)
	Accumulate(dst, src Buffer)

	Embedding(out Buffer, tokens Ints, table Buffer, N, D int)
	EmbeddingBackward(dtable Buffer, tokens Ints, dout Buffer, N, D int)
	// AddPositions adds row n%T of wpe [T, D] to row n of x [N, D];
	// PositionsBackward accumulates row n of dx into row n%T of dwpe.
	AddPositions(x, wpe Buffer, N, T, D int)
	PositionsBackward(dwpe, dx Buffer, N, T, D int)
	RMSNorm(out, rstd, x, weight Buffer, N, D int)
	RMSNormBackward(dx, dweight, dout, x, weight, rstd Buffer, N, D int)
	MatMul(out, in, w, bias Buffer, N, In, Out int)
	MatMulBackward(din, dw, dbias, dout, in, w Buffer, N, In, Out int)
	MatMulBackwardInput(din, dout, w Buffer, N, In, Out int)
	SwiGLU(out, h Buffer, N, H int)
	SwiGLUBackward(dh, dout, h Buffer, N, H int)
	Attention(out, att, qkv Buffer, B, T, C, NH int, causal bool)
	AttentionBackward(dqkv, dout, qkv, att, scratch Buffer, B, T, C, NH int, causal bool)
	// CrossEntropy returns the loss on the host (one scalar).
	CrossEntropy(probs, logits Buffer, targets Ints, weights Buffer, N, V int) float64
	CrossEntropyBackward(dlogits, probs Buffer, targets Ints, weights Buffer, N, V int)
	// ArgmaxRows writes the index of the largest value of each row of
	// x [N, V] (the first of equals).
	ArgmaxRows(out Ints, x Buffer, N, V int)

	// The drafter's block input: row (s, j) of x0 [S*P, D] is wpe[j]
	// plus wte[anchors[s]] for j = 0, mask for j > 0; the backward
	// accumulates into dwpe and dmask.
	BlockInput(x0 Buffer, anchors Ints, wte, mask, wpe Buffer, S, P, D int)
	BlockInputBackward(dwpe, dmask, dx Buffer, S, P, D int)
	// AddContext writes row n of out = row n of x + row n/P of ctx;
	// ContextBackward accumulates row n of dout into row n/P of dctx.
	AddContext(out, x, ctx Buffer, N, P, D int)
	ContextBackward(dctx, dout Buffer, N, P, D int)

	// SumSquares is the sum of squares of the values, in float64, on the
	// host (AdamW's clipping norm).
	SumSquares(b Buffer) float64
	// AdamW updates params, m and v in place from grads (see AdamWStep).
	AdamW(params, grads, m, v, decay Buffer, s AdamWStep)
}

// AdamWStep is one AdamW update's scalars: decay (a buffer of 0 and 1)
// selects the parameters WeightDecay applies to; Scale clips the
// gradient; BC1 and BC2 are the bias corrections.
type AdamWStep struct {
	LR, Beta1, Beta2, Eps, WeightDecay, Scale, BC1, BC2 float32
}

// CPU is the default backend: host memory and the kernels of this
// package, with gonum's sgemm (OpenBLAS with -tags openblas).
func CPU() Backend { return cpu }

var cpu Backend = cpuBackend{}

// Default is the backend models are built on unless another is chosen.
func Default() Backend { return cpu }
