package nn

import "fmt"

// layerActs are one block's saved activations.
type layerActs struct {
	ln1, rstd1, qkv, att, atty, res1, ln2, rstd2, fc, sw, out []float32
}

// Workspace holds the activations and scratch of one batch shape (B, T),
// allocated once so training steps do not allocate. A Workspace belongs to
// one goroutine; several may share one read-only Model for Forward.
type Workspace struct {
	B, T                      int
	m                         *Model
	tokens                    []int32
	x0                        []float32
	layers                    []layerActs
	lnf, rstdf, logits, probs []float32
	// backward scratch
	dres, dtmp, dqkv, dfc, dsw, dlnf, dlogits, scratch []float32
}

// NewWorkspace allocates activations for batches of B sequences of T
// tokens.
func (m *Model) NewWorkspace(B, T int) (*Workspace, error) {
	c := m.Config
	if T > c.MaxSeq || B < 1 || T < 1 {
		return nil, fmt.Errorf("nn: batch %dx%d does not fit max_seq %d", B, T, c.MaxSeq)
	}
	N, D, H, V := B*T, c.DModel, c.Hidden, c.Vocab
	f := func(n int) []float32 { return make([]float32, n) }
	w := &Workspace{B: B, T: T, m: m, tokens: make([]int32, N), x0: f(N * D),
		lnf: f(N * D), rstdf: f(N), logits: f(N * V), probs: f(N * V),
		dres: f(N * D), dtmp: f(N * D), dqkv: f(N * 3 * D), dfc: f(N * 2 * H), dsw: f(N * H),
		dlnf: f(N * D), dlogits: f(N * V), scratch: f(B * c.Heads * T * T)}
	for l := 0; l < c.Layers; l++ {
		w.layers = append(w.layers, layerActs{
			ln1: f(N * D), rstd1: f(N), qkv: f(N * 3 * D), att: f(B * c.Heads * T * T), atty: f(N * D),
			res1: f(N * D), ln2: f(N * D), rstd2: f(N), fc: f(N * 2 * H), sw: f(N * H), out: f(N * D),
		})
	}
	return w, nil
}

// Forward runs the model on tokens [B*T] (bytes as int32) and returns the
// logits [B*T, vocab]. The returned slice and Hidden's are owned by the
// workspace and overwritten by the next call.
func (w *Workspace) Forward(tokens []int32) []float32 {
	m, c := w.m, w.m.Config
	B, T, D, H, V := w.B, w.T, c.DModel, c.Hidden, c.Vocab
	N := B * T
	copy(w.tokens, tokens[:N])
	EmbeddingForward(w.x0, w.tokens, m.P("wte"), N, D)
	wpe := m.P("wpe")
	for n := 0; n < N; n++ {
		t := n % T
		row, pos := w.x0[n*D:(n+1)*D], wpe[t*D:(t+1)*D]
		for i := range row {
			row[i] += pos[i]
		}
	}
	x := w.x0
	for l := range w.layers {
		a, p := &w.layers[l], &m.blocks[l]
		RMSNormForward(a.ln1, a.rstd1, x, p.ln1, N, D)
		MatMulForward(a.qkv, a.ln1, p.qkv, nil, N, D, 3*D)
		AttentionForward(a.atty, a.att, a.qkv, B, T, D, c.Heads, true)
		MatMulForward(a.res1, a.atty, p.proj, nil, N, D, D)
		Add(a.res1, a.res1, x)
		RMSNormForward(a.ln2, a.rstd2, a.res1, p.ln2, N, D)
		MatMulForward(a.fc, a.ln2, p.fc, nil, N, D, 2*H)
		SwiGLUForward(a.sw, a.fc, N, H)
		MatMulForward(a.out, a.sw, p.mproj, nil, N, H, D)
		Add(a.out, a.out, a.res1)
		x = a.out
	}
	RMSNormForward(w.lnf, w.rstdf, x, m.P("ln_f.weight"), N, D)
	MatMulForward(w.logits, w.lnf, m.P("wte"), nil, N, D, V)
	return w.logits
}

// Hidden returns the residual stream after block l (0-based) of the last
// Forward, [B*T, d_model]; l = -1 is the embeddings.
func (w *Workspace) Hidden(l int) []float32 {
	if l < 0 {
		return w.x0
	}
	return w.layers[l].out
}

// Loss computes the mean cross-entropy of the last Forward's logits
// against targets [B*T] (a target < 0 is ignored), with optional
// per-position weights.
func (w *Workspace) Loss(targets []int32, weights []float32) float64 {
	c := w.m.Config
	return CrossEntropyForward(w.probs, w.logits, targets, weights, w.B*w.T, c.Vocab)
}

// Backward accumulates into the model's Grads the gradient of the loss
// Loss just computed. Call ZeroGrad first for a fresh step.
func (w *Workspace) Backward(targets []int32, weights []float32) {
	m, c := w.m, w.m.Config
	B, T, D, H, V := w.B, w.T, c.DModel, c.Hidden, c.Vocab
	N := B * T
	clear(w.dlogits)
	CrossEntropyBackward(w.dlogits, w.probs, targets, weights, N, V)
	clear(w.dlnf)
	MatMulBackward(w.dlnf, m.G("wte"), nil, w.dlogits, w.lnf, m.P("wte"), N, D, V)
	last := w.x0
	if len(w.layers) > 0 {
		last = w.layers[len(w.layers)-1].out
	}
	clear(w.dres)
	RMSNormBackward(w.dres, m.G("ln_f.weight"), w.dlnf, last, m.P("ln_f.weight"), w.rstdf, N, D)
	for l := len(w.layers) - 1; l >= 0; l-- {
		a, p := &w.layers[l], &m.blocks[l]
		x := w.x0
		if l > 0 {
			x = w.layers[l-1].out
		}
		// MLP branch: out = res1 + proj(swiglu(fc(ln2(res1)))).
		clear(w.dsw)
		MatMulBackward(w.dsw, p.dmproj, nil, w.dres, a.sw, p.mproj, N, H, D)
		clear(w.dfc)
		SwiGLUBackward(w.dfc, w.dsw, a.fc, N, H)
		clear(w.dtmp)
		MatMulBackward(w.dtmp, p.dfc, nil, w.dfc, a.ln2, p.fc, N, D, 2*H)
		RMSNormBackward(w.dres, p.dln2, w.dtmp, a.res1, p.ln2, a.rstd2, N, D)
		// Attention branch: res1 = x + proj(attn(qkv(ln1(x)))).
		clear(w.dtmp)
		MatMulBackward(w.dtmp, p.dproj, nil, w.dres, a.atty, p.proj, N, D, D)
		clear(w.dqkv)
		AttentionBackward(w.dqkv, w.dtmp, a.qkv, a.att, w.scratch, B, T, D, c.Heads, true)
		clear(w.dtmp)
		MatMulBackward(w.dtmp, p.dqkv, nil, w.dqkv, a.ln1, p.qkv, N, D, 3*D)
		RMSNormBackward(w.dres, p.dln1, w.dtmp, x, p.ln1, a.rstd1, N, D)
	}
	EmbeddingBackward(m.G("wte"), w.tokens, w.dres, N, D)
	dwpe := m.G("wpe")
	for n := 0; n < N; n++ {
		t := n % T
		row, g := dwpe[t*D:(t+1)*D], w.dres[n*D:(n+1)*D]
		for i := range row {
			row[i] += g[i]
		}
	}
}

// ZeroGrad clears the model's gradients.
func (m *Model) ZeroGrad() { clear(m.Grads) }
