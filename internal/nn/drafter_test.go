package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func randWTE(D int, seed uint64) Buffer {
	r := rand.New(rand.NewPCG(seed, 1))
	w := make([]float32, 256*D)
	for i := range w {
		w[i] = float32(r.NormFloat64()) * 0.5
	}
	return wrap(w)
}

var small = DrafterConfig{D: 8, K: 2, Layers: 2, Heads: 2, Hidden: 12, BlockSize: 4}

func fill(w *DrafterWork, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 2))
	c := w.d.Config
	h := make([]float32, c.K*c.D)
	for s := 0; s < w.S; s++ {
		for i := range h {
			h[i] = float32(r.NormFloat64())
		}
		w.Sample(s, h, int32(r.IntN(256)), []int32{int32(r.IntN(256)), int32(r.IntN(256)), -1})
	}
}

// TestDrafterGrad checks the drafter's backward pass, tensor by tensor,
// against finite differences.
func TestDrafterGrad(t *testing.T) {
	d, err := NewDrafter(small, randWTE(8, 1), 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range host(d.Params) {
		host(d.Params)[i] *= 3
	}
	w := d.NewWork(3)
	fill(w, 1)
	loss := func() float64 { w.Forward(); return w.Loss(2) }
	loss()
	clear(host(d.Grads))
	w.Backward()
	r := rand.New(rand.NewPCG(5, 5))
	for _, name := range d.names {
		x, g := host(d.P(name)), host(d.G(name))
		worst := 0.0
		for k := 0; k < min(12, len(x)); k++ {
			i := r.IntN(len(x))
			orig := x[i]
			x[i] = orig + 1e-3
			lp := loss()
			x[i] = orig - 1e-3
			lm := loss()
			x[i] = orig
			num := (lp - lm) / 2e-3
			rel := math.Abs(num-float64(g[i])) / math.Max(1, math.Max(math.Abs(num), math.Abs(float64(g[i]))))
			worst = max(worst, rel)
		}
		if worst > 2e-2 {
			t.Errorf("%s: worst relative error %.3g", name, worst)
		}
	}
}

// TestDrafterOverfit: the drafter learns fixed samples to near-zero loss,
// and the labels' weights follow exp(-(k-1)/gamma).
func TestDrafterOverfit(t *testing.T) {
	d, _ := NewDrafter(DrafterConfig{D: 16, K: 2, Layers: 1, Heads: 2, Hidden: 32, BlockSize: 4}, randWTE(16, 2), 1)
	w := d.NewWork(4)
	fill(w, 2)
	opt := NewAdamW(CPU(), d.Params.Len(), 1e-2)
	opt.WeightDecay = 0
	var first, loss float64
	for step := 0; step < 400; step++ {
		w.Forward()
		loss = w.Loss(4)
		if step == 0 {
			first = loss
		}
		clear(host(d.Grads))
		w.Backward()
		opt.Step(d.Params, d.Grads, d.DecayMask())
	}
	if loss > 0.05 || first < 3 {
		t.Errorf("loss %.3f -> %.3f", first, loss)
	}
	if wt := host(w.weights); wt[1] != 1 || math.Abs(float64(wt[2])-math.Exp(-0.25)) > 1e-6 {
		t.Errorf("position weights %v", wt[:4])
	}
}

func TestDrafterSaveLoad(t *testing.T) {
	wte := randWTE(8, 3)
	d, _ := NewDrafter(small, wte, 4)
	opt := NewAdamW(CPU(), d.Params.Len(), 1e-3)
	w := d.NewWork(2)
	fill(w, 3)
	w.Forward()
	w.Loss(4)
	w.Backward()
	opt.Step(d.Params, d.Grads, Buffer{})
	path := filepath.Join(t.TempDir(), "d.safetensors")
	if err := d.Save(path, opt, map[string]string{"step": "1"}); err != nil {
		t.Fatal(err)
	}
	opt2 := NewAdamW(CPU(), d.Params.Len(), 1e-3)
	got, meta, err := LoadDrafter(path, wte, opt2)
	if err != nil || !reflect.DeepEqual(got.Config, small) || meta["step"] != "1" {
		t.Fatalf("%v %+v %v", err, got, meta)
	}
	m1, v1, t1 := opt.State()
	m2, v2, t2 := opt2.State()
	if t1 != t2 || host(m1)[5] != host(m2)[5] || host(v1)[7] != host(v2)[7] || host(got.Params)[9] != host(d.Params)[9] {
		t.Error("weights or optimizer state lost in the round trip")
	}
	if _, _, err := LoadDrafter(filepath.Join(t.TempDir(), "none"), wte, nil); err == nil {
		t.Error("missing file: want an error")
	}
}

// TestNotADrafter: a target LM or another file where a drafter checkpoint
// is wanted is an error in words, not a struct dump.
func TestNotADrafter(t *testing.T) {
	dir := t.TempDir()
	m, _ := NewModel(Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 7)
	target := filepath.Join(dir, "target.safetensors")
	if err := m.Save(target, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadDrafter(target, m.P("wte"), nil); err == nil || !strings.Contains(err.Error(), target+" is a target LM, not a drafter checkpoint") {
		t.Errorf("target LM: %v", err)
	}
	plain := filepath.Join(dir, "plain.safetensors")
	WriteSafetensors(plain, []Tensor{{Name: "x", Shape: []int{1}, Data: []float32{1}}}, nil)
	if _, _, err := LoadDrafter(plain, m.P("wte"), nil); err == nil || !strings.Contains(err.Error(), "is not a drafter checkpoint: its metadata has no format") {
		t.Errorf("plain safetensors: %v", err)
	}
}

func TestDefaultTaps(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want string
	}{{4, 3, "[0 2 3]"}, {4, 2, "[0 3]"}, {2, 3, "[0 1]"}, {36, 5, "[0 9 18 26 35]"}, {4, 1, "[3]"}} {
		if got := fmt.Sprint(DefaultTaps(tc.n, tc.k)); got != tc.want {
			t.Errorf("DefaultTaps(%d, %d) = %s, want %s", tc.n, tc.k, got, tc.want)
		}
	}
}
