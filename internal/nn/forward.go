package nn

import "fmt"

// layerActs are one block's saved activations.
type layerActs struct {
	ln1, rstd1, qkv, att, atty, res1, ln2, rstd2, fc, sw, out Buffer
}

// Workspace holds the activations and scratch of one batch shape (B, T)
// on the model's backend, allocated once so training steps do not
// allocate. A Workspace belongs to one goroutine; several may share one
// read-only Model for Forward.
type Workspace struct {
	B, T                      int
	m                         *Model
	be                        Backend
	tokens, targets           Ints
	weights                   Buffer
	x0                        Buffer
	layers                    []layerActs
	lnf, rstdf, logits, probs Buffer
	// backward scratch
	dres, dtmp, dqkv, dfc, dsw, dlnf, dlogits, scratch Buffer
	all                                                []Buffer // every allocation, for Free
}

// backScratch is the backward pass's scratch, shared by every block: the
// gradient flowing back through the residual stream (dres) and each step's.
type backScratch struct{ dres, dtmp, dqkv, dfc, dsw, scratch Buffer }

// blockBackward runs one transformer block backward, the target's and the
// drafter's alike: s.dres holds the gradient at the block's output on
// entry and at its input x on return, and the block's gradients in p
// accumulate. The block saw batch sequences of seq positions (N = batch*seq
// rows); causal says each position attended only to those before it.
func blockBackward(be Backend, p *block, a *layerActs, x Buffer, s *backScratch, batch, seq, D, H, heads int, causal bool) {
	N := batch * seq
	// MLP branch: out = res1 + proj(swiglu(fc(ln2(res1)))).
	be.Zero(s.dsw)
	be.MatMulBackward(s.dsw, p.dmproj, Buffer{}, s.dres, a.sw, p.mproj, N, H, D)
	be.Zero(s.dfc)
	be.SwiGLUBackward(s.dfc, s.dsw, a.fc, N, H)
	be.Zero(s.dtmp)
	be.MatMulBackward(s.dtmp, p.dfc, Buffer{}, s.dfc, a.ln2, p.fc, N, D, 2*H)
	be.RMSNormBackward(s.dres, p.dln2, s.dtmp, a.res1, p.ln2, a.rstd2, N, D)
	// Attention branch: res1 = x + proj(attn(qkv(ln1(x)))).
	be.Zero(s.dtmp)
	be.MatMulBackward(s.dtmp, p.dproj, Buffer{}, s.dres, a.atty, p.proj, N, D, D)
	be.Zero(s.dqkv)
	be.AttentionBackward(s.dqkv, s.dtmp, a.qkv, a.att, s.scratch, batch, seq, D, heads, causal)
	be.Zero(s.dtmp)
	be.MatMulBackward(s.dtmp, p.dqkv, Buffer{}, s.dqkv, a.ln1, p.qkv, N, D, 3*D)
	be.RMSNormBackward(s.dres, p.dln1, s.dtmp, x, p.ln1, a.rstd1, N, D)
}

// NewWorkspace allocates activations for batches of B sequences of T
// tokens.
func (m *Model) NewWorkspace(B, T int) (*Workspace, error) { return m.NewWorkspaceOn(m.be, B, T) }

// NewWorkspaceOn is NewWorkspace on backend be, which must share the
// model's memory (the model's own, or another replica's backend on the
// same device: its own stream over the shared weights).
func (m *Model) NewWorkspaceOn(be Backend, B, T int) (*Workspace, error) {
	c := m.Config
	if !Shares(be, m.be) {
		return nil, fmt.Errorf("nn: a workspace on %s for a model on %s", be.Name(), m.be.Name())
	}
	if T > c.MaxSeq || B < 1 || T < 1 {
		return nil, fmt.Errorf("nn: batch %dx%d does not fit max_seq %d", B, T, c.MaxSeq)
	}
	N, D, H, V := B*T, c.DModel, c.Hidden, c.Vocab
	w := &Workspace{B: B, T: T, m: m, be: be, tokens: be.AllocInts(N), targets: be.AllocInts(N)}
	f := func(n int) Buffer {
		b := be.Alloc(n)
		w.all = append(w.all, b)
		return b
	}
	w.weights, w.x0 = f(N), f(N*D)
	w.lnf, w.rstdf, w.logits, w.probs = f(N*D), f(N), f(N*V), f(N*V)
	w.dres, w.dtmp, w.dqkv, w.dfc, w.dsw = f(N*D), f(N*D), f(N*3*D), f(N*2*H), f(N*H)
	w.dlnf, w.dlogits, w.scratch = f(N*D), f(N*V), f(B*c.Heads*T*T)
	for l := 0; l < c.Layers; l++ {
		w.layers = append(w.layers, layerActs{
			ln1: f(N * D), rstd1: f(N), qkv: f(N * 3 * D), att: f(B * c.Heads * T * T), atty: f(N * D),
			res1: f(N * D), ln2: f(N * D), rstd2: f(N), fc: f(N * 2 * H), sw: f(N * H), out: f(N * D),
		})
	}
	return w, nil
}

