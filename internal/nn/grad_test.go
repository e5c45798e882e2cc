package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

func randn(r *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * scale
	}
	return x
}

// dotLoss is the scalar sum(out * r): its gradient wrt out is r.
func dotLoss(out, r []float32) float64 {
	var s float64
	for i := range out {
		s += float64(out[i]) * float64(r[i])
	}
	return s
}

// checkGrad compares analytic gradients of x with central differences of
// loss, on up to 40 elements.
func checkGrad(t *testing.T, name string, x, analytic []float32, loss func() float64) {
	t.Helper()
	checkGradEps(t, name, x, analytic, loss, 1e-2)
}

func checkGradEps(t *testing.T, name string, x, analytic []float32, loss func() float64, eps float32) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, uint64(len(x))))
	worst := 0.0
	for k := 0; k < min(40, len(x)); k++ {
		i := k
		if len(x) > 40 {
			i = r.IntN(len(x))
		}
		orig := x[i]
		x[i] = orig + eps
		lp := loss()
		x[i] = orig - eps
		lm := loss()
		x[i] = orig
		num := (lp - lm) / (2 * float64(eps))
		a := float64(analytic[i])
		err := math.Abs(a-num) / math.Max(1, math.Max(math.Abs(a), math.Abs(num)))
		worst = max(worst, err)
		if err > 2e-2 {
			t.Errorf("%s[%d]: analytic %.6g, numeric %.6g", name, i, a, num)
			return
		}
	}
	t.Logf("%s: worst relative error %.2g", name, worst)
}

func TestEmbeddingGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	N, D, V := 6, 5, 4
	table, tokens := randn(r, V*D, 1), []int32{0, 3, 3, 1, 2, 0}
	R, out, dtable := randn(r, N*D, 1), make([]float32, N*D), make([]float32, V*D)
	EmbeddingForward(out, tokens, table, N, D)
	EmbeddingBackward(dtable, tokens, R, N, D)
	checkGrad(t, "dtable", table, dtable, func() float64 { EmbeddingForward(out, tokens, table, N, D); return dotLoss(out, R) })
}

func TestRMSNormGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	N, D := 3, 8
	x, w, R := randn(r, N*D, 1), randn(r, D, 1), randn(r, N*D, 1)
	out, rstd := make([]float32, N*D), make([]float32, N)
	dx, dw := make([]float32, N*D), make([]float32, D)
	RMSNormForward(out, rstd, x, w, N, D)
	RMSNormBackward(dx, dw, R, x, w, rstd, N, D)
	loss := func() float64 { RMSNormForward(out, rstd, x, w, N, D); return dotLoss(out, R) }
	checkGrad(t, "dx", x, dx, loss)
	checkGrad(t, "dweight", w, dw, loss)
}

func TestMatMulGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 3))
	N, In, Out := 4, 6, 5
	in, w, b, R := randn(r, N*In, 1), randn(r, Out*In, 0.5), randn(r, Out, 0.5), randn(r, N*Out, 1)
	out := make([]float32, N*Out)
	din, dw, db := make([]float32, N*In), make([]float32, Out*In), make([]float32, Out)
	MatMulForward(out, in, w, b, N, In, Out)
	MatMulBackward(din, dw, db, R, in, w, N, In, Out)
	loss := func() float64 { MatMulForward(out, in, w, b, N, In, Out); return dotLoss(out, R) }
	checkGrad(t, "din", in, din, loss)
	checkGrad(t, "dw", w, dw, loss)
	checkGrad(t, "dbias", b, db, loss)
}

func TestSwiGLUGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 4))
	N, H := 3, 7
	h, R := randn(r, N*2*H, 1.5), randn(r, N*H, 1)
	out, dh := make([]float32, N*H), make([]float32, N*2*H)
	SwiGLUForward(out, h, N, H)
	SwiGLUBackward(dh, R, h, N, H)
	checkGrad(t, "dh", h, dh, func() float64 { SwiGLUForward(out, h, N, H); return dotLoss(out, R) })
}

