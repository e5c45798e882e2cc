package torch

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/plugins/host"
)

// python is the interpreter the plugin runs with ($DFLOW_PYTHON, or
// Debian's); the test skips without torch, grpcio, protobuf and numpy.
func python(t *testing.T) {
	py, err := checkPython()
	if err != nil {
		t.Skipf("%s lacks torch, grpcio, protobuf or numpy (Debian: python3-torch python3-grpcio python3-protobuf python3-numpy): %v", py, err)
	}
	t.Setenv("DFLOW_PYTHON", py)
}

// checkPython imports what the plugin needs, once for the test binary
// (an import of torch costs about 2 s of CPU).
var checkPython = sync.OnceValues(func() (string, error) {
	py := os.Getenv("DFLOW_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch, grpc, google.protobuf, numpy").CombinedOutput(); err != nil {
		return py, fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return py, nil
})

type stderr struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *stderr) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *stderr) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// setup works from the repository's root, as dflow runs specs/dflash.hcl,
// with the torch plugin loaded as "torch" and a small corpus.
func setup(t *testing.T) (*nodes.Registry, *stderr, string) {
	python(t)
	plugin, err := filepath.Abs("dflow-plugin-torch")
	if err != nil {
		t.Fatal(err)
	}
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(corpus, bytes.Repeat([]byte("func main() { fmt.Println(\"hello, dflow\") }\n// a comment, then more code\n"), 300), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir("../../..")
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	text.Register(reg)
	dflash.Register(reg)
	var errs stderr
	h := host.New(&errs)
	t.Cleanup(h.Close)
	if _, err := h.Load("torch", plugin, reg); err != nil {
		t.Fatal(err)
	}
	return reg, &errs, corpus
}

func run(t *testing.T, reg *nodes.Registry, src string, vars map[string]string) error {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: reg, Vars: vars}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := engine.Run(ctx, g, engine.Options{Registry: reg})
	return err
}

const paritySpec = `
stage "reader" {
  node = "text_reader"
  config {
    path       = %q
    seq_len    = 64
    batch_size = 8
    limit      = 6
  }
}
stage "target" {
  node = %q
  config {
    model = "models/target.safetensors"
  }
}
stage "sink" {
  node = "hidden_sink"
}
edge "tokens" {
  from = reader.out
  to   = target.in
}
edge "hs" {
  from = target.hidden
  to   = sink.in
}`

// TestParity: on the same batches, the PyTorch target's hidden states
// match the Go target's within 1e-4, its greedy tokens and inputs are the
// same, and every batch arrives once.
func TestParity(t *testing.T) {
	reg, errs, corpus := setup(t)
	got := map[string]map[int64]*dflash.HiddenStates{}
	var mu sync.Mutex
	sink := ""
	reg.Register(plugintest.Sink("hidden_sink", graph.Any, func(item any) error {
		h := item.(*dflash.HiddenStates)
		mu.Lock()
		defer mu.Unlock()
		if got[sink][h.Seq] != nil {
			return fmt.Errorf("batch %d twice", h.Seq)
		}
		got[sink][h.Seq] = h
		return nil
	}))
	for _, node := range []string{"target_forward", "torch/target_forward"} {
		sink = node
		got[node] = map[int64]*dflash.HiddenStates{}
		if err := run(t, reg, fmt.Sprintf(paritySpec, corpus, node), nil); err != nil {
			t.Fatalf("%s: %v\n%s", node, err, errs)
		}
		if len(got[node]) != 6 {
			t.Fatalf("%s: %d batches, want 6", node, len(got[node]))
		}
	}
	var worst float64
	for seq, g := range got["target_forward"] {
		p := got["torch/target_forward"][seq]
		if p == nil || p.B != g.B || p.T != g.T || p.K != g.K || p.D != g.D {
			t.Fatalf("batch %d: torch %+v, Go B=%d T=%d K=%d D=%d", seq, p, g.B, g.T, g.K, g.D)
		}
		for i := range g.Hidden {
			worst = math.Max(worst, math.Abs(float64(g.Hidden[i]-p.Hidden[i])))
		}
		for i := range g.Tokens {
			if g.Tokens[i] != p.Tokens[i] || g.Greedy[i] != p.Greedy[i] {
				t.Fatalf("batch %d position %d: tokens %d/%d, greedy %d/%d (Go/torch)", seq, i, g.Tokens[i], p.Tokens[i], g.Greedy[i], p.Greedy[i])
			}
		}
	}
	t.Logf("max |hidden difference| %.2e", worst)
	if worst > 1e-4 {
		t.Errorf("hidden states differ by %.2e, more than 1e-4", worst)
	}
}

