package nn

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
)

// DrafterConfig is the block drafter's shape.
type DrafterConfig struct {
	D         int   `json:"d_model"`        // the target's width
	K         int   `json:"target_layers"`  // tapped target layers
	Taps      []int `json:"taps,omitempty"` // which target blocks, for evaluation
	Layers    int   `json:"layers"`
	Heads     int   `json:"heads"`
	Hidden    int   `json:"hidden"`
	BlockSize int   `json:"block_size"`
}

// String describes the shape in words, for errors.
func (c DrafterConfig) String() string {
	taps := fmt.Sprint(c.Taps)
	if len(c.Taps) == 0 {
		taps = fmt.Sprint(c.K)
	}
	return fmt.Sprintf("width %d, taps %s, %d layers, %d heads, SwiGLU %d, blocks of %d", c.D, taps, c.Layers, c.Heads, c.Hidden, c.BlockSize)
}

// DrafterFormat is the "format" a drafter checkpoint's metadata carries.
const DrafterFormat = "dflow-drafter"

// CheckDrafterMeta says in words why a file's metadata is not a drafter
// checkpoint's, and returns its config when it is.
func CheckDrafterMeta(path string, meta map[string]string) (DrafterConfig, error) {
	var c DrafterConfig
	switch f := meta["format"]; f {
	case DrafterFormat:
	case "dflow-lm":
		return c, fmt.Errorf("%s is a target LM, not a drafter checkpoint (pass the file drafter_train wrote, its checkpoint)", path)
	case "":
		return c, fmt.Errorf("%s is not a drafter checkpoint: its metadata has no format %q (not written by drafter_train)", path, DrafterFormat)
	default:
		return c, fmt.Errorf("%s is not a drafter checkpoint: its format is %q, not %q", path, f, DrafterFormat)
	}
	if err := json.Unmarshal([]byte(meta["config"]), &c); err != nil {
		return c, fmt.Errorf("%s: a drafter checkpoint without a valid config in its metadata (damaged?)", path)
	}
	return c, nil
}

// Drafter is a DFlash-style block drafter. From an anchor it drafts
// BlockSize-1 tokens in one non-causal pass over [anchor, MASK x
// (BlockSize-1)]: the target's tapped hidden states at the anchor are fused
// (linear, then RMSNorm) and added to the residual stream entering every
// drafter block; the token embedding and LM head are the target's, frozen.
//
// Trainable tensors (safetensors names): fuse.weight [D, K*D],
// fuse_norm.weight [D], mask [D], wpe [BlockSize, D], blocks.L.* as in the
// target LM, ln_f.weight [D].
type Drafter struct {
	Config DrafterConfig
	Params []float32
	Grads  []float32
	names  []string
	shapes [][]int
	offs   []int
	index  map[string]int
	wte    []float32 // the target's embedding and head, frozen, shared
}

func (c DrafterConfig) layout() (names []string, shapes [][]int) {
	D := c.D
	add := func(n string, s ...int) { names, shapes = append(names, n), append(shapes, s) }
	add("fuse.weight", D, c.K*D)
	add("fuse_norm.weight", D)
	add("mask", D)
	add("wpe", c.BlockSize, D)
	for l := 0; l < c.Layers; l++ {
		b := fmt.Sprintf("blocks.%d.", l)
		add(b+"ln1.weight", D)
		add(b+"attn.qkv.weight", 3*D, D)
		add(b+"attn.proj.weight", D, D)
		add(b+"ln2.weight", D)
		add(b+"mlp.fc.weight", 2*c.Hidden, D)
		add(b+"mlp.proj.weight", D, c.Hidden)
	}
	add("ln_f.weight", D)
	return
}

// NumParams is the number of trainable values of a drafter of this shape.
func (c DrafterConfig) NumParams() int {
	_, shapes := c.layout()
	n := 0
	for _, s := range shapes {
		n += numel(s)
	}
	return n
}

// NewDrafter initializes a drafter from seed; wte is the target's token
// embedding [256, D], shared read-only.
func NewDrafter(c DrafterConfig, wte []float32, seed uint64) (*Drafter, error) {
	if c.D < 1 || c.K < 1 || c.Layers < 1 || c.Heads < 1 || c.D%c.Heads != 0 || c.Hidden < 1 || c.BlockSize < 2 {
		return nil, fmt.Errorf("nn: drafter of %v: sizes must be positive, d_model a multiple of heads, block_size at least 2", c)
	}
	if len(wte) != 256*c.D {
		return nil, fmt.Errorf("nn: target embedding has %d values, want 256 x %d", len(wte), c.D)
	}
	d := &Drafter{Config: c, wte: wte, index: map[string]int{}}
	d.names, d.shapes = c.layout()
	n := 0
	for i, s := range d.shapes {
		d.index[d.names[i]] = i
		d.offs = append(d.offs, n)
		n += numel(s)
	}
	d.Params, d.Grads = make([]float32, n), make([]float32, n)
	r := rand.New(rand.NewPCG(seed, 0xd4af7))
	for i, name := range d.names {
		w := d.P(name)
		if len(d.shapes[i]) == 1 && name != "mask" {
			for j := range w {
				w[j] = 1
			}
			continue
		}
		std := 0.02
		if name == "fuse.weight" {
			std = 1 / math.Sqrt(float64(c.K*c.D))
		}
		for j := range w {
			w[j] = float32(r.NormFloat64() * std)
		}
	}
	return d, nil
}