func TestAttentionGrad(t *testing.T) {
	for _, causal := range []bool{true, false} {
		r := rand.New(rand.NewPCG(1, 5))
		B, T, C, NH := 2, 5, 8, 2
		qkv, R := randn(r, B*T*3*C, 1), randn(r, B*T*C, 1)
		out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
		dqkv, scratch := make([]float32, B*T*3*C), make([]float32, B*NH*T*T)
		AttentionForward(out, att, qkv, B, T, C, NH, causal)
		AttentionBackward(dqkv, R, qkv, att, scratch, B, T, C, NH, causal)
		name := map[bool]string{true: "dqkv causal", false: "dqkv non-causal"}[causal]
		checkGrad(t, name, qkv, dqkv, func() float64 { AttentionForward(out, att, qkv, B, T, C, NH, causal); return dotLoss(out, R) })
	}
}

// TestAttentionCausality: under the causal mask, changing a later
// position's key or value leaves earlier outputs unchanged.
func TestAttentionCausality(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 6))
	B, T, C, NH := 1, 4, 4, 1
	qkv := randn(r, B*T*3*C, 1)
	out1, out2, att := make([]float32, T*C), make([]float32, T*C), make([]float32, T*T)
	AttentionForward(out1, att, qkv, B, T, C, NH, true)
	for i := 3 * 3 * C; i < 4*3*C; i++ {
		qkv[i] += 1
	}
	AttentionForward(out2, att, qkv, B, T, C, NH, true)
	for i := 0; i < 3*C; i++ {
		if out1[i] != out2[i] {
			t.Fatalf("output %d changed when only position 3 changed", i)
		}
	}
}

func TestCrossEntropyGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 7))
	N, V := 4, 6
	logits := randn(r, N*V, 2)
	targets := []int32{1, 5, -1, 0}
	weights := []float32{1, 0.5, 1, 0.25}
	probs, dl := make([]float32, N*V), make([]float32, N*V)
	CrossEntropyForward(probs, logits, targets, weights, N, V)
	CrossEntropyBackward(dl, probs, targets, weights, N, V)
	checkGrad(t, "dlogits", logits, dl, func() float64 { return CrossEntropyForward(probs, logits, targets, weights, N, V) })
	for i := 2 * V; i < 3*V; i++ {
		if dl[i] != 0 {
			t.Fatal("a row with target -1 got a gradient")
		}
	}
}

// TestCrossEntropyKnown: uniform logits over V classes give loss ln V.
func TestCrossEntropyKnown(t *testing.T) {
	V := 256
	logits, probs := make([]float32, V), make([]float32, V)
	if got := CrossEntropyForward(probs, logits, []int32{42}, nil, 1, V); math.Abs(got-math.Log(256)) > 1e-6 {
		t.Errorf("loss %v, want ln 256 = %v", got, math.Log(256))
	}
}

func TestAdamW(t *testing.T) {
	// Minimize sum (p - 3)^2 from 0: AdamW without decay gets there.
	p := []float32{0, 0}
	o := NewAdamW(CPU(), 2, 0.1)
	o.WeightDecay = 0
	g := make([]float32, 2)
	pb, gb := wrap(p), wrap(g)
	for range 500 {
		for i := range p {
			g[i] = 2 * (p[i] - 3)
		}
		o.Step(pb, gb, Buffer{})
	}
	if math.Abs(float64(p[0]-3)) > 1e-2 {
		t.Errorf("p = %v, want 3", p)
	}
	// Clipping: a huge gradient moves a parameter by about lr on step 1.
	q := []float32{0}
	o2 := NewAdamW(CPU(), 1, 0.01)
	if n := o2.Step(wrap(q), wrap([]float32{1e6}), Buffer{}); n != 1e6 || math.Abs(float64(q[0])+0.01) > 1e-3 {
		t.Errorf("norm %v, q %v", n, q)
	}
}
