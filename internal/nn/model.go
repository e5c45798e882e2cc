package nn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// Config is the shape of a byte-level decoder-only transformer: learned
// token and position embeddings, Layers pre-norm blocks (RMSNorm, causal
// multi-head attention, RMSNorm, SwiGLU MLP, residuals), a final RMSNorm
// and an LM head tied to the token embedding. No biases.
type Config struct {
	Vocab  int `json:"vocab"`
	DModel int `json:"d_model"`
	Layers int `json:"layers"`
	Heads  int `json:"heads"`
	Hidden int `json:"hidden"` // SwiGLU width
	MaxSeq int `json:"max_seq"`
}

// Validate reports a shape the model cannot have.
func (c Config) Validate() error {
	switch {
	case c.Vocab < 2 || c.DModel < 1 || c.Layers < 1 || c.Heads < 1 || c.Hidden < 1 || c.MaxSeq < 1:
		return fmt.Errorf("nn: config %+v: every size must be positive (vocab at least 2)", c)
	case c.DModel%c.Heads != 0:
		return fmt.Errorf("nn: d_model %d is not a multiple of heads %d", c.DModel, c.Heads)
	}
	return nil
}

// param is one named tensor inside the flat parameter buffer.
type param struct {
	name   string
	shape  []int
	offset int
	decay  bool // matrices decay, norms do not
}

func (p param) size() int { return numel(p.shape) }

// Model holds the parameters in one flat buffer (Params) with gradients
// of the same layout (Grads), so an optimizer or an all-reduce treats the
// model as one vector. Both live on the model's backend. Activations live
// in a Workspace per batch shape.
type Model struct {
	Config Config
	Params Buffer
	Grads  Buffer
	be     Backend
	params []param
	index  map[string]int
	blocks []block // per-layer views into Params and Grads
	// views of the tensors outside the blocks
	wte, wpe, lnf, dwte, dwpe, dlnf Buffer
}

// block holds one layer's parameter and gradient views.
type block struct {
	ln1, qkv, proj, ln2, fc, mproj       Buffer
	dln1, dqkv, dproj, dln2, dfc, dmproj Buffer
}

func (m *Model) bind() {
	m.wte, m.wpe, m.lnf = m.P("wte"), m.P("wpe"), m.P("ln_f.weight")
	m.dwte, m.dwpe, m.dlnf = m.G("wte"), m.G("wpe"), m.G("ln_f.weight")
	m.blocks = nil
	for l := 0; l < m.Config.Layers; l++ {
		n := func(s string) string { return fmt.Sprintf("blocks.%d.%s", l, s) }
		m.blocks = append(m.blocks, block{
			ln1: m.P(n("ln1.weight")), qkv: m.P(n("attn.qkv.weight")), proj: m.P(n("attn.proj.weight")),
			ln2: m.P(n("ln2.weight")), fc: m.P(n("mlp.fc.weight")), mproj: m.P(n("mlp.proj.weight")),
			dln1: m.G(n("ln1.weight")), dqkv: m.G(n("attn.qkv.weight")), dproj: m.G(n("attn.proj.weight")),
			dln2: m.G(n("ln2.weight")), dfc: m.G(n("mlp.fc.weight")), dmproj: m.G(n("mlp.proj.weight")),
		})
	}
}

