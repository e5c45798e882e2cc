//go:build cuda

package nn

// The CUDA backend's checks on a GPU (bench/gpu/run runs them; this test
// binary exits through gpuguard on a machine without one, so CI only
// compiles and vets it): parity with the CPU backend to 1e-3 relative on
// logits, a target training step and a drafter training step, and the
// figures (GEMM TFLOP/s through the backend and through cuBLAS alone,
// forward and training tokens/s; BenchmarkForward and BenchmarkTrainStep
// are the CPU's).

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/nn/cudakern"
)

func cudaOrSkip(t testing.TB) Backend {
	be, err := ForDevice("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// relErr is max |a-b| / max(max |a|, 1e-6).
func relErr(a, b []float32) float64 {
	var d, m float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
		m = math.Max(m, math.Abs(float64(a[i])))
	}
	return d / math.Max(m, 1e-6)
}

func onHost(b Buffer) []float32 {
	x := make([]float32, b.Len())
	b.Backend().ToHost(x, b)
	return x
}

// twin is the same model on the CPU and on the GPU.
func twin(t testing.TB, be Backend, c Config) (*Model, *Model) {
	cm, err := NewModel(c, 7)
	if err != nil {
		t.Fatal(err)
	}
	gm, err := NewModelOn(be, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	be.FromHost(gm.Params, host(cm.Params))
	return cm, gm
}

func parity(t *testing.T, what string, cpu, gpu Buffer) {
	t.Helper()
	e := relErr(onHost(cpu), onHost(gpu))
	t.Logf("%s: relative error %.2e", what, e)
	if e > 1e-3 || math.IsNaN(e) {
		t.Errorf("%s: relative error %.3g > 1e-3", what, e)
	}
}

func TestCUDAParityLogits(t *testing.T) {
	be := cudaOrSkip(t)
	cm, gm := twin(t, be, benchConfig)
	B, T := 4, 128
	tokens, _ := benchBatch(B, T)
	cw, _ := cm.NewWorkspace(B, T)
	gw, err := gm.NewWorkspace(B, T)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Free()
	parity(t, "logits", cw.Forward(tokens), gw.Forward(tokens))
	for l := -1; l < benchConfig.Layers; l++ {
		parity(t, "hidden", cw.Hidden(l), gw.Hidden(l))
	}
	g := be.AllocInts(B * T)
	be.ArgmaxRows(g, gw.Logits(), B*T, 256)
	got, want := make([]int32, B*T), make([]int32, B*T)
	be.IntsToHost(got, g)
	CPU().ArgmaxRows(wrapInts(want), cw.Logits(), B*T, 256)
	diff := 0
	for i := range got {
		if got[i] != want[i] {
			diff++
		}
	}
	t.Logf("greedy tokens: %d of %d differ (near-ties)", diff, B*T)
	if diff > B*T/100 {
		t.Errorf("greedy tokens: %d of %d differ", diff, B*T)
	}
}

func TestCUDAParityTrainStep(t *testing.T) {
	be := cudaOrSkip(t)
	cm, gm := twin(t, be, benchConfig)
	B, T := 4, 128
	tokens, targets := benchBatch(B, T)
	weights := make([]float32, B*T)
	for i := range weights {
		weights[i] = float32(i%3) / 2
	}
	step := func(m *Model) float64 {
		w, _ := m.NewWorkspace(B, T)
		w.Forward(tokens)
		loss := w.Loss(targets, weights)
		m.ZeroGrad()
		w.Backward(targets, weights)
		opt := NewAdamW(m.Backend(), m.Params.Len(), 1e-3)
		opt.Step(m.Params, m.Grads, m.DecayMask())
		return loss
	}
	cl, gl := step(cm), step(gm)
	t.Logf("loss: cpu %.6f cuda %.6f", cl, gl)
	if math.Abs(cl-gl) > 1e-3*math.Abs(cl) {
		t.Errorf("loss: cpu %v, cuda %v", cl, gl)
	}
	for _, p := range cm.params {
		parity(t, "grad "+p.name, cm.G(p.name), gm.G(p.name))
	}
	parity(t, "params after AdamW", cm.Params, gm.Params)
}

func TestCUDAParityDrafterStep(t *testing.T) {
	be := cudaOrSkip(t)
	cm, gm := twin(t, be, benchConfig)
	c := DrafterConfig{D: benchConfig.DModel, K: 3, Layers: 2, Heads: 4, Hidden: 256, BlockSize: 16}
	cd, err := NewDrafter(c, cm.P("wte"), 3)
	if err != nil {
		t.Fatal(err)
	}
	gd, err := NewDrafter(c, gm.P("wte"), 3)
	if err != nil {
		t.Fatal(err)
	}
	S := 64
	cw, gw := cd.NewWork(S), gd.NewWork(S)
	fill(cw, 5)
	fill(gw, 5)
	parity(t, "drafter logits", cw.Forward(), gw.Forward())
	cl, gl := cw.Loss(0.8), gw.Loss(0.8)
	if math.Abs(cl-gl) > 1e-3*math.Abs(cl) {
		t.Errorf("drafter loss: cpu %v, cuda %v", cl, gl)
	}
	cw.Backward()
	gw.Backward()
	for _, n := range cd.names {
		parity(t, "drafter grad "+n, cd.G(n), gd.G(n))
	}
	co, gop := NewAdamW(cd.Backend(), cd.Params.Len(), 1e-3), NewAdamW(be, gd.Params.Len(), 1e-3)
	co.Step(cd.Params, cd.Grads, cd.DecayMask())
	gop.Step(gd.Params, gd.Grads, gd.DecayMask())
	parity(t, "drafter params after AdamW", cd.Params, gd.Params)
}

// TestCUDAKernels: each elementwise and row kernel against the CPU's on
// odd sizes (not multiples of the block).
func TestCUDAKernels(t *testing.T) {
	be := cudaOrSkip(t)
	r := rand.New(rand.NewPCG(9, 9))
	up := func(x []float32) Buffer { b := be.Alloc(len(x)); be.FromHost(b, x); return b }
	rnd := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	N, D := 37, 301
	x, w := rnd(N*D), rnd(D)
	co, cr := wrap(make([]float32, N*D)), wrap(make([]float32, N))
	go1, gr := be.Alloc(N*D), be.Alloc(N)
	CPU().RMSNorm(co, cr, wrap(x), wrap(w), N, D)
	be.RMSNorm(go1, gr, up(x), up(w), N, D)
	parity(t, "rmsnorm", co, go1)
	parity(t, "rstd", cr, gr)
	h := rnd(N * 2 * D)
	CPU().SwiGLU(co, wrap(h), N, D)
	be.SwiGLU(go1, up(h), N, D)
	parity(t, "swiglu", co, go1)
	if s, g := CPU().SumSquares(wrap(x)), be.SumSquares(up(x)); math.Abs(s-g) > 1e-6*s {
		t.Errorf("sum of squares: cpu %v, cuda %v", s, g)
	}
}

// BenchmarkCUDAGemm: TFLOP/s of a 4096^3 fp32 product through the
// backend's MatMul (the seam: context binding, the plan, one cuBLAS
// call) and through the same cuBLAS handle alone.
func BenchmarkCUDAGemm(b *testing.B) {
	be := cudaOrSkip(b).(*cudaBackend)
	n := 4096
	in, w, out := be.Alloc(n*n), be.Alloc(n*n), be.Alloc(n*n)
	be.Scale(in, 0)
	flops := 2 * float64(n) * float64(n) * float64(n)
	for _, via := range []string{"backend", "cublas"} {
		b.Run(via, func(b *testing.B) {
			g := cudakern.Linear(n, n, n)
			pin, pw, pout := be.p(in), be.p(w), be.p(out)
			run := func() {
				if via == "backend" {
					be.MatMul(out, in, w, Buffer{}, n, n, n)
					return
				}
				defer be.enter()()
				be.check(be.blas.Sgemm(g, 1, uintptr(pw), uintptr(pin), 0, uintptr(pout)), "sgemm")
			}
			run()
			be.Synchronize()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				run()
			}
			be.Synchronize()
			b.ReportMetric(flops*float64(b.N)/time.Since(start).Seconds()/1e12, "TFLOP/s")
		})
	}
}

// BenchmarkCUDAForward and BenchmarkCUDATrainStep: BenchmarkForward and
// BenchmarkTrainStep (the CPU's) on the GPU, at their batch and a larger.
func BenchmarkCUDAForward(b *testing.B) {
	be := cudaOrSkip(b)
	for _, B := range []int{8, 64} {
		b.Run(map[int]string{8: "B8", 64: "B64"}[B], func(b *testing.B) {
			m, _ := NewModelOn(be, benchConfig, 1)
			T := 128
			w, _ := m.NewWorkspace(B, T)
			defer w.Free()
			tokens, _ := benchBatch(B, T)
			w.Forward(tokens)
			Synchronize(be)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				w.Forward(tokens)
			}
			Synchronize(be)
			b.ReportMetric(float64(b.N*B*T)/time.Since(start).Seconds(), "tokens/s")
		})
	}
}

func BenchmarkCUDATrainStep(b *testing.B) {
	be := cudaOrSkip(b)
	for _, B := range []int{8, 64} {
		b.Run(map[int]string{8: "B8", 64: "B64"}[B], func(b *testing.B) {
			m, _ := NewModelOn(be, benchConfig, 1)
			T := 128
			w, _ := m.NewWorkspace(B, T)
			defer w.Free()
			tokens, targets := benchBatch(B, T)
			opt := NewAdamW(be, m.Params.Len(), 1e-3)
			mask := m.DecayMask()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				w.Forward(tokens)
				w.Loss(targets, nil) // synchronizes (the loss is a host scalar)
				m.ZeroGrad()
				w.Backward(targets, nil)
				opt.Step(m.Params, m.Grads, mask) // synchronizes (the norm)
			}
			b.ReportMetric(float64(b.N*B*T)/time.Since(start).Seconds(), "tokens/s")
		})
	}
}
