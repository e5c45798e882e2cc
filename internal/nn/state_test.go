package nn

import "testing"

// TestTrainStateRoundTrip: a state marshalled from one replica and
// unmarshalled into another gives it the same parameters, moments and
// counts; a state of another shape is refused.
func TestTrainStateRoundTrip(t *testing.T) {
	be := CPU()
	mk := func(seed float32) (TrainState, *int) {
		p := be.Alloc(5)
		be.FromHost(p, []float32{seed, 2, 3, 4, 5})
		opt := NewAdamW(be, 5, 0.01)
		step, batches := 0, 0
		return TrainState{Params: p, Opt: opt, Step: &step, Batches: &batches}, &step
	}
	a, aStep := mk(1)
	g := be.Alloc(5)
	be.FromHost(g, []float32{1, -1, 1, -1, 1})
	for range 3 {
		a.Opt.Step(a.Params, g, Buffer{})
		*aStep++
		*a.Batches += 2
	}
	b, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	c, cStep := mk(9)
	if err := c.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	host := func(buf Buffer) []float32 {
		out := make([]float32, buf.Len())
		be.ToHost(out, buf)
		return out
	}
	am, av, at := a.Opt.State()
	cm, cv, ct := c.Opt.State()
	if *cStep != 3 || ct != at || *c.Batches != 6 {
		t.Fatalf("step %d, count %d, batches %d; want 3, %d, 6", *cStep, ct, *c.Batches, at)
	}
	for k, pair := range [][2]Buffer{{a.Params, c.Params}, {am, cm}, {av, cv}} {
		x, y := host(pair[0]), host(pair[1])
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("buffer %d value %d: %v, want %v", k, i, y[i], x[i])
			}
		}
	}
	// Both step on alike from here.
	a.Opt.Step(a.Params, g, Buffer{})
	c.Opt.Step(c.Params, g, Buffer{})
	if x, y := host(a.Params), host(c.Params); x[0] != y[0] {
		t.Fatalf("after one more step: %v and %v", x, y)
	}
	small := TrainState{Params: be.Alloc(2), Opt: NewAdamW(be, 2, 0.01), Step: new(int)}
	if err := small.UnmarshalBinary(b); err == nil {
		t.Fatal("a state of 5 parameters taken by a replica of 2")
	}
}
