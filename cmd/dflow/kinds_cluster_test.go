package main

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// kindCase is a spec run in one process and over two workers, and what
// must come out of both alike.
type kindCase struct {
	name string
	args []string // after "run SPEC"
	// outputs are the files the run writes, by stage and format
	// ("drafter" or "lm"): each must exist, load, and record the step the
	// report's step metric says
	outputs map[string]string // stage -> format
	file    map[string]string // stage -> path, filled in per run
	// model: the run is a model's arithmetic, which -race slows about
	// 3 times: the run in one process, dflow eval of the outputs and the
	// workers are dflow as installed (the kinds' own tests run them
	// under -race); the coordinator stays in this process
	model bool
}

// TestKindsAcrossWorkers: every built-in node kind, through the specs
// that use it, run with --local-cluster 2 and in one process: the same
// counts, the same node metrics (within a tolerance where batches reach
// other replicas in another order), and the same outputs written, which
// load (the drafter through dflow eval). A group whose members sit on two
// workers does what it does once (the final checkpoint and evaluation)
// once: no counter in a node value decides it.
func TestKindsAcrossWorkers(t *testing.T) {
	t.Parallel()
	// One corpus for both runs of a case, as it was when the test began
	// (the tree's own text changes while people work in it).
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	var text []byte
	for _, f := range []string{"internal/engine/engine.go", "internal/engine/deadlock.go", "internal/cluster/share/transport.go", "internal/nn/model.go", "README.md"} {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		text = append(text, b...)
	}
	if err := os.WriteFile(corpus, text, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []kindCase{
		{name: "seed", args: []string{"../../specs/seed.hcl", "--var", "items=120",
			"--set", "stage.target.config.service_time=2ms", "--set", "stage.drafter.config.service_time=1ms"}},
		{name: "fan", args: []string{"../../specs/fan.hcl", "--set", "stage.wide.config.service_time=1ms"}},
		{name: "dflash", args: []string{"../../specs/dflash.hcl", "--var", "batches=48", "--var", "corpus=" + corpus,
			"--set", "stage.drafter.config.eval_prompts=2", "--set", "stage.reader.config.seq_len=32", "--set", "stage.reader.config.batch_size=4",
			// the spec names the model relative to the repository
			"--set", "stage.target.config.model=../../models/target.safetensors",
			"--set", "stage.drafter.config.target=../../models/target.safetensors"},
			outputs: map[string]string{"drafter": "drafter"}, model: true},
		{name: "pretrain", args: []string{"../../specs/pretrain.hcl", "--var", "steps=24", "--var", "corpus=" + corpus, "--var", "seq_len=16", "--set", "stage.reader.config.batch_size=4",
			"--set", "stage.train.replicas=2", "--set", "stage.train.config.eval_batches=4",
			// a model of 29 thousand values, not the spec's 840 thousand:
			// each step's gradient crosses the race-built coordinator
			"--set", "stage.train.config.d_model=32", "--set", "stage.train.config.layers=2",
			"--set", "stage.train.config.heads=2", "--set", "stage.train.config.hidden=64"},
			outputs: map[string]string{"train": "lm"}, model: true},
	}
	var mu sync.Mutex
	covered := map[string]bool{}
	t.Run("cases", func(t *testing.T) { // returns once every case has
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				var local, across *report.Report
				t.Run("runs", func(t *testing.T) { // both side by side
					t.Run("one process", func(t *testing.T) {
						t.Parallel()
						local = runKindCase(t, c, corpus, false)
					})
					t.Run("two workers", func(t *testing.T) {
						t.Parallel()
						across = runKindCase(t, c, corpus, true)
					})
				})
				if local == nil || across == nil {
					return // a run failed, and said why
				}
				for name, st := range local.Stages {
					mu.Lock()
					covered[st.Node] = true
					mu.Unlock()
					compareStage(t, name, st, across.Stages[name])
				}
				for name, e := range local.Edges {
					a := across.Edges[name]
					if a.Produced != e.Produced || a.Consumed != e.Consumed || a.Produced != a.Consumed {
						t.Errorf("edge %s: produced/consumed %d/%d over two workers, %d/%d in one process", name, a.Produced, a.Consumed, e.Produced, e.Consumed)
					}
				}
			})
		}
	})
	for _, k := range nodes.Default.KindNames() {
		if !covered[k] && !t.Failed() {
			t.Errorf("built-in kind %s is run by no case: add a spec that uses it", k)
		}
	}
}

// dflow runs dflow with args in this process, or for a model's case the
// installed dflow; over workers (cluster), a model's case runs its
// coordinator here and its workers installed.
func (c kindCase) dflow(t *testing.T, cluster bool, args ...string) (code int, stderr string) {
	t.Helper()
	if !c.model || cluster {
		var out strings.Builder
		errb := &testutil.SyncBuffer{}
		e := &env{stdout: &out, stderr: errb, registry: nodes.Default.Clone()}
		if c.model {
			e.workerCommand = []string{installed(t)}
		}
		return e.main(args), errb.String()
	}
	p := startProc(t, exec.Command(installed(t), args...))
	return p.wait(t, 5*time.Minute), p.output()
}

