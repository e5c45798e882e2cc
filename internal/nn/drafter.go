package nn

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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
//
// A drafter lives on its target's backend (the backend of wte).
type Drafter struct {
	Config DrafterConfig
	Params Buffer
	Grads  Buffer
	be     Backend
	names  []string
	shapes [][]int
	offs   []int
	index  map[string]int
	wte    Buffer // the target's embedding and head, frozen, shared
	// views
	fuse, fuseNorm, mask, wpe, lnf      Buffer
	dfuse, dfuseNorm, dmask, dwpe, dlnf Buffer
	blocks                              []block
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
// embedding [256, D], shared read-only, and the drafter lives on its
// backend.
func NewDrafter(c DrafterConfig, wte Buffer, seed uint64) (*Drafter, error) {
	return NewDrafterOn(wte.Backend(), c, wte, seed)
}

// NewDrafterOn is NewDrafter on backend be, which must share wte's memory
// (a replica's own backend on its target's device).
func NewDrafterOn(be Backend, c DrafterConfig, wte Buffer, seed uint64) (*Drafter, error) {
	if c.D < 1 || c.K < 1 || c.Layers < 1 || c.Heads < 1 || c.D%c.Heads != 0 || c.Hidden < 1 || c.BlockSize < 2 {
		return nil, fmt.Errorf("nn: drafter of %v: sizes must be positive, d_model a multiple of heads, block_size at least 2", c)
	}
	if wte.Len() != 256*c.D || wte.IsNil() {
		return nil, fmt.Errorf("nn: target embedding has %d values, want 256 x %d", wte.Len(), c.D)
	}
	if be == nil || !Shares(be, wte.Backend()) {
		return nil, fmt.Errorf("nn: a drafter on another backend than its target's embedding")
	}
	d := &Drafter{Config: c, wte: wte, be: be, index: map[string]int{}}
	d.names, d.shapes = c.layout()
	n := 0
	for i, s := range d.shapes {
		d.index[d.names[i]] = i
		d.offs = append(d.offs, n)
		n += numel(s)
	}
	d.Params, d.Grads = be.Alloc(n), be.Alloc(n)
	d.bind()
	init := make([]float32, n)
	r := rand.New(rand.NewPCG(seed, 0xd4af7))
	for i, name := range d.names {
		w := init[d.offs[i] : d.offs[i]+numel(d.shapes[i])]
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
	be.FromHost(d.Params, init)
	return d, nil
}

func (d *Drafter) bind() {
	d.fuse, d.fuseNorm, d.mask, d.wpe, d.lnf = d.P("fuse.weight"), d.P("fuse_norm.weight"), d.P("mask"), d.P("wpe"), d.P("ln_f.weight")
	d.dfuse, d.dfuseNorm, d.dmask, d.dwpe, d.dlnf = d.G("fuse.weight"), d.G("fuse_norm.weight"), d.G("mask"), d.G("wpe"), d.G("ln_f.weight")
	d.blocks = nil
	for l := 0; l < d.Config.Layers; l++ {
		n := func(s string) string { return fmt.Sprintf("blocks.%d.%s", l, s) }
		d.blocks = append(d.blocks, block{
			ln1: d.P(n("ln1.weight")), qkv: d.P(n("attn.qkv.weight")), proj: d.P(n("attn.proj.weight")),
			ln2: d.P(n("ln2.weight")), fc: d.P(n("mlp.fc.weight")), mproj: d.P(n("mlp.proj.weight")),
			dln1: d.G(n("ln1.weight")), dqkv: d.G(n("attn.qkv.weight")), dproj: d.G(n("attn.proj.weight")),
			dln2: d.G(n("ln2.weight")), dfc: d.G(n("mlp.fc.weight")), dmproj: d.G(n("mlp.proj.weight")),
		})
	}
}

// Backend is the backend holding the drafter (its target's).
func (d *Drafter) Backend() Backend { return d.be }

// P returns a parameter tensor (a view); G its gradient.
func (d *Drafter) P(name string) Buffer {
	i := d.index[name]
	return d.Params.Slice(d.offs[i], numel(d.shapes[i]))
}

// G returns the gradient of a parameter tensor.
func (d *Drafter) G(name string) Buffer {
	i := d.index[name]
	return d.Grads.Slice(d.offs[i], numel(d.shapes[i]))
}

// DecayMask decays matrices, not norms or the mask vector: 1 where weight
// decay applies, 0 where not, on the drafter's backend.
func (d *Drafter) DecayMask() Buffer {
	m := make([]float32, d.Params.Len())
	for i, s := range d.shapes {
		if len(s) == 2 {
			for j := d.offs[i]; j < d.offs[i]+numel(s); j++ {
				m[j] = 1
			}
		}
	}
	b := d.be.Alloc(len(m))
	d.be.FromHost(b, m)
	return b
}

// Tensors returns the trainable tensors copied to the host.
func (d *Drafter) Tensors() []Tensor {
	all := make([]float32, d.Params.Len())
	d.be.ToHost(all, d.Params)
	ts := make([]Tensor, len(d.names))
	for i, n := range d.names {
		ts[i] = Tensor{Name: n, Shape: d.shapes[i], Data: all[d.offs[i] : d.offs[i]+numel(d.shapes[i])]}
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
		ts = append(ts, optTensors(opt, md)...)
	}
	return WriteSafetensors(path, ts, md)
}

// optTensors are AdamW's moments as tensors opt.m and opt.v, its count
// in meta's "opt.t": a checkpoint that training resumes from exactly.
func optTensors(opt *AdamW, meta map[string]string) []Tensor {
	mb, vb, t := opt.State()
	m, v := make([]float32, mb.Len()), make([]float32, vb.Len())
	opt.be.ToHost(m, mb)
	opt.be.ToHost(v, vb)
	meta["opt.t"] = fmt.Sprint(t)
	return []Tensor{{Name: "opt.m", Shape: []int{len(m)}, Data: m}, {Name: "opt.v", Shape: []int{len(v)}, Data: v}}
}

// loadOpt sets opt from the tensors optTensors wrote, for n parameters,
// where a checkpoint has them.
func loadOpt(byName map[string]Tensor, meta map[string]string, opt *AdamW, n int) {
	m, v := byName["opt.m"], byName["opt.v"]
	if len(m.Data) == n && len(v.Data) == n && opt.m.Len() == n {
		var t int
		fmt.Sscan(meta["opt.t"], &t)
		opt.be.FromHost(opt.m, m.Data)
		opt.be.FromHost(opt.v, v.Data)
		opt.t = t
	}
}

// LoadDrafter reads a drafter saved by Save; opt, when not nil, gets the
// saved optimizer state. It checks the file is a drafter checkpoint and
// every tensor against the config. The drafter is loaded onto wte's
// backend, and opt must be of the same.
func LoadDrafter(path string, wte Buffer, opt *AdamW) (*Drafter, map[string]string, error) {
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
		d.be.FromHost(d.P(n), t.Data)
	}
	if opt != nil {
		loadOpt(byName, meta, opt, d.Params.Len())
	}
	return d, meta, nil
}

// dblock is one drafter layer's saved activations.
// dblock is a drafter block's saved activations: a target block's, and
// its input (the block's x plus the injected context).
type dblock struct {
	in Buffer
	layerActs
}

// DrafterWork holds activations for S samples of one block each, on the
// drafter's backend.
type DrafterWork struct {
	d                                                                *Drafter
	be                                                               Backend
	S                                                                int
	ctxIn, fused, ctx, rstdc                                         Buffer
	anchors                                                          Ints
	x0                                                               Buffer
	blocks                                                           []dblock
	lnf, rstdf, logits, probs                                        Buffer
	targets, greedy                                                  Ints
	weights                                                          Buffer
	dres, dtmp, dqkv, dfc, dsw, dlnf, dlogits, dctx, dfused, scratch Buffer
	all                                                              []Buffer
	// host staging of what Sample sets, copied over in Forward
	hostAnchors, hostTargets []int32
	hostCtx                  []float32
	gamma                    float64 // of the weights on the backend; 0: none yet
}

// NewWork allocates activations for S samples.
func (d *Drafter) NewWork(S int) *DrafterWork {
	c, be := d.Config, d.be
	N, D, P, H := S*c.BlockSize, c.D, c.BlockSize, c.Hidden
	w := &DrafterWork{d: d, be: be, S: S, anchors: be.AllocInts(S), targets: be.AllocInts(N), greedy: be.AllocInts(P),
		hostAnchors: make([]int32, S), hostTargets: make([]int32, N),
		hostCtx: make([]float32, S*c.K*c.D)}
	f := func(n int) Buffer {
		b := be.Alloc(n)
		w.all = append(w.all, b)
		return b
	}
	w.ctxIn, w.fused, w.ctx, w.rstdc = f(S*c.K*D), f(S*D), f(S*D), f(S)
	w.x0, w.lnf, w.rstdf, w.logits, w.probs = f(N*D), f(N*D), f(N), f(N*256), f(N*256)
	w.weights = f(N)
	w.dres, w.dtmp, w.dqkv, w.dfc, w.dsw, w.dlnf = f(N*D), f(N*D), f(N*3*D), f(N*2*H), f(N*H), f(N*D)
	w.dlogits, w.dctx, w.dfused, w.scratch = f(N*256), f(S*D), f(S*D), f(S*c.Heads*P*P)
	for l := 0; l < c.Layers; l++ {
		w.blocks = append(w.blocks, dblock{in: f(N * D), layerActs: layerActs{ln1: f(N * D), rstd1: f(N), qkv: f(N * 3 * D),
			att: f(S * c.Heads * P * P), atty: f(N * D), res1: f(N * D), ln2: f(N * D), rstd2: f(N),
			fc: f(N * 2 * H), sw: f(N * H), out: f(N * D)}})
	}
	return w
}

// Free releases the work's buffers; it must not be used after.
func (w *DrafterWork) Free() {
	for _, b := range w.all {
		w.be.Free(b)
	}
	w.be.FreeInts(w.anchors)
	w.be.FreeInts(w.targets)
	w.be.FreeInts(w.greedy)
	w.all = nil
}

// Sample sets sample s: the target's hidden states at the anchor position
// (K*D values, copied from the host), the anchor token, and (for
// training) the labels of block positions 1..BlockSize-1 (-1 to skip one).
func (w *DrafterWork) Sample(s int, hidden []float32, anchor int32, labels []int32) {
	c := w.d.Config
	copy(w.hostCtx[s*c.K*c.D:(s+1)*c.K*c.D], hidden[:c.K*c.D])
	w.hostAnchors[s] = anchor
	P := c.BlockSize
	w.hostTargets[s*P] = -1
	for j := 1; j < P; j++ {
		w.hostTargets[s*P+j] = -1
		if j-1 < len(labels) {
			w.hostTargets[s*P+j] = labels[j-1]
		}
	}
}

// Forward drafts for every sample; it returns the logits [S*P, 256].
func (w *DrafterWork) Forward() Buffer {
	d, c, be := w.d, w.d.Config, w.be
	S, P, D, H := w.S, c.BlockSize, c.D, c.Hidden
	N := S * P
	be.FromHost(w.ctxIn, w.hostCtx) // the samples' hidden states cross once
	be.IntsFromHost(w.anchors, w.hostAnchors)
	be.IntsFromHost(w.targets, w.hostTargets)
	be.MatMul(w.fused, w.ctxIn, d.fuse, Buffer{}, S, c.K*D, D)
	be.RMSNorm(w.ctx, w.rstdc, w.fused, d.fuseNorm, S, D)
	be.BlockInput(w.x0, w.anchors, d.wte, d.mask, d.wpe, S, P, D)
	x := w.x0
	for l := range w.blocks {
		a, p := &w.blocks[l], &d.blocks[l]
		be.AddContext(a.in, x, w.ctx, N, P, D) // inject the fused target context
		be.RMSNorm(a.ln1, a.rstd1, a.in, p.ln1, N, D)
		be.MatMul(a.qkv, a.ln1, p.qkv, Buffer{}, N, D, 3*D)
		be.Attention(a.atty, a.att, a.qkv, S, P, D, c.Heads, false)
		be.MatMul(a.res1, a.atty, p.proj, Buffer{}, N, D, D)
		be.Add(a.res1, a.res1, a.in)
		be.RMSNorm(a.ln2, a.rstd2, a.res1, p.ln2, N, D)
		be.MatMul(a.fc, a.ln2, p.fc, Buffer{}, N, D, 2*H)
		be.SwiGLU(a.sw, a.fc, N, H)
		be.MatMul(a.out, a.sw, p.mproj, Buffer{}, N, H, D)
		be.Add(a.out, a.out, a.res1)
		x = a.out
	}
	be.RMSNorm(w.lnf, w.rstdf, x, d.lnf, N, D)
	be.MatMul(w.logits, w.lnf, d.wte, Buffer{}, N, D, 256)
	return w.logits
}

// Loss is the position-weighted cross-entropy against the labels set by
// Sample: block position j (1-based among the drafted) weighs
// exp(-(j-1)/gamma).
func (w *DrafterWork) Loss(gamma float64) float64 {
	P := w.d.Config.BlockSize
	if w.gamma != gamma || gamma == 0 {
		weights := make([]float32, w.S*P)
		for n := range weights {
			j := n % P
			weights[n] = float32(math.Exp(-float64(j-1) / gamma))
		}
		w.be.FromHost(w.weights, weights)
		w.gamma = gamma
	}
	return w.be.CrossEntropy(w.probs, w.logits, w.targets, w.weights, w.S*P, 256)
}

// Backward accumulates the drafter's gradients of the last Loss.
func (w *DrafterWork) Backward() {
	d, c, be := w.d, w.d.Config, w.be
	S, P, D, H := w.S, c.BlockSize, c.D, c.Hidden
	N := S * P
	be.Zero(w.dlogits)
	be.CrossEntropyBackward(w.dlogits, w.probs, w.targets, w.weights, N, 256)
	be.Zero(w.dlnf)
	be.MatMulBackwardInput(w.dlnf, w.dlogits, d.wte, N, D, 256) // frozen head
	last := w.x0
	if len(w.blocks) > 0 {
		last = w.blocks[len(w.blocks)-1].out
	}
	be.Zero(w.dres)
	be.RMSNormBackward(w.dres, d.dlnf, w.dlnf, last, d.lnf, w.rstdf, N, D)
	be.Zero(w.dctx)
	s := backScratch{dres: w.dres, dtmp: w.dtmp, dqkv: w.dqkv, dfc: w.dfc, dsw: w.dsw, scratch: w.scratch}
	for l := len(w.blocks) - 1; l >= 0; l-- {
		a := &w.blocks[l]
		// attention within each sample's block, not causal
		blockBackward(be, &d.blocks[l], &a.layerActs, a.in, &s, S, P, D, H, c.Heads, false)
		// in = x + ctx: the context gets the sum over its block.
		be.ContextBackward(w.dctx, w.dres, N, P, D)
	}
	// x0 = embedding or mask, plus position.
	be.BlockInputBackward(d.dwpe, d.dmask, w.dres, S, P, D)
	be.Zero(w.dfused)
	be.RMSNormBackward(w.dfused, d.dfuseNorm, w.dctx, w.fused, d.fuseNorm, w.rstdc, S, D)
	be.MatMulBackward(Buffer{}, d.dfuse, Buffer{}, w.dfused, w.ctxIn, d.fuse, S, c.K*D, D)
}

// Logits returns the logits of the last Forward.
func (w *DrafterWork) Logits() Buffer { return w.logits }

// Draft returns the greedy draft of sample s: BlockSize-1 tokens, on the
// host.
func (w *DrafterWork) Draft(s int, out []int32) []int32 {
	P := w.d.Config.BlockSize
	g := w.greedy.Slice(0, P-1)
	w.be.ArgmaxRows(g, w.logits.Slice((s*P+1)*256, (P-1)*256), P-1, 256)
	out = slices.Grow(out[:0], P-1)[:P-1]
	w.be.IntsToHost(out, g)
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