// P returns a parameter tensor (a view); G its gradient.
func (d *Drafter) P(name string) []float32 {
	i := d.index[name]
	return d.Params[d.offs[i] : d.offs[i]+numel(d.shapes[i])]
}

// G returns the gradient of a parameter tensor.
func (d *Drafter) G(name string) []float32 {
	i := d.index[name]
	return d.Grads[d.offs[i] : d.offs[i]+numel(d.shapes[i])]
}

// DecayMask decays matrices, not norms or the mask vector.
func (d *Drafter) DecayMask() []bool {
	m := make([]bool, len(d.Params))
	for i, s := range d.shapes {
		for j := d.offs[i]; j < d.offs[i]+numel(s); j++ {
			m[j] = len(s) == 2
		}
	}
	return m
}

// Tensors returns the trainable tensors (views).
func (d *Drafter) Tensors() []Tensor {
	ts := make([]Tensor, len(d.names))
	for i, n := range d.names {
		ts[i] = Tensor{Name: n, Shape: d.shapes[i], Data: d.P(n)}
	}
	return ts
}

// Save writes the drafter, and the optimizer state when opt is not nil,
// as safetensors with the config in __metadata__.
func (d *Drafter) Save(path string, opt *AdamW, meta map[string]string) error {
	cfg, _ := json.Marshal(d.Config)
	md := map[string]string{"config": string(cfg), "format": DrafterFormat}
	for k, v := range meta {
		md[k] = v
	}
	ts := d.Tensors()
	if opt != nil {
		m, v, t := opt.State()
		ts = append(ts, Tensor{Name: "opt.m", Shape: []int{len(m)}, Data: m}, Tensor{Name: "opt.v", Shape: []int{len(v)}, Data: v})
		md["opt.t"] = fmt.Sprint(t)
	}
	return WriteSafetensors(path, ts, md)
}

// LoadDrafter reads a drafter saved by Save; opt, when not nil, gets the
// saved optimizer state. It checks the file is a drafter checkpoint and
// every tensor against the config.
func LoadDrafter(path string, wte []float32, opt *AdamW) (*Drafter, map[string]string, error) {
	ts, meta, err := ReadSafetensors(path)
	if err != nil {
		return nil, nil, err
	}
	c, err := CheckDrafterMeta(path, meta)
	if err != nil {
		return nil, nil, err
	}
	d, err := NewDrafter(c, wte, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("nn: %s: %w", path, err)
	}
	byName := map[string]Tensor{}
	for _, t := range ts {
		byName[t.Name] = t
	}
	for i, n := range d.names {
		t, ok := byName[n]
		if !ok || numel(t.Shape) != numel(d.shapes[i]) {
			return nil, nil, fmt.Errorf("nn: %s: tensor %q missing or of shape %v, want %v", path, n, t.Shape, d.shapes[i])
		}
		copy(d.P(n), t.Data)
	}
	if opt != nil {
		m, v := byName["opt.m"], byName["opt.v"]
		if len(m.Data) == len(d.Params) && len(v.Data) == len(d.Params) {
			var t int
			fmt.Sscan(meta["opt.t"], &t)
			opt.SetState(m.Data, v.Data, t)
		}
	}
	return d, meta, nil
}

// dblock is one drafter layer's saved activations.
type dblock struct {
	in, ln1, rstd1, qkv, att, atty, res1, ln2, rstd2, fc, sw, out []float32
}

// DrafterWork holds activations for S samples of one block each.
type DrafterWork struct {
	d                                                                *Drafter
	S                                                                int
	ctxIn, fused, ctx, rstdc                                         []float32
	anchors                                                          []int32
	x0                                                               []float32
	blocks                                                           []dblock
	lnf, rstdf, logits, probs                                        []float32
	targets                                                          []int32
	weights                                                          []float32
	dres, dtmp, dqkv, dfc, dsw, dlnf, dlogits, dctx, dfused, scratch []float32
}

