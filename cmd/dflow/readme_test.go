package main

import (
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/testutil"
)

// readmeCommands returns the dflow command lines of the README's sh
// blocks, in order, as dflow's arguments ("run specs/dflash.hcl ..."):
// lines that start with `go run ./cmd/dflow` or `dflow`, comments cut.
func readmeCommands(t *testing.T) [][]string {
	t.Helper()
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var cmds [][]string
	inSh := false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		if !inSh {
			continue
		}
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "go" && f[1] == "run" && f[2] == "./cmd/dflow":
			cmds = append(cmds, f[3:])
		case len(f) >= 1 && f[0] == "dflow":
			cmds = append(cmds, f[1:])
		}
	}
	return cmds
}

// writeCorpus writes a small text corpus of about n bytes: words drawn
// with a fixed seed, so the drafter has something to learn and held-out
// chunks to be measured on.
func writeCorpus(t *testing.T, path string, n int) {
	t.Helper()
	words := strings.Fields("func return if else for range the quick brown fox jumps over a lazy dog := nil err")
	r := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(" \n"[r.IntN(2)])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReadmeDflashCommands runs the README's commands on the main job one
// after another, as written, in a folder of their own (a fresh clone's:
// the specs and the model, no drafter yet), each a process of dflow as
// the README installs it (installed), as a user's would be, scaled down
// by flags added at the end (a small corpus, few batches). Each must
// succeed: the second run writes its drafter beside the first one, which
// stays the first run's. Running the main job again as written is refused
// before any work, with the error and nothing else: no summary of a run
// that never started.
func TestReadmeDflashCommands(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("trains a drafter twice")
	}
	dir := t.TempDir()
	for _, d := range []string{"models", "specs"} {
		abs, err := filepath.Abs(filepath.Join("../..", d))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	writeCorpus(t, filepath.Join(dir, "corpus.txt"), 200_000)
	quick := map[string][]string{
		"run": {"--var", "batches=16", "--var", "corpus=corpus.txt", "--set", "stage.drafter.config.eval_prompts=2", "--interval", "0",
			"--set", "stage.reader.config.seq_len=32", "--set", "stage.reader.config.batch_size=4"},
		"eval": {"--corpus", "corpus.txt", "--prompts", "2", "--cycles", "2"},
	}
	bin := installed(t)
	dflowRun := func(args []string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, append(append([]string{}, args...), quick[args[0]]...)...)
		cmd.Dir = dir
		p := startProc(t, cmd)
		return p.wait(t, 5*time.Minute), p.output()
	}
	var ran []string
	for _, args := range readmeCommands(t) {
		if len(args) < 2 || (args[1] != "specs/dflash.hcl" && args[0] != "eval") {
			continue // other specs, the tests
		}
		ran = append(ran, strings.Join(args, " "))
		if code, out := dflowRun(args); code != exitOK {
			t.Fatalf("dflow %s (after %q): exit %d\n%s", strings.Join(args, " "), ran[:len(ran)-1], code, out)
		}
	}
	if len(ran) < 2 || !strings.HasPrefix(ran[0], "run specs/dflash.hcl") || !strings.Contains(ran[1], "edge.hs.policy=shared") {
		t.Fatalf("the README's commands on the main job are not the main job then the shared wiring: %q", ran)
	}
	first, err := nn.ReadSafetensorsMetadata(filepath.Join(dir, "drafter.safetensors"))
	if err != nil {
		t.Fatalf("the main job's drafter: %v", err)
	}
	second, err := nn.ReadSafetensorsMetadata(filepath.Join(dir, "drafter-shared.safetensors"))
	if err != nil {
		t.Fatalf("the shared run's drafter: %v", err)
	}
	if first["run_id"] == "" || first["run_id"] == second["run_id"] {
		t.Errorf("run ids: main job %q, shared run %q; want two runs' files", first["run_id"], second["run_id"])
	}

	// Again as written: the trained drafter is kept, and a run that
	// never started prints its error, not an all-zero summary.
	code, out := dflowRun(strings.Fields(ran[0]))
	if code != exitFailed || !strings.Contains(out, "refusing to overwrite it") {
		t.Fatalf("the main job again: exit %d, want %d and the refusal\n%s", code, exitFailed, out)
	}
	for _, summary := range []string{"run failed in", "stage reader", "edge  tokens", "diagnosis:"} {
		if strings.Contains(out, summary) {
			t.Errorf("a run that never started printed %q:\n%s", summary, out)
		}
	}
	if again, _ := nn.ReadSafetensorsMetadata(filepath.Join(dir, "drafter.safetensors")); again["run_id"] != first["run_id"] {
		t.Errorf("the main job's drafter was replaced: run %q, was %q", again["run_id"], first["run_id"])
	}
	if n := strings.Count(out, "dflow run: specs/dflash.hcl:"); n != 1 || !strings.Contains(out, "dflow: stage drafter wrote nothing to drafter.safetensors") {
		t.Errorf("want the error once, after the file left alone:\n%s", out)
	}
}

// TestReadmeInstall: the README says how to get the dflow command the
// docs type, and where it lands: its `go install` line, run as written
// from the clone with GOBIN set to a folder of the test's, makes a dflow
// there that answers --version (one link of dflow: the other tests' comes
// from the build cache, installed).
func TestReadmeInstall(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds dflow")
	}
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"$GOBIN", "$(go env GOPATH)/bin", "PATH"} {
		if !strings.Contains(string(src), want) {
			t.Errorf("the README does not say where dflow lands: no %q", want)
		}
	}
	line, err := installLine()
	if err != nil {
		t.Fatal(err)
	}
	gobin := t.TempDir()
	cmd := exec.Command(line[0], line[1:]...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "GOBIN="+gobin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%q: %v\n%s", line, err, out)
	}
	bin := filepath.Join(gobin, "dflow")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "dflow ") {
		t.Errorf("%s --version: %v %q", bin, err, out)
	}
}

var installOnce = sync.OnceValues(install)

// installed returns dflow built with the README's go install line's
// flags and package, as a user's is: without the race detector (and,
// coming from go run's cache, without debug information or a VCS stamp,
// which the tests do not read; TestReadmeInstall runs the line itself).
// The tests whose cost is a model's arithmetic (about 3 times slower
// under -race) run their workers with it. It is built once, by the first
// test that asks, and linked only when the build cache does not hold it
// yet (testutil.Built).
func installed(t *testing.T) string {
	t.Helper()
	bin, err := installOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func install() (string, error) {
	line, err := installLine()
	if err != nil {
		return "", err
	}
	// go install's flags, on go run's line (testutil.Built)
	return testutil.Built(repoRoot, line[len(line)-1], nil, line[2:len(line)-1]...)
}

// installLine is the README's go install line of ./cmd/dflow, in words.
func installLine() ([]string, error) {
	blocks, err := readShBlocks(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		return nil, err
	}
	var line []string
	for _, b := range blocks {
		for _, l := range b {
			l, _, _ = strings.Cut(l, "#")
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "go" && f[1] == "install" && strings.HasSuffix(f[len(f)-1], "cmd/dflow") {
				line = f
			}
		}
	}
	if line == nil {
		return nil, errors.New("the README's commands have no go install of ./cmd/dflow")
	}
	return line, nil
}
