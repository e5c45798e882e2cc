package dflash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/report"
)

func tinyTarget(t *testing.T, dir string) (string, *nn.Model) {
	m, _ := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 7)
	path := filepath.Join(dir, "target.safetensors")
	if err := m.Save(path, nil); err != nil {
		t.Fatal(err)
	}
	return path, m
}

func registry() *nodes.Registry {
	r := nodes.NewRegistry()
	text.Register(r)
	Register(r)
	return r
}

const pipelineSpec = `
stage "reader" {
  node = "text_reader"
  config {
    path       = "CORPUS"
    seq_len    = 32
    batch_size = 4
    limit      = 24
  }
}
stage "target" {
  node     = "target_forward"
  replicas = 3
  config {
    model = "TARGET"
  }
}
stage "drafter" {
  node     = "drafter_train"
  replicas = 2
  config {
    target        = "TARGET"
    target_layers = LAYERS
    block_size    = 3
    hidden        = 32
    heads         = 2
    anchors       = 4
    checkpoint    = "CKPT"
    eval          = "CORPUS"
    eval_prompts  = 2
  }
}
edge "tokens" {
  from = reader.out
  to   = target.in
}
edge "hs" {
  from   = target.hidden
  to     = drafter.hidden
  policy = "round_robin"
}`

func spec(corpus, target, ckpt, layers string) string {
	r := strings.NewReplacer("CORPUS", corpus, "TARGET", target, "CKPT", ckpt, "LAYERS", layers)
	return r.Replace(pipelineSpec)
}

// fixture writes a tiny target and a corpus into a temporary folder and
// names a checkpoint file there.
func fixture(t *testing.T) (target, corpus, ckpt string) {
	dir := t.TempDir()
	target, _ = tinyTarget(t, dir)
	corpus = filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("package main\n\nfunc f(x int) int { return x + 1 }\n", 800)), 0o644)
	return target, corpus, filepath.Join(dir, "d.safetensors")
}

// TestPipeline runs reader -> target_forward (3) -> drafter_train (2,
// data-parallel, round_robin P > C with uneven ends): counts exact,
// metrics published, checkpoint written and resumable.
func TestPipeline(t *testing.T) {
	target, corpus, ckpt := fixture(t)
	reg := registry()
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(spec(corpus, target, ckpt, "2")))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if got := g.Edge("hs").From.Type; got != HiddenType(16, []int{0, 1}) {
		t.Errorf("hs carries %s", got)
	}
	rep, err := engine.Run(context.Background(), g, engine.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Edges["hs"].Consumed != 24 || rep.Edges["tokens"].Consumed != 24 {
		t.Errorf("counts %d %d", rep.Edges["hs"].Consumed, rep.Edges["tokens"].Consumed)
	}
	m := rep.Stages["drafter"].Metrics
	for _, k := range []string{"loss", "acceptance_length", "acceptance_length_initial", "acceptance_length_ngram", "step"} {
		if _, ok := m[k]; !ok {
			t.Errorf("metric %s missing: %v", k, m)
		}
	}
	if _, meta, err := nn.LoadDrafter(ckpt, nn.Buffer{}, nil); err == nil || meta != nil {
		// LoadDrafter needs the target embedding; with none it must refuse.
		t.Errorf("load without embedding: %v", err)
	}
	wte, _ := loadShared(target)
	d, meta, err := nn.LoadDrafter(ckpt, wte.P("wte"), nil)
	steps := rep.Stages["drafter"].Metrics["step"]
	if err != nil || d.Config.BlockSize != 3 || meta["step"] != fmt.Sprint(steps) {
		t.Fatalf("checkpoint: %v %v, last step %v", err, meta, steps)
	}
	// Resume: the step count continues from the checkpoint.
	resumed := strings.Replace(spec(corpus, target, ckpt, "2"), `eval_prompts  = 2`, "eval_prompts  = 2\n    resume = true", 1)
	g, diags = (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(resumed))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	rep, err = engine.Run(context.Background(), g, engine.Options{Registry: reg})
	_, meta2, _ := nn.LoadDrafter(ckpt, wte.P("wte"), nil)
	before, _ := strconv.Atoi(meta["step"])
	after, _ := strconv.Atoi(meta2["step"])
	if err != nil || after <= before || rep.Stages["drafter"].Metrics["step"] <= steps {
		t.Errorf("resume: %v, steps %v then %v", err, steps, rep.Stages["drafter"].Metrics["step"])
	}
	if _, ok := rep.Stages["drafter"].Metrics["acceptance_length_initial"]; !ok {
		t.Errorf("resume: acceptance before training not measured: %v", rep.Stages["drafter"].Metrics)
	}
}

