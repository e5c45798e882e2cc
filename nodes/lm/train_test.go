package lm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
)

// TestTrainEndToEnd trains a tiny model through dflow (text_reader ->
// lm_train, two data-parallel replicas): the loss falls, the model is
// saved and loads, and held-out bits per byte are reported next to the
// n-gram baseline's.
func TestTrainEndToEnd(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.txt")
	var b strings.Builder
	for i := 0; i < 4000; i++ {
		b.WriteString("the quick brown fox jumps over the lazy dog. ")
	}
	os.WriteFile(corpus, []byte(b.String()), 0o644)
	out := filepath.Join(dir, "m.safetensors")
	reg := nodes.NewRegistry()
	text.Register(reg)
	Register(reg)
	src := `
stage "reader" {
  node = "text_reader"
  config {
    path       = "` + corpus + `"
    seq_len    = 32
    batch_size = 4
    limit      = 60
    epochs     = 10
  }
}
stage "train" {
  node     = "lm_train"
  replicas = 2
  config {
    path         = "` + corpus + `"
    out          = "` + out + `"
    d_model      = 32
    layers       = 1
    heads        = 2
    hidden       = 48
    max_seq      = 32
    lr           = 0.01
    warmup       = 5
    steps        = 30
    eval_batches = 4
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`
	g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	rep, err := engine.Run(context.Background(), g, engine.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Stages["train"].Metrics
	if m["loss"] >= m["loss_initial"]-1 || m["loss_initial"] < 5 {
		t.Errorf("loss %.3f from %.3f: want a clear fall from about ln 256", m["loss"], m["loss_initial"])
	}
	if m["eval_bpb"] <= 0 || m["ngram_bpb"] <= 0 || m["eval_bpb"] > 8 {
		t.Errorf("metrics %v", m)
	}
	model, meta, err := nn.LoadModel(out)
	if err != nil || model.Config.DModel != 32 || meta["steps"] == "" {
		t.Fatalf("saved model: %v %+v %v", err, model, meta)
	}
	// Both replicas consumed batches: the training was data-parallel.
	for _, r := range rep.Stages["train"].Replicas {
		if r.ItemsIn == 0 {
			t.Errorf("replica %d trained on nothing", r.Index)
		}
	}
}

func TestLRSchedule(t *testing.T) {
	tr := &trainer{cfg: configOf(map[string]float64{"lr": 1, "warmup": 10, "steps": 110})}
	if tr.lr(0) != 0.1 || tr.lr(9) != 1 || tr.lr(10) != 1 || tr.lr(110) < 0.099 || tr.lr(110) > 0.101 {
		t.Errorf("lr: %v %v %v %v", tr.lr(0), tr.lr(9), tr.lr(10), tr.lr(110))
	}
}

// TestTrainDeterministic: the same spec and seeds give byte-identical
// weights.
func TestTrainDeterministic(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("determinism is a feature; ", 3000)), 0o644)
	reg := nodes.NewRegistry()
	text.Register(reg)
	Register(reg)
	var files [2][]byte
	for i := range files {
		out := filepath.Join(dir, "m"+string(rune('0'+i))+".safetensors")
		src := `
stage "reader" {
  node = "text_reader"
  config {
    path       = "` + corpus + `"
    seq_len    = 16
    batch_size = 2
    limit      = 10
  }
}
stage "train" {
  node = "lm_train"
  config {
    path    = "` + corpus + `"
    out     = "` + out + `"
    d_model = 16
    layers  = 1
    heads   = 2
    hidden  = 24
    max_seq = 16
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`
		g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if _, err := engine.Run(context.Background(), g, engine.Options{Registry: reg}); err != nil {
			t.Fatal(err)
		}
		files[i], _ = os.ReadFile(out)
	}
	if len(files[0]) == 0 || string(files[0]) != string(files[1]) {
		t.Error("two identical trainings wrote different weights")
	}
}