// NewWork allocates activations for S samples.
func (d *Drafter) NewWork(S int) *DrafterWork {
	c := d.Config
	N, D, P, H := S*c.BlockSize, c.D, c.BlockSize, c.Hidden
	f := func(n int) []float32 { return make([]float32, n) }
	w := &DrafterWork{d: d, S: S, ctxIn: f(S * c.K * D), fused: f(S * D), ctx: f(S * D), rstdc: f(S),
		anchors: make([]int32, S), x0: f(N * D), lnf: f(N * D), rstdf: f(N), logits: f(N * 256), probs: f(N * 256),
		targets: make([]int32, N), weights: f(N),
		dres: f(N * D), dtmp: f(N * D), dqkv: f(N * 3 * D), dfc: f(N * 2 * H), dsw: f(N * H), dlnf: f(N * D),
		dlogits: f(N * 256), dctx: f(S * D), dfused: f(S * D), scratch: f(S * c.Heads * P * P)}
	for l := 0; l < c.Layers; l++ {
		w.blocks = append(w.blocks, dblock{in: f(N * D), ln1: f(N * D), rstd1: f(N), qkv: f(N * 3 * D),
			att: f(S * c.Heads * P * P), atty: f(N * D), res1: f(N * D), ln2: f(N * D), rstd2: f(N),
			fc: f(N * 2 * H), sw: f(N * H), out: f(N * D)})
	}
	return w
}

// Sample sets sample s: the target's hidden states at the anchor position
// (K*D values), the anchor token, and (for training) the labels of block
// positions 1..BlockSize-1 (-1 to skip one).
func (w *DrafterWork) Sample(s int, hidden []float32, anchor int32, labels []int32) {
	c := w.d.Config
	copy(w.ctxIn[s*c.K*c.D:(s+1)*c.K*c.D], hidden)
	w.anchors[s] = anchor
	P := c.BlockSize
	w.targets[s*P] = -1
	for j := 1; j < P; j++ {
		w.targets[s*P+j] = -1
		if j-1 < len(labels) {
			w.targets[s*P+j] = labels[j-1]
		}
	}
}

// Forward drafts for every sample; it returns the logits [S*P, 256].
func (w *DrafterWork) Forward() []float32 {
	d, c := w.d, w.d.Config
	S, P, D, H := w.S, c.BlockSize, c.D, c.Hidden
	N := S * P
	MatMulForward(w.fused, w.ctxIn, d.P("fuse.weight"), nil, S, c.K*D, D)
	RMSNormForward(w.ctx, w.rstdc, w.fused, d.P("fuse_norm.weight"), S, D)
	mask, wpe := d.P("mask"), d.P("wpe")
	for s := 0; s < S; s++ {
		for j := 0; j < P; j++ {
			row := w.x0[(s*P+j)*D : (s*P+j+1)*D]
			src := mask
			if j == 0 {
				src = d.wte[int(w.anchors[s])*D : int(w.anchors[s]+1)*D]
			}
			for i := range row {
				row[i] = src[i] + wpe[j*D+i]
			}
		}
	}
	x := w.x0
	for l := range w.blocks {
		a := &w.blocks[l]
		p := func(n string) []float32 { return d.P(fmt.Sprintf("blocks.%d.%s", l, n)) }
		for n := 0; n < N; n++ { // inject the fused target context
			Add(a.in[n*D:(n+1)*D], x[n*D:(n+1)*D], w.ctx[(n/P)*D:(n/P+1)*D])
		}
		RMSNormForward(a.ln1, a.rstd1, a.in, p("ln1.weight"), N, D)
		MatMulForward(a.qkv, a.ln1, p("attn.qkv.weight"), nil, N, D, 3*D)
		AttentionForward(a.atty, a.att, a.qkv, S, P, D, c.Heads, false)
		MatMulForward(a.res1, a.atty, p("attn.proj.weight"), nil, N, D, D)
		Add(a.res1, a.res1, a.in)
		RMSNormForward(a.ln2, a.rstd2, a.res1, p("ln2.weight"), N, D)
		MatMulForward(a.fc, a.ln2, p("mlp.fc.weight"), nil, N, D, 2*H)
		SwiGLUForward(a.sw, a.fc, N, H)
		MatMulForward(a.out, a.sw, p("mlp.proj.weight"), nil, N, H, D)
		Add(a.out, a.out, a.res1)
		x = a.out
	}
	RMSNormForward(w.lnf, w.rstdf, x, d.P("ln_f.weight"), N, D)
	MatMulForward(w.logits, w.lnf, d.wte, nil, N, D, 256)
	return w.logits
}