// TestTypeMismatch: tokens into a hidden_states port, and a drafter whose
// hidden size differs from the target's, fail validation with both types.
func TestTypeMismatch(t *testing.T) {
	dir := t.TempDir()
	target, _ := tinyTarget(t, dir)
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("x", 10000)), 0o644)
	reg := registry()
	src := strings.Replace(spec(corpus, target, "", "1"), `checkpoint    = ""`, "", 1)
	_, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(src))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), `emits "hidden_states(d=16,layers=0,1)" items but drafter.hidden takes "hidden_states(d=16,layers=1)"`) {
		t.Errorf("width mismatch: %v", diags)
	}
	src = strings.Replace(src, "from   = target.hidden", "from   = reader.out", 1)
	l := &graph.Loader{Catalog: reg}
	_, diags = l.Load("p.hcl", []byte(src))
	var b strings.Builder
	graph.WriteDiagnostics(&b, diags, l.Sources())
	if !diags.HasErrors() || !strings.Contains(b.String(), `reader.out emits "tokens" items but drafter.hidden takes "hidden_states(d=16,layers=1)"`) {
		t.Errorf("tokens into hidden_states:\n%s", b.String())
	}
}

func TestDefaultLayers(t *testing.T) {
	for _, tc := range []struct {
		n, k int
		want string
	}{{4, 3, "[0 2 3]"}, {4, 2, "[0 3]"}, {2, 3, "[0 1]"}, {36, 5, "[0 9 18 26 35]"}, {4, 1, "[3]"}} {
		if got := fmt.Sprint(DefaultLayers(tc.n, tc.k)); got != tc.want {
			t.Errorf("DefaultLayers(%d, %d) = %s, want %s", tc.n, tc.k, got, tc.want)
		}
	}
}

// rewriteMeta changes a safetensors file's metadata in place.
func rewriteMeta(t *testing.T, path string, change map[string]string) {
	t.Helper()
	ts, meta, err := nn.ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range change {
		meta[k] = v
	}
	if err := nn.WriteSafetensors(path, ts, meta); err != nil {
		t.Fatal(err)
	}
}

