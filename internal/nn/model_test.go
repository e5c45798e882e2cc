package nn

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var tiny = Config{Vocab: 11, DModel: 8, Layers: 2, Heads: 2, Hidden: 12, MaxSeq: 6}

func tinyBatch() (tokens, targets []int32) {
	tokens = []int32{1, 4, 2, 9, 3, 0, 5, 5, 7, 10, 6, 2}
	targets = []int32{4, 2, 9, 3, 0, 8, 5, 7, 10, 6, 2, -1}
	return
}

// TestModelGrad checks the whole model's backward pass against finite
// differences, on every parameter tensor.
func TestModelGrad(t *testing.T) {
	m, err := NewModel(tiny, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Larger weights than the init, so every path carries gradient.
	for i := range host(m.Params) {
		host(m.Params)[i] *= 3
	}
	w, _ := m.NewWorkspace(2, 6)
	tokens, targets := tinyBatch()
	weights := []float32{1, 1, 0.5, 1, 1, 1, 1, 0.25, 1, 1, 1, 1}
	loss := func() float64 { w.Forward(tokens); return w.Loss(targets, weights) }
	loss()
	m.ZeroGrad()
	w.Backward(targets, weights)
	for _, p := range m.params {
		checkGradEps(t, p.name, host(m.P(p.name)), host(m.G(p.name)), loss, 1e-3)
	}
}

// TestOverfit: a tiny model learns a fixed batch to near-zero loss.
func TestOverfit(t *testing.T) {
	m, _ := NewModel(Config{Vocab: 11, DModel: 32, Layers: 2, Heads: 4, Hidden: 64, MaxSeq: 6}, 1)
	w, _ := m.NewWorkspace(2, 6)
	tokens, targets := tinyBatch()
	opt := NewAdamW(CPU(), m.Params.Len(), 1e-2)
	opt.WeightDecay = 0
	var first, loss float64
	for step := 0; step < 300; step++ {
		w.Forward(tokens)
		loss = w.Loss(targets, nil)
		if step == 0 {
			first = loss
		}
		m.ZeroGrad()
		w.Backward(targets, nil)
		opt.Step(m.Params, m.Grads, m.DecayMask())
	}
	if math.Abs(first-math.Log(11)) > 0.1 || loss > 0.01 {
		t.Errorf("loss %.4f -> %.4f; want ln 11 -> near 0", first, loss)
	}
}

func TestSaveLoad(t *testing.T) {
	m, _ := NewModel(tiny, 5)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := m.Save(path, map[string]string{"note": "x"}); err != nil {
		t.Fatal(err)
	}
	got, meta, err := LoadModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != tiny || meta["note"] != "x" {
		t.Errorf("config %+v meta %v", got.Config, meta)
	}
	for i := range host(m.Params) {
		if host(got.Params)[i] != host(m.Params)[i] {
			t.Fatal("parameters differ after a round trip")
		}
	}
	// Same weights, same logits; the hidden states are exposed per layer.
	tokens, _ := tinyBatch()
	w1, _ := m.NewWorkspace(2, 6)
	w2, _ := got.NewWorkspace(2, 6)
	l1, l2 := host(w1.Forward(tokens)), host(w2.Forward(tokens))
	for i := range l1 {
		if l1[i] != l2[i] {
			t.Fatal("logits differ")
		}
	}
	if w1.Hidden(1).Len() != 12*tiny.DModel || &host(w1.Hidden(-1))[0] == &host(w1.Hidden(0))[0] {
		t.Error("hidden states not per layer")
	}
	// A file whose tensors do not match its config is refused.
	bad := m.Tensors()
	bad[0].Shape = []int{bad[0].Shape[1], bad[0].Shape[0]}
	WriteSafetensors(path, bad, map[string]string{"config": `{"vocab":11,"d_model":8,"layers":2,"heads":2,"hidden":12,"max_seq":6}`})
	if _, _, err := LoadModel(path); err == nil || !strings.Contains(err.Error(), `tensor "wte" has shape [8 11]`) {
		t.Errorf("mismatched shape: %v", err)
	}
}

// TestCausalLM: a position's logits do not depend on later tokens.
func TestCausalLM(t *testing.T) {
	m, _ := NewModel(tiny, 9)
	w, _ := m.NewWorkspace(1, 6)
	a := append([]float32(nil), host(w.Forward([]int32{1, 2, 3, 4, 5, 6}))...)
	b := host(w.Forward([]int32{1, 2, 3, 9, 9, 9}))
	for i := 0; i < 3*tiny.Vocab; i++ {
		if a[i] != b[i] {
			t.Fatal("position < 3 changed with later tokens")
		}
	}
}

// TestSaveTraining: a checkpoint with AdamW's state loads as a model (the
// state left), and as training state gives the same weights, moments and
// count; a model saved without it leaves the optimizer as it was.
func TestSaveTraining(t *testing.T) {
	m, _ := NewModel(tiny, 5)
	opt := NewAdamW(m.Backend(), m.Params.Len(), 0.01)
	g := m.be.Alloc(m.Params.Len())
	grad := make([]float32, m.Params.Len())
	for i := range 3 {
		for j := range grad {
			grad[j] = float32((i+j)%5) - 2
		}
		m.be.FromHost(g, grad)
		opt.Step(m.Params, g, Buffer{})
	}
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	if err := m.SaveTraining(path, opt, map[string]string{"steps": "3"}); err != nil {
		t.Fatal(err)
	}
	if _, meta, err := LoadModel(path); err != nil || meta["opt.t"] != "3" {
		t.Fatalf("as a model: %v, opt.t %q", err, meta["opt.t"])
	}
	opt2 := NewAdamW(m.Backend(), m.Params.Len(), 0.01)
	m2, _, err := LoadTrainingOn(m.Backend(), path, opt2)
	if err != nil {
		t.Fatal(err)
	}
	host := func(b Buffer) []float32 {
		out := make([]float32, b.Len())
		b.Backend().ToHost(out, b)
		return out
	}
	am, av, at := opt.State()
	bm, bv, bt := opt2.State()
	if at != bt {
		t.Fatalf("count %d, want %d", bt, at)
	}
	for k, pair := range [][2]Buffer{{m.Params, m2.Params}, {am, bm}, {av, bv}} {
		if x, y := host(pair[0]), host(pair[1]); !slices.Equal(x, y) {
			t.Fatalf("buffer %d differs after the round trip", k)
		}
	}
	plain := filepath.Join(t.TempDir(), "m.safetensors")
	if err := m.Save(plain, nil); err != nil {
		t.Fatal(err)
	}
	opt3 := NewAdamW(m.Backend(), m.Params.Len(), 0.01)
	if _, _, err := LoadTrainingOn(m.Backend(), plain, opt3); err != nil {
		t.Fatal(err)
	}
	if _, _, ct := opt3.State(); ct != 0 {
		t.Errorf("a model without optimizer state set its count to %d", ct)
	}
}