// Tensor names (the safetensors layout):
//
//	wte                        [vocab, d_model]   token embedding, tied LM head
//	wpe                        [max_seq, d_model] position embedding
//	blocks.L.ln1.weight        [d_model]
//	blocks.L.attn.qkv.weight   [3*d_model, d_model]
//	blocks.L.attn.proj.weight  [d_model, d_model]
//	blocks.L.ln2.weight        [d_model]
//	blocks.L.mlp.fc.weight     [2*hidden, d_model] (gate rows, then up rows)
//	blocks.L.mlp.proj.weight   [d_model, hidden]
//	ln_f.weight                [d_model]
func layout(c Config) []param {
	D := c.DModel
	ps := []param{{name: "wte", shape: []int{c.Vocab, D}, decay: true}, {name: "wpe", shape: []int{c.MaxSeq, D}, decay: true}}
	for l := 0; l < c.Layers; l++ {
		b := fmt.Sprintf("blocks.%d.", l)
		ps = append(ps,
			param{name: b + "ln1.weight", shape: []int{D}},
			param{name: b + "attn.qkv.weight", shape: []int{3 * D, D}, decay: true},
			param{name: b + "attn.proj.weight", shape: []int{D, D}, decay: true},
			param{name: b + "ln2.weight", shape: []int{D}},
			param{name: b + "mlp.fc.weight", shape: []int{2 * c.Hidden, D}, decay: true},
			param{name: b + "mlp.proj.weight", shape: []int{D, c.Hidden}, decay: true},
		)
	}
	ps = append(ps, param{name: "ln_f.weight", shape: []int{D}})
	off := 0
	for i := range ps {
		ps[i].offset = off
		off += ps[i].size()
	}
	return ps
}

// NewModel allocates a model on the default backend and initializes it
// from seed: normal(0, 0.02) matrices, output projections scaled by
// 1/sqrt(2*layers), norms 1.
func NewModel(c Config, seed uint64) (*Model, error) { return NewModelOn(Default(), c, seed) }

// NewModelOn is NewModel on backend be. The initial weights are drawn on
// the host and copied to the backend once.
func NewModelOn(be Backend, c Config, seed uint64) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Config: c, be: be, params: layout(c), index: map[string]int{}}
	n := 0
	for i, p := range m.params {
		m.index[p.name] = i
		n += p.size()
	}
	m.Params, m.Grads = be.Alloc(n), be.Alloc(n)
	m.bind()
	init := make([]float32, n)
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for _, p := range m.params {
		w := init[p.offset : p.offset+p.size()]
		switch {
		case !p.decay:
			for i := range w {
				w[i] = 1
			}
		default:
			std := 0.02
			if strings.HasSuffix(p.name, "proj.weight") {
				std /= math.Sqrt(2 * float64(c.Layers))
			}
			for i := range w {
				w[i] = float32(r.NormFloat64() * std)
			}
		}
	}
	be.FromHost(m.Params, init)
	return m, nil
}

// Backend is the backend holding the model.
func (m *Model) Backend() Backend { return m.be }

// P returns the parameter tensor of that name (a view into Params).
func (m *Model) P(name string) Buffer {
	p := m.params[m.index[name]]
	return m.Params.Slice(p.offset, p.size())
}

// G returns the gradient of that parameter (a view into Grads).
func (m *Model) G(name string) Buffer {
	p := m.params[m.index[name]]
	return m.Grads.Slice(p.offset, p.size())
}

// DecayMask says which parameters weight decay applies to: a buffer of
// Params' length on the model's backend, 1 where it applies, 0 where not
// (AdamW.Step's decay).
func (m *Model) DecayMask() Buffer {
	mask := make([]float32, m.Params.Len())
	for _, p := range m.params {
		if p.decay {
			for i := p.offset; i < p.offset+p.size(); i++ {
				mask[i] = 1
			}
		}
	}
	b := m.be.Alloc(len(mask))
	m.be.FromHost(b, mask)
	return b
}

// Tensors returns the parameters as named tensors, in layout order,
// copied to the host (the crossing for saving a model).
func (m *Model) Tensors() []Tensor {
	all := make([]float32, m.Params.Len())
	m.be.ToHost(all, m.Params)
	ts := make([]Tensor, len(m.params))
	for i, p := range m.params {
		ts[i] = Tensor{Name: p.name, Shape: p.shape, Data: all[p.offset : p.offset+p.size()]}
	}
	return ts
}

