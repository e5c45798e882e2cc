package torch

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/speceval"
	"github.com/dflow-dev/dflow/report"
)

// drafterParityScript computes, with drafter.py's BlockDrafter, the loss
// and the gradient of a drafter checkpoint on the samples of a JSON file,
// then takes one AdamW step (learning rate 1e-3, weight decay 0.01) with
// the Go drafter's gradient, which the file holds too.
const drafterParityScript = `
import json, sys
import drafter as dr
dr.use_torch()
torch = dr.torch
ck, samples = sys.argv[1], json.load(open(sys.argv[2]))
params, _ = dr.tgt.load("models/target.safetensors")
dc = dr.tgt.read_header(ck)[1]
d = dr.BlockDrafter(dc, params["wte"], 0, torch.device("cpu"))
d.load(ck)
S, KD = len(samples["anchors"]), dc["target_layers"] * dc["d_model"]
ctx = torch.tensor(samples["hidden"]).view(S, KD)
loss = d.loss(ctx, torch.tensor(samples["anchors"]), torch.tensor(samples["labels"]).view(S, -1), 4.0)
loss.backward()
grad = d.flat.grad.tolist()
opt = dr.AdamW(d.flat, d.decay, 0.01)
norm = opt.step(d.flat.data, torch.tensor(samples["grad"]), 1e-3)  # Go's gradient: the optimizer alone
json.dump({"loss": float(loss), "grad": grad, "norm": norm, "params": d.flat.detach().tolist()}, sys.stdout)
`