// Loss is the position-weighted cross-entropy against the labels set by
// Sample: block position j (1-based among the drafted) weighs
// exp(-(j-1)/gamma).
func (w *DrafterWork) Loss(gamma float64) float64 {
	P := w.d.Config.BlockSize
	for n := range w.weights {
		j := n % P
		w.weights[n] = float32(math.Exp(-float64(j-1) / gamma))
	}
	return CrossEntropyForward(w.probs, w.logits, w.targets, w.weights, w.S*P, 256)
}

// Backward accumulates the drafter's gradients of the last Loss.
func (w *DrafterWork) Backward() {
	d, c := w.d, w.d.Config
	S, P, D, H := w.S, c.BlockSize, c.D, c.Hidden
	N := S * P
	clear(w.dlogits)
	CrossEntropyBackward(w.dlogits, w.probs, w.targets, w.weights, N, 256)
	clear(w.dlnf)
	MatMulBackwardInput(w.dlnf, w.dlogits, d.wte, N, D, 256) // frozen head
	last := w.x0
	if len(w.blocks) > 0 {
		last = w.blocks[len(w.blocks)-1].out
	}
	clear(w.dres)
	RMSNormBackward(w.dres, d.G("ln_f.weight"), w.dlnf, last, d.P("ln_f.weight"), w.rstdf, N, D)
	clear(w.dctx)
	for l := len(w.blocks) - 1; l >= 0; l-- {
		a := &w.blocks[l]
		p := func(n string) []float32 { return d.P(fmt.Sprintf("blocks.%d.%s", l, n)) }
		g := func(n string) []float32 { return d.G(fmt.Sprintf("blocks.%d.%s", l, n)) }
		clear(w.dsw)
		MatMulBackward(w.dsw, g("mlp.proj.weight"), nil, w.dres, a.sw, p("mlp.proj.weight"), N, H, D)
		clear(w.dfc)
		SwiGLUBackward(w.dfc, w.dsw, a.fc, N, H)
		clear(w.dtmp)
		MatMulBackward(w.dtmp, g("mlp.fc.weight"), nil, w.dfc, a.ln2, p("mlp.fc.weight"), N, D, 2*H)
		RMSNormBackward(w.dres, g("ln2.weight"), w.dtmp, a.res1, p("ln2.weight"), a.rstd2, N, D)
		clear(w.dtmp)
		MatMulBackward(w.dtmp, g("attn.proj.weight"), nil, w.dres, a.atty, p("attn.proj.weight"), N, D, D)
		clear(w.dqkv)
		AttentionBackward(w.dqkv, w.dtmp, a.qkv, a.att, w.scratch, S, P, D, c.Heads, false)
		clear(w.dtmp)
		MatMulBackward(w.dtmp, g("attn.qkv.weight"), nil, w.dqkv, a.ln1, p("attn.qkv.weight"), N, D, 3*D)
		RMSNormBackward(w.dres, g("ln1.weight"), w.dtmp, a.in, p("ln1.weight"), a.rstd1, N, D)
		// in = x + ctx: the context gets the sum over its block.
		for n := 0; n < N; n++ {
			Accumulate(w.dctx[(n/P)*D:(n/P+1)*D], w.dres[n*D:(n+1)*D])
		}
	}
	// x0 = embedding or mask, plus position.
	dmask, dwpe := d.G("mask"), d.G("wpe")
	for s := 0; s < S; s++ {
		for j := 0; j < P; j++ {
			g := w.dres[(s*P+j)*D : (s*P+j+1)*D]
			Accumulate(dwpe[j*D:(j+1)*D], g)
			if j > 0 {
				Accumulate(dmask, g)
			}
		}
	}
	clear(w.dfused)
	RMSNormBackward(w.dfused, d.G("fuse_norm.weight"), w.dctx, w.fused, d.P("fuse_norm.weight"), w.rstdc, S, D)
	MatMulBackward(nil, d.G("fuse.weight"), nil, w.dfused, w.ctxIn, d.P("fuse.weight"), S, c.K*D, D)
}

// Draft returns the greedy draft of sample s: BlockSize-1 tokens.
func (w *DrafterWork) Draft(s int, out []int32) []int32 {
	P := w.d.Config.BlockSize
	out = out[:0]
	for j := 1; j < P; j++ {
		out = append(out, Argmax(w.logits[(s*P+j)*256:(s*P+j+1)*256]))
	}
	return out
}

// Argmax is the index of the largest value (the first of equals): a
// greedy choice over logits.
func Argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// DefaultTaps spaces k taps evenly through a target of n blocks, first to
// last, as DFlash does: the blocks a drafter's hidden states come from
// when none are chosen.
func DefaultTaps(n, k int) []int {
	k = min(k, n)
	if k <= 1 {
		return []int{n - 1}
	}
	out := make([]int, k)
	for i := range out {
		out[i] = (i*(n-1) + (k-1)/2) / (k - 1)
	}
	return out
}