// Save writes the model as safetensors, its config in __metadata__
// ("config", JSON) along with any extra metadata.
func (m *Model) Save(path string, extra map[string]string) error {
	cfg, _ := json.Marshal(m.Config)
	meta := map[string]string{"config": string(cfg), "format": "dflow-lm"}
	for k, v := range extra {
		meta[k] = v
	}
	return WriteSafetensors(path, m.Tensors(), meta)
}

// SaveTraining is Save with AdamW's state (tensors opt.m and opt.v): a
// checkpoint that training resumes from exactly (LoadTrainingOn). A
// model loaded for use leaves them.
func (m *Model) SaveTraining(path string, opt *AdamW, extra map[string]string) error {
	cfg, _ := json.Marshal(m.Config)
	meta := map[string]string{"config": string(cfg), "format": "dflow-lm"}
	for k, v := range extra {
		meta[k] = v
	}
	return WriteSafetensors(path, append(m.Tensors(), optTensors(opt, meta)...), meta)
}

// LoadModel reads a model saved by Save (or SaveTraining) onto the
// default backend, checking every tensor's name and shape against the
// config in its metadata.
func LoadModel(path string) (*Model, map[string]string, error) { return LoadModelOn(Default(), path) }

// LoadModelOn is LoadModel onto backend be.
func LoadModelOn(be Backend, path string) (*Model, map[string]string, error) {
	return LoadTrainingOn(be, path, nil)
}

// LoadTrainingOn is LoadModelOn that also sets opt, when not nil, from a
// checkpoint SaveTraining wrote (left as it is where the file has no
// optimizer state).
func LoadTrainingOn(be Backend, path string, opt *AdamW) (*Model, map[string]string, error) {
	ts, meta, err := ReadSafetensors(path)
	if err != nil {
		return nil, nil, err
	}
	var c Config
	if err := json.Unmarshal([]byte(meta["config"]), &c); err != nil {
		return nil, nil, fmt.Errorf("nn: %s: __metadata__ lacks a valid \"config\": %v", path, err)
	}
	m, err := NewModelOn(be, c, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("nn: %s: %w", path, err)
	}
	got := map[string]Tensor{}
	for _, t := range ts {
		got[t.Name] = t
	}
	for _, p := range m.params {
		t, ok := got[p.name]
		if !ok {
			return nil, nil, fmt.Errorf("nn: %s: tensor %q is missing", path, p.name)
		}
		if fmt.Sprint(t.Shape) != fmt.Sprint(p.shape) {
			return nil, nil, fmt.Errorf("nn: %s: tensor %q has shape %v, the config needs %v", path, p.name, t.Shape, p.shape)
		}
		be.FromHost(m.P(p.name), t.Data)
		delete(got, p.name)
	}
	if opt != nil {
		loadOpt(got, meta, opt, m.Params.Len())
	}
	delete(got, "opt.m") // the training state, not the model's
	delete(got, "opt.v")
	for name := range got {
		return nil, nil, fmt.Errorf("nn: %s: unexpected tensor %q", path, name)
	}
	return m, meta, nil
}

// ReadConfig reads only a model file's header and returns its config, so a
// spec can be checked against a model without loading its weights.
func ReadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("nn: %w", err)
	}
	defer f.Close()
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return Config{}, fmt.Errorf("nn: %s: not a safetensors file: %v", path, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader {
		return Config{}, fmt.Errorf("nn: %s: header length %d is not plausible", path, n)
	}
	h := make([]byte, n)
	if _, err := io.ReadFull(f, h); err != nil {
		return Config{}, fmt.Errorf("nn: %s: truncated header: %v", path, err)
	}
	var hdr struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(h, &hdr); err != nil {
		return Config{}, fmt.Errorf("nn: %s: header is not valid JSON: %v", path, err)
	}
	var c Config
	if err := json.Unmarshal([]byte(hdr.Meta["config"]), &c); err != nil {
		return Config{}, fmt.Errorf("nn: %s: __metadata__ lacks a valid \"config\"", path)
	}
	return c, c.Validate()
}
