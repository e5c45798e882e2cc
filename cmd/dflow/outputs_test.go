package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/nn"
)

const tinyPretrain = `
variable "overwrite" {
  default = false
}
stage "reader" {
  node = "text_reader"
  config {
    path       = %[1]q
    seq_len    = 16
    batch_size = 2
    limit      = 3
  }
}
stage "train" {
  node = "lm_train"
  config {
    path      = %[1]q
    out       = %[2]q
    overwrite = var.overwrite
    d_model   = 16
    layers    = 1
    heads     = 2
    hidden    = 24
    max_seq   = 16
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}`

// TestRunSaysWhereModelsGo: dflow run prints where each stage writes its
// model before the run and whether it wrote it after; a model another run
// wrote stops the run before any work, naming the stage, the file and
// the ways out, and --var overwrite=true replaces it.
func TestRunSaysWhereModelsGo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("where does the model go? ", 2000)), 0o644)
	out := filepath.Join(dir, "m.safetensors")
	spec := filepath.Join(dir, "p.hcl")
	os.WriteFile(spec, []byte(fmt.Sprintf(tinyPretrain, corpus, out)), 0o644)

	code, stdout, stderr := dflow(t, "run", spec, "--interval", "0")
	start, end := "dflow: stage train writes "+out+"\n", "dflow: stage train wrote "+out+"\n"
	if code != exitOK || !strings.Contains(stderr, start) || !strings.Contains(stderr, end) ||
		strings.Index(stderr, start) > strings.Index(stderr, end) || !strings.HasPrefix(stdout, "run ok in ") {
		t.Fatalf("code %d, want %q on stderr as the run starts, %q as it ends, and the summary on stdout:\n%s%s", code, start, end, stdout, stderr)
	}

	// The same file as another run left it.
	m, _, err := nn.LoadModel(out)
	if err != nil {
		t.Fatal(err)
	}
	m.Save(out, map[string]string{"run_id": "another-run", "run_started": "2026-01-02T03:04:05Z", "steps": "3000"})
	before, _ := os.ReadFile(out)
	code, _, stderr = dflow(t, "run", spec, "--interval", "0")
	for _, want := range []string{`stage "train" (lm_train): ` + out + " already exists: a target LM from another run (3000 steps, run started 2026-01-02T03:04:05Z)",
		"overwrite = true", `out = "FILE"`, "dflow: stage train wrote nothing to " + out} {
		if code != exitFailed || !strings.Contains(stderr, want) {
			t.Errorf("another run's model: code %d, want %q in\n%s", code, want, stderr)
		}
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Error("the other run's model was changed")
	}
	if code, _, stderr = dflow(t, "run", spec, "--interval", "0", "--var", "overwrite=true"); code != exitOK || !strings.Contains(stderr, end) {
		t.Errorf("--var overwrite=true: code %d\n%s", code, stderr)
	}
}