// runKindCase runs c in one process or over two workers and checks what
// the run wrote.
func runKindCase(t *testing.T, c kindCase, corpus string, cluster bool) *report.Report {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "r.json")
	args := append([]string{"run"}, c.args...)
	args = append(args, "--report", out)
	files := map[string]string{}
	for stage, format := range c.outputs {
		files[stage] = filepath.Join(dir, stage+".safetensors")
		attr := "checkpoint"
		if format == "lm" {
			attr = "out"
		}
		args = append(args, "--set", "stage."+stage+".config."+attr+"="+files[stage])
	}
	where := "in one process"
	if cluster {
		args = append(args, "--local-cluster", "2")
		where = "over two workers"
	}
	code, stderr := c.dflow(t, cluster, args...)
	if code != exitOK {
		t.Fatalf("%s: code %d\n%s", where, code, stderr)
	}
	if strings.Contains(stderr, "wrote nothing") {
		t.Errorf("%s: an output was not written:\n%s", where, stderr)
	}
	rep := readReport(t, out)
	for stage, format := range c.outputs {
		meta, err := nn.ReadSafetensorsMetadata(files[stage])
		if err != nil {
			t.Fatalf("%s: stage %s's output: %v", where, stage, err)
		}
		key := "step"
		if format == "lm" {
			key = "steps"
			if _, _, err := nn.LoadModel(files[stage]); err != nil {
				t.Errorf("%s: the model does not load: %v", where, err)
			}
		} else if code, stderr := c.dflow(t, false, "eval", files[stage], "--corpus", corpus, "--prompts", "2"); code != exitOK {
			t.Errorf("%s: dflow eval of the checkpoint: code %d\n%s", where, code, stderr)
		}
		if step := rep.Stages[stage].Metrics["step"]; meta[key] != strconv.Itoa(int(step)) {
			t.Errorf("%s: stage %s wrote step %s, its last step is %v", where, stage, meta[key], step)
		}
		// The workers write the coordinator's run (this process's, or
		// for a model's case in one process the installed dflow's).
		if run := nn.RunID(); meta["run_id"] != run && (cluster || !c.model) || meta["run_id"] == "" {
			t.Errorf("%s: stage %s's file records run %q, the run is %s", where, stage, meta["run_id"], run)
		}
	}
	return rep
}

// compareStage compares a stage's figures over two workers with one
// process's: its items in and out, and its node metrics (the same names;
// values within a tolerance where they depend on which replica got which
// batch, exactly where they do not).
func compareStage(t *testing.T, name string, local, across report.Stage) {
	t.Helper()
	sum := func(st report.Stage) (in, out int64) {
		for _, r := range st.Replicas {
			in, out = in+r.ItemsIn, out+r.ItemsOut
		}
		return
	}
	li, lo := sum(local)
	ai, ao := sum(across)
	if li != ai || lo != ao {
		t.Errorf("stage %s: in/out %d/%d over two workers, %d/%d in one process", name, ai, ao, li, lo)
	}
	names := func(m map[string]float64) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if l, a := names(local.Metrics), names(across.Metrics); !slices.Equal(l, a) {
		t.Errorf("stage %s: metrics %v over two workers, %v in one process", name, a, l)
	}
	for k, lv := range local.Metrics {
		av := across.Metrics[k]
		tol := 0.25 // the batches reach the replicas in another order
		switch {
		case strings.HasSuffix(k, "_per_s"), strings.HasSuffix(k, "_seconds"):
			continue // a rate or a time (data_wait_seconds): the machine's, not the run's
		case k == "step" && across.Metrics["batches"] > 0:
			// A group in one process steps with every member, each with a
			// batch; across workers a member whose batch is late is left
			// out of a step (more, smaller steps: 21 against 16 for 48
			// batches once, on a loaded machine), and no step trains less
			// than one batch.
			if av < lv || av > across.Metrics["batches"] {
				t.Errorf("stage %s: %v steps over two workers, %v in one process, for %v batches; want from %v to %v", name, av, lv, across.Metrics["batches"], lv, across.Metrics["batches"])
			}
			continue
		case k == "acceptance_length_initial" || k == "acceptance_length_ngram" || k == "ngram_bpb":
			tol = 1e-9 // measured on held-out text before any training, or a baseline's
		}
		if math.Abs(av-lv) > tol*math.Max(math.Abs(lv), 1e-9) {
			t.Errorf("stage %s: metric %s = %v over two workers, %v in one process", name, k, av, lv)
		}
	}
}
