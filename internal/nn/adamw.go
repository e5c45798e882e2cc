package nn

import "math"

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter) over one
// flat parameter buffer, with gradient clipping by global norm.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// ClipNorm, if > 0, rescales the gradient so its L2 norm is at most
	// ClipNorm before the update.
	ClipNorm float32
	m, v     []float32
	t        int
}

// NewAdamW returns an optimizer for n parameters with common defaults
// (betas 0.9 and 0.95, eps 1e-8, weight decay 0.1, clip 1).
func NewAdamW(n int, lr float32) *AdamW {
	return &AdamW{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, ClipNorm: 1,
		m: make([]float32, n), v: make([]float32, n)}
}

// Step updates params from grads, decaying only where decay[i] is true
// (decay may be nil: decay everything). It returns the gradient norm
// before clipping.
func (o *AdamW) Step(params, grads []float32, decay []bool) float32 {
	norm := GradNorm(grads)
	scale := float32(1)
	if o.ClipNorm > 0 && norm > o.ClipNorm {
		scale = o.ClipNorm / norm
	}
	o.t++
	bc1 := 1 - float32(math.Pow(float64(o.Beta1), float64(o.t)))
	bc2 := 1 - float32(math.Pow(float64(o.Beta2), float64(o.t)))
	for i, g := range grads {
		g *= scale
		o.m[i] = o.Beta1*o.m[i] + (1-o.Beta1)*g
		o.v[i] = o.Beta2*o.v[i] + (1-o.Beta2)*g*g
		mh, vh := o.m[i]/bc1, o.v[i]/bc2
		wd := o.WeightDecay
		if decay != nil && !decay[i] {
			wd = 0
		}
		params[i] -= o.LR * (mh/(float32(math.Sqrt(float64(vh)))+o.Eps) + wd*params[i])
	}
	return norm
}

// State returns the optimizer's moment buffers and step count, for
// checkpoints.
func (o *AdamW) State() (m, v []float32, t int) { return o.m, o.v, o.t }

// SetState restores what State returned.
func (o *AdamW) SetState(m, v []float32, t int) {
	copy(o.m, m)
	copy(o.v, v)
	o.t = t
}

// GradNorm is the L2 norm of a gradient buffer.
func GradNorm(g []float32) float32 {
	var s float64
	for _, x := range g {
		s += float64(x) * float64(x)
	}
	return float32(math.Sqrt(s))
}