// TestKeepsAnotherRunsModel: a model another run wrote stops the run when
// its stage is built, before any batch is read, naming the file and the
// ways out; overwrite = true replaces it; the stage declares its output.
func TestKeepsAnotherRunsModel(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("a model is not overwritten unasked; ", 3000)), 0o644)
	out := filepath.Join(dir, "m.safetensors")
	m, _ := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 1, Heads: 2, Hidden: 24, MaxSeq: 16}, 3)
	if err := m.Save(out, map[string]string{"run_id": "another-run", "run_started": "2026-01-02T03:04:05Z", "steps": "3000"}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(out)
	reg := nodes.NewRegistry()
	text.Register(reg)
	Register(reg)
	run := func(extra string) (*engine.Options, error) {
		src := `
stage "reader" {
  node = "text_reader"
  config {
    path       = "` + corpus + `"
    seq_len    = 16
    batch_size = 2
    limit      = 4
  }
}
stage "train" {
  node = "lm_train"
  config {
    path    = "` + corpus + `"
    out     = "` + out + `"
    d_model = 16
    layers  = 1
    heads   = 2
    hidden  = 24
    max_seq = 16
    ` + extra + `
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`
		g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if outs := reg.Outputs(g); len(outs) != 1 || outs[0].Stage != "train" || outs[0].Path != out {
			t.Errorf("outputs %v", outs)
		}
		rep, err := engine.Run(context.Background(), g, engine.Options{Registry: reg})
		if err != nil && rep.Edges["tokens"].Produced != 0 {
			t.Errorf("refused after %d batches, want before any", rep.Edges["tokens"].Produced)
		}
		return nil, err
	}
	_, err := run("")
	for _, want := range []string{`stage "train"`, out + " already exists: a target LM from another run (3000 steps, run started 2026-01-02T03:04:05Z)",
		"overwrite = true", `out = "FILE"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Error("the other run's model was changed")
	}
	if _, err := run("overwrite = true"); err != nil {
		t.Fatal(err)
	}
	if _, meta, err := nn.LoadModel(out); err != nil || meta["run_id"] != nn.RunID() || meta["steps"] != "4" || meta["spec"] != "t.hcl" {
		t.Errorf("overwritten model: %v %v", meta, err)
	}
}

// TestSavesOnAbort: an aborted run (its context cancelled mid-training)
// still writes the model as of its last completed step; a missing corpus
// is refused at validation, before any work. Before, an abort left no
// model and a missing corpus failed only once the run had started.
func TestSavesOnAbort(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4000)), 0o644)
	out := filepath.Join(dir, "m.safetensors")
	reg := nodes.NewRegistry()
	text.Register(reg)
	Register(reg)
	spec := func(path string) string {
		return `
stage "reader" {
  node = "text_reader"
  config {
    path       = "` + corpus + `"
    seq_len    = 16
    batch_size = 2
    epochs     = 1000
  }
}
stage "train" {
  node     = "lm_train"
  replicas = 2
  config {
    path    = "` + path + `"
    out     = "` + out + `"
    d_model = 16
    layers  = 1
    heads   = 2
    hidden  = 16
    max_seq = 16
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`
	}
	if _, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(spec(filepath.Join(dir, "missing.txt")))); !diags.HasErrors() ||
		!strings.Contains(diags.Error(), "path") {
		t.Errorf("a missing corpus: %v", diags)
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(spec(corpus)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := engine.New(g, engine.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		testutil.Within(60*time.Second, func() bool {
			s := p.Snapshot()
			return len(s.Stages) > 1 && s.Stages[1].Metrics["step"] >= 3
		})
		cancel()
	}()
	rep, err := p.Execute(ctx)
	<-done
	if rep.Status != "aborted" {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	_, meta, err := nn.LoadModel(out)
	if err != nil || meta["steps"] == "" || meta["steps"] == "0" {
		t.Fatalf("model after the abort: %v, meta %v", err, meta)
	}
	if want := fmt.Sprint(rep.Stages["train"].Metrics["step"]); meta["steps"] != want {
		t.Errorf("saved step %s, the run's last %s", meta["steps"], want)
	}
}
