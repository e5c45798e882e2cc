package nn

import (
	"math/rand/v2"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
)

// TargetConfig is the shipped target model's shape.
var benchConfig = Config{Vocab: 256, DModel: 128, Layers: 4, Heads: 4, Hidden: 352, MaxSeq: 128}

func benchBatch(B, T int) (tokens, targets []int32) {
	r := rand.New(rand.NewPCG(1, 1))
	tokens, targets = make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(r.IntN(256)), int32(r.IntN(256))
	}
	return
}

// BenchmarkForward: tokens/s of the target model's forward pass.
func BenchmarkForward(b *testing.B) {
	m, _ := NewModel(benchConfig, 1)
	B, T := 8, 128
	w, _ := m.NewWorkspace(B, T)
	tokens, _ := benchBatch(B, T)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		w.Forward(tokens)
	}
	b.ReportMetric(float64(b.N*B*T)/time.Since(start).Seconds(), "tokens/s")
}

// BenchmarkTrainStep: tokens/s of forward + backward + AdamW.
func BenchmarkTrainStep(b *testing.B) {
	m, _ := NewModel(benchConfig, 1)
	B, T := 8, 128
	w, _ := m.NewWorkspace(B, T)
	tokens, targets := benchBatch(B, T)
	opt := NewAdamW(m.Backend(), m.Params.Len(), 1e-3)
	mask := m.DecayMask()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		w.Forward(tokens)
		w.Loss(targets, nil)
		m.ZeroGrad()
		w.Backward(targets, nil)
		opt.Step(m.Params, m.Grads, mask)
	}
	b.ReportMetric(float64(b.N*B*T)/time.Since(start).Seconds(), "tokens/s")
}

// BenchmarkSgemm: GFLOP/s of gonum's sgemm at 512x512x512, the figure to
// hold against the machine's peak (see docs/models.md).
func BenchmarkSgemm(b *testing.B) {
	n := 512
	a, bb, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], bb[i] = float32(i%7), float32(i%5)
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, bb, n, 0, c, n)
	}
	b.ReportMetric(2*float64(n*n*n)*float64(b.N)/time.Since(start).Seconds()/1e9, "GFLOP/s")
	b.Logf("backend %s", CPU().Name())
}