// TestKeepsAnotherRunsCheckpoint: a checkpoint another run wrote stops the
// run when the drafter stage is built, before any batch, naming the file
// and the ways out; overwrite = true replaces it and resume = true trains
// it further, but not against another target. Checkpoints record the
// run and the target's hash.
func TestKeepsAnotherRunsCheckpoint(t *testing.T) {
	target, corpus, ckpt := fixture(t)
	reg := registry()
	run := func(src, extra string) (*report.Report, error) {
		src = strings.Replace(src, `eval_prompts  = 2`, "eval_prompts  = 2\n    "+extra, 1)
		g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(src))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if outs := reg.Outputs(g); len(outs) != 1 || outs[0].Stage != "drafter" || outs[0].Path != ckpt {
			t.Errorf("outputs %v", outs)
		}
		return engine.Run(context.Background(), g, engine.Options{Registry: reg})
	}
	src := spec(corpus, target, ckpt, "2")
	if _, err := run(src, ""); err != nil {
		t.Fatal(err)
	}
	hash, _ := nn.FileSHA256(target)
	meta, _ := nn.ReadSafetensorsMetadata(ckpt)
	if meta["run_id"] != nn.RunID() || meta["target"] != target || meta["target_sha256"] != hash || meta["spec"] != "p.hcl" {
		t.Errorf("checkpoint metadata %v", meta)
	}

	rewriteMeta(t, ckpt, map[string]string{"run_id": "another-run", "run_started": "2026-01-02T03:04:05Z", "step": "800"})
	before, _ := os.ReadFile(ckpt)
	rep, err := run(src, "")
	for _, want := range []string{`stage "drafter"`, ckpt + " already exists: a drafter checkpoint from another run (step 800, run started 2026-01-02T03:04:05Z, spec p.hcl)",
		"resume = true", "overwrite = true", "--set stage.drafter.config.resume=true", `checkpoint = "FILE"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if rep.Edges["tokens"].Produced != 0 {
		t.Errorf("refused after %d batches, want before any", rep.Edges["tokens"].Produced)
	}
	if after, _ := os.ReadFile(ckpt); string(after) != string(before) {
		t.Error("the other run's checkpoint was changed")
	}

	// resume = true trains the other run's drafter further.
	if rep, err = run(src, "resume = true"); err != nil {
		t.Fatal(err)
	}
	if rep.Stages["drafter"].Metrics["step"] <= 800 {
		t.Errorf("resumed at step %v, want past 800", rep.Stages["drafter"].Metrics["step"])
	}

	// Not against another target.
	other := filepath.Join(filepath.Dir(ckpt), "other.safetensors")
	m2, _ := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 8)
	m2.Save(other, nil)
	rewriteMeta(t, ckpt, map[string]string{"run_id": "another-run"})
	src2 := strings.Replace(spec(corpus, other, ckpt, "2"), `model = "`+other+`"`, `model = "`+target+`"`, 1)
	if _, err := run(src2, "resume = true"); err == nil || !strings.Contains(err.Error(), "was trained against another target ("+target+", sha256 "+hash[:12]+")") {
		t.Errorf("resume against another target: %v", err)
	}

	// Not both.
	_, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(strings.Replace(src, `eval_prompts  = 2`, "eval_prompts  = 2\n    resume = true\n    overwrite = true", 1)))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "and resume contradict each other") {
		t.Errorf("resume and overwrite: %v", diags)
	}

	// overwrite = true starts afresh and replaces it.
	if rep, err = run(src, "overwrite = true"); err != nil {
		t.Fatal(err)
	}
	if meta, _ := nn.ReadSafetensorsMetadata(ckpt); meta["run_id"] != nn.RunID() || meta["step"] != fmt.Sprint(rep.Stages["drafter"].Metrics["step"]) || rep.Stages["drafter"].Metrics["step"] > 100 {
		t.Errorf("overwritten checkpoint %v, steps %v", meta, rep.Stages["drafter"].Metrics["step"])
	}
}

// TestCheckpointOnDeadlock: a run that deadlocks (the reader rotating over
// three targets, two of which feed one drafter) fails, and the drafter
// still writes its weights as of its last completed step. Before, a
// failed run left no checkpoint.
func TestCheckpointOnDeadlock(t *testing.T) {
	target, corpus, ckpt := fixture(t)
	src := strings.NewReplacer("limit      = 24", "limit      = 2000", "eval          = \"CORPUS\"\n", "",
		"to   = target.in\n", "to   = target.in\n  policy   = \"round_robin\"\n  capacity = 2\n",
		"policy = \"round_robin\"\n", "policy = \"round_robin\"\n  capacity = 2\n").Replace(pipelineSpec)
	src = strings.NewReplacer("CORPUS", corpus, "TARGET", target, "CKPT", ckpt, "LAYERS", "2").Replace(src)
	reg := registry()
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := engine.Run(ctx, g, engine.Options{Registry: reg})
	var d *engine.Deadlock
	if !errors.As(err, &d) {
		t.Fatalf("err = %v, want a deadlock", err)
	}
	steps := rep.Stages["drafter"].Metrics["step"]
	wte, _ := loadShared(target)
	_, meta, lerr := nn.LoadDrafter(ckpt, wte.P("wte"), nil)
	if lerr != nil || steps < 1 || meta["step"] != fmt.Sprint(steps) {
		t.Fatalf("checkpoint: %v, meta %v, the run's last step %v", lerr, meta, steps)
	}
}

// restoredGroup is a group whose Keep restores, as a cluster's group lost
// whole before its first save does.
type restoredGroup struct{ nodes.Group }

func (restoredGroup) Keep(context.Context, nodes.State) error { return &nodes.Restore{Step: -1} }

type restoredReplica struct{ nodes.Replica }

func (r restoredReplica) Group() nodes.Group { return restoredGroup{r.Replica.Group()} }

// TestRestartMeasuresNothingTwice: a lead restarted with its group's
// state (here restored) does not measure acceptance before training
// again (its first incarnation did, and the coordinator's report keeps
// what it published); a lead that starts the run, or resumes a
// checkpoint, does.
func TestRestartMeasuresNothingTwice(t *testing.T) {
	target, corpus, ckpt := fixture(t)
	for _, restarted := range []bool{false, true} {
		reg := registry()
		if restarted {
			s, _ := reg.Spec("drafter_train")
			build := s.New
			s.New = func(cfg *graph.Config) (nodes.Node, error) {
				n, err := build(cfg)
				if err != nil {
					return nil, err
				}
				return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
					return n.Run(ctx, restoredReplica{r})
				}), nil
			}
		}
		src := strings.Replace(spec(corpus, target, ckpt, "2"), `eval_prompts  = 2`, "eval_prompts  = 2\n    overwrite = true", 1)
		g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(src))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		rep, err := engine.Run(context.Background(), g, engine.Options{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		m := rep.Stages["drafter"].Metrics
		for _, k := range []string{"acceptance_length_initial", "acceptance_length_ngram"} {
			if _, ok := m[k]; ok == restarted {
				t.Errorf("restarted %v: metric %s measured %v, want %v: %v", restarted, k, ok, !restarted, m)
			}
		}
		if _, ok := m["acceptance_length"]; !ok {
			t.Errorf("restarted %v: no final acceptance_length: %v", restarted, m)
		}
	}
}
