package lm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
)

// saveGroup stands for a group across workers (engine.RemoteGroup) of
// one replica: Saved copies the checkpoint as it is then, and Keep says
// restore, as a cluster's group lost whole does.
type saveGroup struct {
	out, copyTo string
	restore     *nodes.Restore
	saves       bool
	saved       []int
}

func (g *saveGroup) Barrier(context.Context, int) error { return nil }
func (g *saveGroup) AllReduce(context.Context, int, nodes.Reducible) (int, error) {
	return 1, nil
}
func (g *saveGroup) Leave(context.Context, int) (bool, error) { return true, nil }
func (g *saveGroup) Saves(context.Context, int) error         { g.saves = true; return nil }
func (g *saveGroup) Keep(context.Context, int, nodes.State) error {
	if g.restore != nil {
		return g.restore
	}
	return nil
}
func (g *saveGroup) Saved(_ context.Context, _ int, step int) error {
	g.saved = append(g.saved, step)
	if g.copyTo != "" && step == 4 {
		b, err := os.ReadFile(g.out)
		if err != nil {
			return err
		}
		return os.WriteFile(g.copyTo, b, 0o644)
	}
	return nil
}

// TestRestoresSave: lm_train with checkpoint_every says its group saves,
// and marks each checkpoint saved; its checkpoints hold AdamW's state and
// the batches trained. Told to restore (a group lost whole), a replica
// takes the save's weights, optimizer state, step and batch count, and
// trains on from there; a save of another step, or a model without
// optimizer state, is refused with the step it holds.
func TestRestoresSave(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("a group lost whole restores its last save. ", 3000)), 0o644)
	reg := nodes.NewRegistry()
	text.Register(reg)
	Register(reg)
	run := func(out string, limit int, g *saveGroup) (map[string]float64, error) {
		src := `
stage "reader" {
  node = "text_reader"
  config {
    path       = "` + corpus + `"
    seq_len    = 16
    batch_size = 2
    limit      = ` + strconv.Itoa(limit) + `
  }
}
stage "train" {
  node = "lm_train"
  config {
    path             = "` + corpus + `"
    out              = "` + out + `"
    d_model          = 16
    layers           = 1
    heads            = 2
    hidden           = 24
    max_seq          = 16
    checkpoint_every = 4
    overwrite        = true
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`
		gr, diags := (&graph.Loader{Catalog: reg}).Load("t.hcl", []byte(src))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		rep, err := engine.Run(context.Background(), gr, engine.Options{Registry: reg,
			Group: func(*graph.Stage) engine.RemoteGroup { return g }})
		if err != nil {
			return nil, err
		}
		if rep.Error != "" {
			return nil, errors.New(rep.Error)
		}
		return rep.Stages["train"].Metrics, nil
	}
	out, save4 := filepath.Join(dir, "m.safetensors"), filepath.Join(dir, "save4.safetensors")
	g := &saveGroup{out: out, copyTo: save4}
	if _, err := run(out, 10, g); err != nil {
		t.Fatal(err)
	}
	if !g.saves || len(g.saved) != 2 || g.saved[0] != 4 || g.saved[1] != 8 {
		t.Fatalf("saves %v, saved %v; want true and steps 4 and 8", g.saves, g.saved)
	}
	meta, err := nn.ReadSafetensorsMetadata(save4)
	if err != nil || meta["steps"] != "4" || meta["batches"] != "4" || meta["opt.t"] != "4" {
		t.Fatalf("the save of step 4: %v %v", meta, err)
	}
	if _, _, err := nn.LoadModel(save4); err != nil {
		t.Fatalf("a checkpoint with optimizer state does not load as a model: %v", err)
	}

	// Restored from the save of step 4, three batches more.
	restored := filepath.Join(dir, "restored.safetensors")
	b, _ := os.ReadFile(save4)
	os.WriteFile(restored, b, 0o644)
	m, err := run(restored, 3, &saveGroup{out: restored, restore: &nodes.Restore{Step: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if m["step"] != 7 || m["batches"] != 7 {
		t.Errorf("restored at step 4, three batches on: step %v, batches %v; want 7 and 7", m["step"], m["batches"])
	}
	// The save is not of the step the group recorded, or holds no
	// optimizer state (the final model).
	os.WriteFile(restored, b, 0o644)
	if _, err := run(restored, 3, &saveGroup{out: restored, restore: &nodes.Restore{Step: 8}}); err == nil || !strings.Contains(err.Error(), "holds step 4") {
		t.Errorf("a save of step 4 restored as step 8: %v", err)
	}
	if _, err := run(out, 3, &saveGroup{out: out, restore: &nodes.Restore{Step: 10}}); err == nil || !strings.Contains(err.Error(), `optimizer state ""`) {
		t.Errorf("the final model, without optimizer state, restored: %v", err)
	}
}