// TestDFlashWithTorchTarget: the walkthrough's spec, dflash.hcl here,
// runs the PyTorch target into the Go drafters; every batch is read,
// forwarded and trained on once.
func TestDFlashWithTorchTarget(t *testing.T) {
	reg, errs, corpus := setup(t)
	// Smaller batches and one evaluation prompt: the drafters train in
	// this race-built process.
	g, diags := (&graph.Loader{Catalog: reg, Vars: map[string]string{
		"corpus": corpus, "batches": "12", "targets": "2", "checkpoint": filepath.Join(t.TempDir(), "d.safetensors")},
		Sets: []string{"stage.reader.config.seq_len=32", "stage.reader.config.batch_size=4", "stage.drafter.config.eval_prompts=1"}}).LoadFile(torchSpec)
	if diags.HasErrors() {
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
}

// torchSpec is the walkthrough's spec, from the repository's root.
const torchSpec = "plugins/examples/torch/dflash.hcl"

// torchHeader is what dflash.hcl here has in place of the main job's
// leading comment.
const torchHeader = `# The main job, specs/dflash.hcl, with its targets in PyTorch: the same
# spec but for the plugin block, the target stage's node and threads, the
# number of batches and the drafter's file, its own, so that the main
# job's is not replaced. From the clone:
#   dflow run plugins/examples/torch/dflash.hcl

plugin "torch" {
  path = "dflow-plugin-torch" # beside this file
}
`

// TestSpecIsTheMainJobs: dflash.hcl here is specs/dflash.hcl but for what
// its header says (the README's step 4 shows those lines): a change to the
// main job fails this test until the PyTorch one has it too.
func TestSpecIsTheMainJobs(t *testing.T) {
	main, err := os.ReadFile("../../../specs/dflash.hcl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(main), "\n")
	for len(lines) > 0 && strings.HasPrefix(lines[0], "#") {
		lines = lines[1:] // the main job's header
	}
	want := torchHeader + strings.Join(lines, "")
	for _, r := range [][2]string{
		{"variable \"batches\" {\n  default = 2400\n}", "variable \"batches\" {\n  default = 240 # a tenth of the main job's (--var batches=2400 for all of it)\n}"},
		{"variable \"checkpoint\" {\n  default = \"drafter.safetensors\"\n}", "variable \"checkpoint\" {\n  default = \"drafter-torch.safetensors\"\n}"},
		{"  node     = \"target_forward\"\n", "  node     = \"torch/target_forward\" # was \"target_forward\"\n"},
		{"    model = \"models/target.safetensors\"\n", "    model   = \"models/target.safetensors\"\n    threads = 1 # a torch thread per replica: five on a few cores\n"},
	} {
		if strings.Count(want, r[0]) != 1 {
			t.Fatalf("specs/dflash.hcl has no one %q: the PyTorch spec's changes need redoing", r[0])
		}
		want = strings.Replace(want, r[0], r[1], 1)
	}
	got, err := os.ReadFile("dflash.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("dflash.hcl is not specs/dflash.hcl with the PyTorch target's changes; want\n%s", want)
	}
}

// TestReadmeCommands: each dflow run of the README, flags and all, loads
// this folder's spec or specs/dflash-torch.hcl and writes a drafter of its
// own: never
// the main job's drafter.safetensors, which the top README's first run
// wrote and which dflow would refuse to replace.
func TestReadmeCommands(t *testing.T) {
	reg, _, _ := setup(t)
	src, err := os.ReadFile("plugins/examples/torch/README.md")
	if err != nil {
		t.Fatal(err)
	}
	written := map[string]bool{"drafter.safetensors": true, "drafter-shared.safetensors": true} // the top README's
	runs := 0
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || strings.Join(f[:4], " ") != "go run ./cmd/dflow run" {
			continue
		}
		runs++
		if f[4] != torchSpec && f[4] != ddpSpec {
			t.Errorf("%s: runs %s, not %s or %s", line, f[4], torchSpec, ddpSpec)
			continue
		}
		l := &graph.Loader{Catalog: reg, Vars: map[string]string{}}
		for i := 5; i+1 < len(f); i += 2 {
			switch f[i] {
			case "--set":
				l.Sets = append(l.Sets, f[i+1])
			case "--var":
				k, v, _ := strings.Cut(f[i+1], "=")
				l.Vars[k] = v
			default:
				t.Fatalf("%s: flag %s", line, f[i])
			}
		}
		g, diags := l.LoadFile(f[4])
		if diags.HasErrors() {
			t.Errorf("%s: %v", line, diags)
			continue
		}
		if cp := g.Stage("drafter").Config.String("checkpoint"); written[cp] {
			t.Errorf("%s: writes %s, which an earlier run of the walkthrough wrote", line, cp)
		} else {
			written[cp] = true
		}
	}
	if runs < 3 {
		t.Errorf("the README shows %d dflow run lines, want the spec's, the shared wiring's and the DDP drafters'", runs)
	}
}