// TestDrafterParity: drafter.py's block drafter is internal/nn's. A Go
// drafter saved as a checkpoint, loaded by the PyTorch one, gives the
// same loss (within 1e-5 relative) and the same gradient of every
// parameter (within 1e-4 of the largest) on the same samples, and the
// same parameters after one AdamW step from the same gradient (within
// 1e-6): the forward pass,
// the loss's weights, the tensors' layout, the decay mask, clipping and
// the update agree.
func TestDrafterParity(t *testing.T) {
	py, err := checkPython()
	if err != nil {
		t.Skipf("%s lacks torch, grpcio, protobuf or numpy (Debian: python3-torch python3-grpcio python3-protobuf python3-numpy): %v", py, err)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := nn.LoadModel(filepath.Join(root, "models/target.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	c := nn.DrafterConfig{D: m.Config.DModel, K: 3, Taps: []int{0, 2, 3}, Layers: 2, Heads: 4, Hidden: 64, BlockSize: 4}
	d, err := nn.NewDrafter(c, m.P("wte"), 7)
	if err != nil {
		t.Fatal(err)
	}
	// Parameters off their initial values, so that norms and the mask
	// are not all ones and zeros.
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]float32, d.Params.Len())
	d.Backend().ToHost(p, d.Params)
	for i := range p {
		p[i] += float32(rng.NormFloat64() * 0.05)
	}
	d.Backend().FromHost(d.Params, p)
	ck := filepath.Join(t.TempDir(), "d.safetensors")
	if err := d.Save(ck, nil, nil); err != nil {
		t.Fatal(err)
	}
	const S = 6
	var samples struct {
		Hidden  []float32 `json:"hidden"`
		Anchors []int32   `json:"anchors"`
		Labels  []int32   `json:"labels"`
		Grad    []float32 `json:"grad"` // Go's, for the optimizer's step
	}
	w := d.NewWork(S)
	KD := c.K * c.D
	for s := range S {
		h := make([]float32, KD)
		for i := range h {
			h[i] = float32(rng.NormFloat64())
		}
		labels := make([]int32, c.BlockSize-1)
		for i := range labels {
			labels[i] = int32(rng.IntN(256))
		}
		anchor := int32(rng.IntN(256))
		w.Sample(s, h, anchor, labels)
		samples.Hidden = append(samples.Hidden, h...)
		samples.Anchors = append(samples.Anchors, anchor)
		samples.Labels = append(samples.Labels, labels...)
	}
	w.Forward()
	loss := w.Loss(4)
	d.Backend().Zero(d.Grads)
	w.Backward()
	grad := make([]float32, d.Grads.Len())
	d.Backend().ToHost(grad, d.Grads)
	samples.Grad = grad
	opt := nn.NewAdamW(d.Backend(), d.Params.Len(), 1e-3)
	opt.WeightDecay = 0.01 // as drafter_train sets it
	norm := opt.Step(d.Params, d.Grads, d.DecayMask())
	after := make([]float32, d.Params.Len())
	d.Backend().ToHost(after, d.Params)

	sf := filepath.Join(t.TempDir(), "samples.json")
	b, _ := json.Marshal(samples)
	if err := os.WriteFile(sf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", drafterParityScript, ck, sf)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "plugins/python")+":"+filepath.Join(root, "plugins/examples/torch"))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%v\n%s", err, stderr)
	}
	var got struct {
		Loss   float64
		Grad   []float64
		Norm   float64
		Params []float64
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if math.Abs(got.Loss-loss) > 1e-5*math.Abs(loss) {
		t.Errorf("loss: PyTorch %.7f, Go %.7f", got.Loss, loss)
	}
	if len(got.Grad) != len(grad) {
		t.Fatalf("PyTorch's gradient has %d values, Go's %d", len(got.Grad), len(grad))
	}
	var worst, largest float64
	at := 0
	for i, g := range grad {
		largest = math.Max(largest, math.Abs(float64(g)))
		if e := math.Abs(got.Grad[i] - float64(g)); e > worst {
			worst, at = e, i
		}
	}
	t.Logf("loss %.6f (Go) %.6f (PyTorch); gradient: largest %.3g, worst difference %.3g at %d", loss, got.Loss, largest, worst, at)
	if worst > 1e-4*largest {
		t.Errorf("gradients differ by %.3g at value %d (Go %g, PyTorch %g), more than 1e-4 of the largest %.3g", worst, at, grad[at], got.Grad[at], largest)
	}
	// One AdamW step from Go's gradient, clipped to norm 1 (its norm is
	// more): the same parameters after it, within 1e-6. (From each one's
	// own gradient they may differ by more: a first Adam step moves a
	// parameter by about lr whatever its gradient's size, so gradients of
	// 1e-8 that differ by 2e-7 move it differently.)
	if norm <= 1 || math.Abs(got.Norm-float64(norm)) > 1e-4*float64(norm) {
		t.Errorf("gradient norm: Go %v, PyTorch %v (want them equal, and over the clip of 1 so that clipping is checked)", norm, got.Norm)
	}
	if len(got.Params) != len(after) {
		t.Fatalf("PyTorch has %d parameters after the step, Go %d", len(got.Params), len(after))
	}
	worst, at = 0, 0
	for i, p := range after {
		if e := math.Abs(got.Params[i] - float64(p)); e > worst {
			worst, at = e, i
		}
	}
	t.Logf("after one AdamW step (gradient norm %.3f): worst parameter difference %.3g at %d", norm, worst, at)
	if worst > 1e-6 {
		t.Errorf("parameters after one AdamW step differ by %.3g at %d (Go %g, PyTorch %g)", worst, at, after[at], got.Params[at])
	}
}

// ddpSpec is the PyTorch job with DDP drafters, from the repository's
// root.
const ddpSpec = "specs/dflash-torch.hcl"

// TestDFlashTorchDDP: specs/dflash-torch.hcl (PyTorch targets, three DDP
// drafter ranks) loads without a warning and runs ok on 12 small batches; every batch is read,
// forwarded and trained on once, and the checkpoint says so (batches 12);
// the ranks' parameters are identical at the end; the checkpoint is a Go
// drafter checkpoint of the stage's config, which dflow eval's code
// (speceval.Evaluate) measures.
func TestDFlashTorchDDP(t *testing.T) {
	reg, errs, corpus := setup(t)
	ck := filepath.Join(t.TempDir(), "ddp.safetensors")
	g, diags := (&graph.Loader{Catalog: reg, Vars: map[string]string{
		"corpus": corpus, "batches": "12", "targets": "2", "checkpoint": ck},
		Sets: []string{"stage.reader.config.seq_len=32", "stage.reader.config.batch_size=4", "stage.drafter.config.checkpoint_every=2"}}).LoadFile(ddpSpec)
	if len(diags) > 0 { // errors, and warnings, which a shipped spec should not have either
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := engine.Run(ctx, g, engine.Options{Registry: reg})
	if err != nil {
		t.Fatalf("%v\n%s", err, errs)
	}
	if rep.Edges["tokens"].Consumed != 12 || rep.Edges["hs"].Produced != 12 || rep.Edges["hs"].Consumed != 12 {
		t.Errorf("tokens %d consumed, hidden states %d produced and %d consumed; want 12 each",
			rep.Edges["tokens"].Consumed, rep.Edges["hs"].Produced, rep.Edges["hs"].Consumed)
	}
	m := rep.Stages["drafter"].Metrics
	if d, ok := m["rank_divergence"]; !ok || d != 0 {
		t.Errorf("rank_divergence %v (reported: %v): the ranks' parameters differ at the end; metrics %v", d, ok, m)
	}
	if share, ok := rep.Stages["drafter"].DataWaitShare(); !ok {
		t.Errorf("the ranks' steps are not measured (%s, %s): metrics %v", report.DataWait, report.Compute, m)
	} else {
		t.Logf("the ranks waited %.0f%% of each step for data", 100*share)
	}
	meta, err := nn.ReadSafetensorsMetadata(ck)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nn.CheckDrafterMeta(ck, meta)
	if err != nil {
		t.Fatal(err)
	}
	want := nn.DrafterConfig{D: 128, K: 3, Taps: []int{0, 2, 3}, Layers: 1, Heads: 4, Hidden: 256, BlockSize: 4}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("checkpoint's config %+v, want %+v", c, want)
	}
	steps, _ := strconv.Atoi(meta["step"])
	if meta["batches"] != "12" || steps < 4 || steps > 12 || m["batches"] != 12 {
		t.Errorf("checkpoint: batches %s, step %s; metric batches %v; want 12 batches in 4 to 12 steps", meta["batches"], meta["step"], m["batches"])
	}
	if meta["target_sha256"] == "" || !filepath.IsAbs(meta["target"]) || meta["run_id"] == "" || meta["opt.t"] != meta["step"] {
		t.Errorf("checkpoint's metadata lacks what the Go drafter records: %v", meta)
	}
	res, err := speceval.Evaluate(speceval.EvalOptions{Drafter: ck, Corpus: corpus, Holdout: 0.5, Seed: 1,
		MaxBytes: 1 << 20, Prompts: 2, Cycles: 4})
	if err != nil {
		t.Fatalf("dflow eval's code on the PyTorch drafter: %v", err)
	}
	t.Logf("%d batches in %s steps; acceptance length %.3f (n-gram %.3f)", 12, meta["step"], res.Drafter, res.NGram)
	if res.Drafter < 1 || res.Drafter > 4 {
		t.Errorf("acceptance length %v, outside [1, 4]", res.Drafter)
	}
}
