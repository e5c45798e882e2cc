package nn

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeMeta(t *testing.T, path string, meta map[string]string) {
	t.Helper()
	if err := WriteSafetensors(path, []Tensor{{Name: "x", Shape: []int{1}, Data: []float32{1}}}, meta); err != nil {
		t.Fatal(err)
	}
}

// TestClaimOutput: a file another run wrote (or an older dflow, or not a
// model at all) is refused when a stage is built, unless it may replace
// it; this run's own file is not.
func TestClaimOutput(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.safetensors")
	const out = "set resume = true or overwrite = true"

	o, err := ClaimOutput(path, false, out)
	if err != nil {
		t.Fatalf("absent file: %v", err)
	}
	mine := RunMetadata("specs/x.hcl")
	mine["format"] = "dflow-drafter"
	writeMeta(t, path, mine)
	if err := o.Check(); err != nil {
		t.Errorf("own checkpoint: %v", err)
	}
	if _, err := ClaimOutput(path, false, out); err != nil {
		t.Errorf("this run's file: %v", err)
	}

	other := map[string]string{"format": "dflow-drafter", "step": "800", "run_id": "0123456789abcdef",
		"run_started": "2026-01-02T03:04:05Z", "spec": "specs/dflash.hcl"}
	writeMeta(t, path, other)
	if err := o.Check(); err == nil || !strings.Contains(err.Error(), "written by another run while this one ran") {
		t.Errorf("another run wrote it meanwhile: %v", err)
	}
	_, err = ClaimOutput(path, false, out)
	for _, want := range []string{path + " already exists", "a drafter checkpoint from another run", "step 800",
		"run started 2026-01-02T03:04:05Z", "spec specs/dflash.hcl", "refusing to overwrite it", out} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("another run's drafter: want %q in %v", want, err)
		}
	}
	o, err = ClaimOutput(path, true, out)
	if err != nil {
		t.Fatalf("replace: %v", err)
	}
	if err := o.Check(); err != nil {
		t.Errorf("the file it may replace: %v", err)
	}
	writeMeta(t, path, mine)
	if err := o.Check(); err != nil {
		t.Errorf("replaced by its own: %v", err)
	}

	writeMeta(t, path, map[string]string{"format": "dflow-lm", "steps": "3000"})
	if _, err := ClaimOutput(path, false, out); err == nil || !strings.Contains(err.Error(), "a target LM from another run (3000 steps, written by a dflow that did not record its runs)") {
		t.Errorf("older model: %v", err)
	}
	os.WriteFile(path, []byte("hello, world, not a model"), 0o644)
	if _, err := ClaimOutput(path, false, out); err == nil || !strings.Contains(err.Error(), "it is not a safetensors file") {
		t.Errorf("not a model: %v", err)
	}
}

func TestReadSafetensorsMetadata(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	writeMeta(t, path, map[string]string{"format": "dflow-lm"})
	if m, err := ReadSafetensorsMetadata(path); err != nil || m["format"] != "dflow-lm" {
		t.Errorf("%v %v", m, err)
	}
	writeMeta(t, path, nil)
	if m, err := ReadSafetensorsMetadata(path); err != nil || m == nil || len(m) != 0 {
		t.Errorf("no metadata: %v %v", m, err)
	}
	os.WriteFile(path, []byte("# a text file\nhello\n"), 0o644)
	if _, err := ReadSafetensorsMetadata(path); err == nil || !strings.Contains(err.Error(), "not a safetensors file") {
		t.Errorf("text file: %v", err)
	}
}