// Free releases the workspace's buffers; it must not be used after.
func (w *Workspace) Free() {
	for _, b := range w.all {
		w.be.Free(b)
	}
	w.be.FreeInts(w.tokens)
	w.be.FreeInts(w.targets)
	w.all = nil
}

// Forward runs the model on tokens [B*T] (bytes as int32, copied from the
// host) and returns the logits [B*T, vocab]. The returned buffer and
// Hidden's are owned by the workspace and overwritten by the next call;
// read them on the host with the backend's ToHost.
func (w *Workspace) Forward(tokens []int32) Buffer {
	m, c, be := w.m, w.m.Config, w.be
	B, T, D, H, V := w.B, w.T, c.DModel, c.Hidden, c.Vocab
	N := B * T
	be.IntsFromHost(w.tokens, tokens[:N])
	be.Embedding(w.x0, w.tokens, m.wte, N, D)
	be.AddPositions(w.x0, m.wpe, N, T, D)
	x := w.x0
	for l := range w.layers {
		a, p := &w.layers[l], &m.blocks[l]
		be.RMSNorm(a.ln1, a.rstd1, x, p.ln1, N, D)
		be.MatMul(a.qkv, a.ln1, p.qkv, Buffer{}, N, D, 3*D)
		be.Attention(a.atty, a.att, a.qkv, B, T, D, c.Heads, true)
		be.MatMul(a.res1, a.atty, p.proj, Buffer{}, N, D, D)
		be.Add(a.res1, a.res1, x)
		be.RMSNorm(a.ln2, a.rstd2, a.res1, p.ln2, N, D)
		be.MatMul(a.fc, a.ln2, p.fc, Buffer{}, N, D, 2*H)
		be.SwiGLU(a.sw, a.fc, N, H)
		be.MatMul(a.out, a.sw, p.mproj, Buffer{}, N, H, D)
		be.Add(a.out, a.out, a.res1)
		x = a.out
	}
	be.RMSNorm(w.lnf, w.rstdf, x, m.lnf, N, D)
	be.MatMul(w.logits, w.lnf, m.wte, Buffer{}, N, D, V)
	return w.logits
}

// Logits returns the logits of the last Forward (the buffer Forward
// returned).
func (w *Workspace) Logits() Buffer { return w.logits }

// Hidden returns the residual stream after block l (0-based) of the last
// Forward, [B*T, d_model]; l = -1 is the embeddings.
func (w *Workspace) Hidden(l int) Buffer {
	if l < 0 {
		return w.x0
	}
	return w.layers[l].out
}

// setTargets copies targets and weights (nil: none) from the host.
func (w *Workspace) setTargets(targets []int32, weights []float32) Buffer {
	N := w.B * w.T
	w.be.IntsFromHost(w.targets, targets[:N])
	if weights == nil {
		return Buffer{}
	}
	w.be.FromHost(w.weights, weights[:N])
	return w.weights
}

// Loss computes the mean cross-entropy of the last Forward's logits
// against targets [B*T] (a target < 0 is ignored), with optional
// per-position weights.
func (w *Workspace) Loss(targets []int32, weights []float32) float64 {
	c := w.m.Config
	wt := w.setTargets(targets, weights)
	return w.be.CrossEntropy(w.probs, w.logits, w.targets, wt, w.B*w.T, c.Vocab)
}

// Backward accumulates into the model's Grads the gradient of the loss
// Loss just computed. Call ZeroGrad first for a fresh step.
func (w *Workspace) Backward(targets []int32, weights []float32) {
	m, c, be := w.m, w.m.Config, w.be
	B, T, D, H, V := w.B, w.T, c.DModel, c.Hidden, c.Vocab
	N := B * T
	wt := w.setTargets(targets, weights)
	be.Zero(w.dlogits)
	be.CrossEntropyBackward(w.dlogits, w.probs, w.targets, wt, N, V)
	be.Zero(w.dlnf)
	be.MatMulBackward(w.dlnf, m.dwte, Buffer{}, w.dlogits, w.lnf, m.wte, N, D, V)
	last := w.x0
	if len(w.layers) > 0 {
		last = w.layers[len(w.layers)-1].out
	}
	be.Zero(w.dres)
	be.RMSNormBackward(w.dres, m.dlnf, w.dlnf, last, m.lnf, w.rstdf, N, D)
	s := backScratch{dres: w.dres, dtmp: w.dtmp, dqkv: w.dqkv, dfc: w.dfc, dsw: w.dsw, scratch: w.scratch}
	for l := len(w.layers) - 1; l >= 0; l-- {
		x := w.x0
		if l > 0 {
			x = w.layers[l-1].out
		}
		blockBackward(be, &m.blocks[l], &w.layers[l], x, &s, B, T, D, H, c.Heads, true)
	}
	be.EmbeddingBackward(m.dwte, w.tokens, w.dres, N, D)
	be.PositionsBackward(m.dwpe, w.dres, N, T, D)
}

// ZeroGrad clears the model's gradients.
func (m *Model) ZeroGrad() { m.be.Zero(m.Grads) }
