package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/nn"
)

// evalFixture writes two tiny targets (same shape, other weights), a
// corpus and drafters trained (here: initialized) against the first.
type evalFixture struct {
	dir, a, b, corpus string
	hashA, hashB      string
}

func newEvalFixture(t *testing.T) *evalFixture {
	t.Helper()
	f := &evalFixture{dir: t.TempDir()}
	f.a, f.b = filepath.Join(f.dir, "a.safetensors"), filepath.Join(f.dir, "b.safetensors")
	for i, p := range []string{f.a, f.b} {
		m, err := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Save(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	f.hashA, _ = nn.FileSHA256(f.a)
	f.hashB, _ = nn.FileSHA256(f.b)
	f.corpus = filepath.Join(f.dir, "c.txt")
	os.WriteFile(f.corpus, []byte(strings.Repeat("func f(x int) int { return x + 1 }\n", 2000)), 0o644)
	return f
}

// drafter saves a drafter against target a with the given metadata.
func (f *evalFixture) drafter(t *testing.T, name string, meta map[string]string) string {
	t.Helper()
	m, _, err := nn.LoadModel(f.a)
	if err != nil {
		t.Fatal(err)
	}
	d, err := nn.NewDrafter(nn.DrafterConfig{D: 16, K: 2, Taps: []int{0, 1}, Layers: 1, Heads: 2, Hidden: 16, BlockSize: 4}, m.P("wte"), 1)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.dir, name)
	if err := d.Save(p, nil, meta); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *evalFixture) eval(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return dflow(t, append(args, "--corpus", f.corpus, "--holdout", "0.5", "--prompts", "2", "--cycles", "2")...)
}

// TestEvalUsesRecordedTarget: dflow eval decodes with the target the
// drafter's checkpoint records, checked by its hash; another --target is
// refused unless --force-target, the same content under another path is
// fine, and a recorded file that changed since is refused.
func TestEvalUsesRecordedTarget(t *testing.T) {
	t.Parallel()
	f := newEvalFixture(t)
	d := f.drafter(t, "d.safetensors", map[string]string{"target": f.a, "target_sha256": f.hashA})

	code, stdout, stderr := f.eval(t, "eval", d)
	if code != exitOK || !strings.Contains(stdout, "target "+f.a) || stderr != "" {
		t.Errorf("recorded target: code %d\n%s%s", code, stdout, stderr)
	}

	code, stdout, stderr = f.eval(t, "eval", d, "--target", f.b)
	for _, want := range []string{"--target " + f.b + " (sha256 " + f.hashB[:12] + ") is not the target " + d + " was trained against (" + f.a + ", sha256 " + f.hashA[:12] + ")",
		"--force-target"} {
		if code != exitFailed || !strings.Contains(stderr, want) || stdout != "" {
			t.Errorf("another --target: code %d, want %q in\n%s%s", code, want, stdout, stderr)
		}
	}
	code, stdout, stderr = f.eval(t, "eval", d, "--target", f.b, "--force-target")
	if code != exitOK || !strings.Contains(stdout, "target "+f.b) || !strings.Contains(stderr, "note: evaluating against "+f.b) {
		t.Errorf("--force-target: code %d\n%s%s", code, stdout, stderr)
	}

	moved := filepath.Join(f.dir, "moved.safetensors")
	data, _ := os.ReadFile(f.a)
	os.WriteFile(moved, data, 0o644)
	if code, stdout, stderr = f.eval(t, "eval", d, "--target", moved); code != exitOK || !strings.Contains(stdout, "target "+moved) || stderr != "" {
		t.Errorf("the same target elsewhere: code %d\n%s%s", code, stdout, stderr)
	}

	other, _ := os.ReadFile(f.b)
	os.WriteFile(f.a, other, 0o644) // the recorded file now holds another model
	code, _, stderr = f.eval(t, "eval", d)
	if want := "but that file now holds another model (sha256 " + f.hashB[:12] + ")"; code != exitFailed || !strings.Contains(stderr, want) {
		t.Errorf("recorded target replaced: code %d, want %q in\n%s", code, want, stderr)
	}
}

// TestEvalOlderDrafter: a drafter that records its target without a hash
// (an older dflow) is evaluated with the path, saying so.
func TestEvalOlderDrafter(t *testing.T) {
	t.Parallel()
	f := newEvalFixture(t)
	d := f.drafter(t, "old.safetensors", map[string]string{"target": f.a})
	code, stdout, stderr := f.eval(t, "eval", d)
	if code != exitOK || !strings.Contains(stdout, "target "+f.a) || !strings.Contains(stderr, "no hash of it (saved by an older dflow): using that path unchecked") {
		t.Errorf("older drafter: code %d\n%s%s", code, stdout, stderr)
	}
}

// TestEvalUsage: nonsense options are usage errors (exit 2) in words, and
// a file that is not a drafter is an error in words, not a struct dump.
func TestEvalUsage(t *testing.T) {
	t.Parallel()
	f := newEvalFixture(t)
	d := f.drafter(t, "d.safetensors", map[string]string{"target": f.a, "target_sha256": f.hashA})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{d, "--prompts", "0"}, "--prompts 0: want at least 1 prompt"},
		{[]string{d, "--cycles", "0"}, "--cycles 0: want at least 1 cycle"},
		{[]string{d, "--holdout", "2"}, "--holdout 2: want a share of the corpus more than 0 and less than 1"},
		{[]string{d, "--holdout", "0"}, "--holdout 0: want a share"},
		{[]string{d, "--max-bytes", "0"}, "--max-bytes 0"},
		{[]string{d, "--force-target"}, "--force-target needs --target"},
		{[]string{}, "want one drafter checkpoint, got 0"},
	} {
		code, _, stderr := dflow(t, append([]string{"eval"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: code %d, want %q in %q", tc.args, code, tc.want, stderr)
		}
	}
	text := filepath.Join(f.dir, "notes.txt")
	os.WriteFile(text, []byte("these are notes, not weights\n"), 0o644)
	for _, tc := range []struct{ file, want string }{
		{f.a, f.a + " is a target LM, not a drafter checkpoint"},
		{text, "not a safetensors file"},
		{filepath.Join(f.dir, "missing.safetensors"), "no such file"},
	} {
		code, _, stderr := f.eval(t, "eval", tc.file)
		if code != exitFailed || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "{") {
			t.Errorf("%s: code %d, want %q in %q", tc.file, code, tc.want, stderr)
		}
	}
}
