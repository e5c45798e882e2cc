package nn

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
)

func h32(x []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, v := range x {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:16]
}

// toHost copies a buffer to a new host slice through its backend.
func toHost(b Buffer) []float32 {
	x := make([]float32, b.Len())
	b.Backend().ToHost(x, b)
	return x
}

// TestBitIdentical: three training steps of a small target and of a
// drafter on it, then a forward pass, give bit for bit the losses,
// weights and logits the kernels gave before the backend seam (the
// hashes were recorded with the kernels as they were then, on gonum's
// sgemm).
// OpenBLAS rounds differently, so the figures hold for the gonum build.
func TestBitIdentical(t *testing.T) {
	if CPU().Name() != "gonum" {
		t.Skipf("the recorded hashes are gonum's; this build's sgemm is %s", CPU().Name())
	}
	m, _ := NewModel(Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 16}, 11)
	w, _ := m.NewWorkspace(2, 16)
	tokens, targets := make([]int32, 32), make([]int32, 32)
	for i := range tokens {
		tokens[i], targets[i] = int32((i*37+5)%256), int32((i*11+3)%256)
	}
	opt := NewAdamW(m.Backend(), m.Params.Len(), 1e-2)
	mask := m.DecayMask()
	var loss float64
	for range 3 {
		w.Forward(tokens)
		loss = w.Loss(targets, nil)
		m.ZeroGrad()
		w.Backward(targets, nil)
		opt.Step(m.Params, m.Grads, mask)
	}
	got := fmt.Sprintf("%016x %s %s", math.Float64bits(loss), h32(toHost(m.Params)), h32(toHost(w.Forward(tokens))))
	if want := "40147b91dea01cd4 a597d876543499ad 3c7d382306ac7b83"; got != want {
		t.Errorf("target: loss bits, weights, logits %s; before the seam %s", got, want)
	}
	d, _ := NewDrafter(DrafterConfig{D: 16, K: 2, Layers: 2, Heads: 2, Hidden: 24, BlockSize: 4}, m.P("wte"), 5)
	dw := d.NewWork(3)
	fill(dw, 9)
	dopt := NewAdamW(d.Backend(), d.Params.Len(), 1e-2)
	dmask := d.DecayMask()
	for range 3 {
		dw.Forward()
		loss = dw.Loss(3)
		d.Backend().Zero(d.Grads)
		dw.Backward()
		dopt.Step(d.Params, d.Grads, dmask)
	}
	got = fmt.Sprintf("%016x %s %s", math.Float64bits(loss), h32(toHost(d.Params)), h32(toHost(dw.Forward())))
	if want := "40161bb5e3f008d5 4cba5de4ec3a7369 3cda4505f7f9a6d8"; got != want {
		t.Errorf("drafter: loss bits, weights, logits %s; before the seam %s", got, want)
	}
}

// TestBuffer: views share memory, the crossings copy, the zero Buffer is
// none, and a view out of range panics.
func TestBuffer(t *testing.T) {
	be := CPU()
	b := be.Alloc(6)
	be.FromHost(b.Slice(2, 3), []float32{1, 2, 3})
	if got := toHost(b); fmt.Sprint(got) != "[0 0 1 2 3 0]" {
		t.Errorf("after FromHost into a view: %v", got)
	}
	be.Scale(b.Slice(3, 3), 2)
	be.Accumulate(b.Slice(0, 2), b.Slice(3, 2))
	if got := toHost(b); fmt.Sprint(got) != "[4 6 1 4 6 0]" {
		t.Errorf("after Scale and Accumulate: %v", got)
	}
	if b.Backend() != be || !(Buffer{}).IsNil() || b.IsNil() || (Buffer{}).Backend() != nil {
		t.Error("Backend or IsNil wrong")
	}
	ints := be.AllocInts(3)
	be.ArgmaxRows(ints, b, 3, 2)
	got := make([]int32, 3)
	be.IntsToHost(got, ints)
	if fmt.Sprint(got) != "[1 1 0]" {
		t.Errorf("ArgmaxRows: %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("a view past the end did not panic")
		}
	}()
	b.Slice(4, 3)
}
