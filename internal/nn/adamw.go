package nn

import "math"

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter) over one
// flat parameter buffer, with gradient clipping by global norm. Its
// moments live on the backend it was made for.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// ClipNorm, if > 0, rescales the gradient so its L2 norm is at most
	// ClipNorm before the update.
	ClipNorm float32
	be       Backend
	m, v     Buffer
	t        int
}

// NewAdamW returns an optimizer for n parameters on backend be with
// common defaults (betas 0.9 and 0.95, eps 1e-8, weight decay 0.1, clip 1).
func NewAdamW(be Backend, n int, lr float32) *AdamW {
	return &AdamW{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, ClipNorm: 1,
		be: be, m: be.Alloc(n), v: be.Alloc(n)}
}

// Step updates params from grads, decaying only where decay is 1 (decay
// is a buffer of 0 and 1, as DecayMask returns; the zero Buffer decays
// everything). It returns the gradient norm before clipping.
func (o *AdamW) Step(params, grads, decay Buffer) float32 {
	norm := float32(math.Sqrt(o.be.SumSquares(grads)))
	scale := float32(1)
	if o.ClipNorm > 0 && norm > o.ClipNorm {
		scale = o.ClipNorm / norm
	}
	o.t++
	bc1 := 1 - float32(math.Pow(float64(o.Beta1), float64(o.t)))
	bc2 := 1 - float32(math.Pow(float64(o.Beta2), float64(o.t)))
	o.be.AdamW(params, grads, o.m, o.v, decay, AdamWStep{LR: o.LR, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps,
		WeightDecay: o.WeightDecay, Scale: scale, BC1: bc1, BC2: bc2})
	return norm
}

// State returns the optimizer's moment buffers (its own, not copies) and
// step count, for checkpoints.
func (o *AdamW) State() (m, v Buffer, t int) { return o.m, o.v, o.t }

// SetState restores what State returned (copying the moments).
func (o *AdamW) SetState(m, v Buffer, t int) {
	o.be.Copy(o.m, m)
	o.be.Copy(o.v, v)
	o.t = t
}

// Free releases the moments.
func (o *AdamW) Free() {
	o.be.Free(o.m)
	o.be.Free(o.v)
}
