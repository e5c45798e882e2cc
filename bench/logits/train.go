package main

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dflow-dev/dflow/internal/nn"
)

// trainParity runs steps of target training (forward, loss, backward,
// AdamW) on the fixed batch, then steps of drafter training on the
// trained target's hidden states, and prints each run's final loss and a
// hash of the weights, bit for bit: the record that a change to the
// kernels or the backend left training unchanged.
func trainParity(m *nn.Model, tokens []int32, B, T, steps int) error {
	w, err := m.NewWorkspace(B, T)
	if err != nil {
		return err
	}
	targets := make([]int32, len(tokens))
	for i := range targets {
		targets[i] = tokens[(i+1)%len(tokens)]
	}
	be := m.Backend()
	opt := nn.NewAdamW(be, m.Params.Len(), 1e-3)
	mask := m.DecayMask()
	var loss float64
	for range steps {
		w.Forward(tokens)
		loss = w.Loss(targets, nil)
		m.ZeroGrad()
		w.Backward(targets, nil)
		opt.Step(m.Params, m.Grads, mask)
	}
	fmt.Printf("target: %d steps, final loss %v (bits %016x), weights sha256 %s\n", steps, loss, math.Float64bits(loss), hash(be, m.Params))

	c := m.Config
	taps := nn.DefaultTaps(c.Layers, 2)
	dc := nn.DrafterConfig{D: c.DModel, K: len(taps), Taps: taps, Layers: 1, Heads: c.Heads, Hidden: 2 * c.DModel, BlockSize: 8}
	d, err := nn.NewDrafter(dc, m.P("wte"), 1)
	if err != nil {
		return err
	}
	logits := make([]float32, B*T*c.Vocab)
	be.ToHost(logits, w.Forward(tokens))
	S := B
	dw := d.NewWork(S)
	hidden := make([]float32, dc.K*dc.D)
	labels := make([]int32, dc.BlockSize-1)
	for s := range S {
		i := s*T + s%(T-dc.BlockSize)
		for k, l := range taps {
			be.ToHost(hidden[k*dc.D:(k+1)*dc.D], w.Hidden(l).Slice(i*dc.D, dc.D))
		}
		for j := range labels {
			labels[j] = nn.Argmax(logits[(i+j+1)*c.Vocab : (i+j+2)*c.Vocab])
		}
		dw.Sample(s, hidden, tokens[i+1], labels)
	}
	dopt := nn.NewAdamW(be, d.Params.Len(), 1e-3)
	dmask := d.DecayMask()
	for range steps {
		dw.Forward()
		loss = dw.Loss(4)
		be.Zero(d.Grads)
		dw.Backward()
		dopt.Step(d.Params, d.Grads, dmask)
	}
	fmt.Printf("drafter: %d steps, final loss %v (bits %016x), weights sha256 %s\n", steps, loss, math.Float64bits(loss), hash(be, d.Params))
	return nil
}

func hash(be nn.Backend, buf nn.Buffer) string {
	x := make([]float32, buf.Len())
	be.ToHost(x, buf)
	h := sha256.New()
	var b [4]byte
	for _, v := range x {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:16]
}
