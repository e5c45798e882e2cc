package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// TestTargetsLost: the DFlash job over three standing workers, every
// target_forward replica on w2, which is SIGKILLed once the drafters have
// trained on a few batches. target_forward is stateless (frozen weights,
// loaded at the start): its replicas restart on the live workers, which
// load the model there, the batches w2 had not finished come back, and
// what it had sent is sent again under the same ids and dropped. The run
// completes ok with every batch reaching the drafters once and the
// checkpoint written.
func TestTargetsLost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("trains a drafter on three workers")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.txt")
	text, err := os.ReadFile(filepath.Join(root, "internal/engine/engine.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(corpus, text, 0o644); err != nil {
		t.Fatal(err)
	}
	const batches = 60
	model := filepath.Join(root, "models/target.safetensors")
	ckpt := filepath.Join(dir, "drafter.safetensors")
	vars := map[string]string{"batches": strconv.Itoa(batches), "corpus": corpus, "checkpoint": ckpt, "targets": "3"}
	sets := []string{"stage.reader.config.epochs=10", "stage.target.config.model=" + model, "stage.drafter.config.target=" + model,
		"stage.drafter.config.eval_prompts=4", "stage.drafter.config.eval_every=0"}
	srv := startServer(t)
	ws := workers(t, srv.URL, srv.Token, 3, "--read", root, "--read", dir, "--write", dir)
	file := filepath.Join(root, "specs/dflash.hcl")
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{stdout: &strings.Builder{}, stderr: &syncBuffer{}, registry: nodes.Default.Clone()}
	sf := &specFlags{sets: sets}
	for k, v := range vars {
		sf.vars = append(sf.vars, k+"="+v)
	}
	g := e.load(sf, file)
	if g == nil {
		t.Fatalf("spec: %s", e.stderr.(*syncBuffer).String())
	}
	nc, err := cluster.Connect(cluster.ConnOptions{URL: srv.URL, Token: srv.Token, Name: "dflow run " + file})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := cluster.NewCoordinator(context.Background(), cluster.CoordOptions{
		Conn: nc, Graph: g, Workers: 3, Registry: e.registry,
		Job:      cluster.Job{Filename: file, Src: src, Vars: vars, Sets: sets},
		Interval: 200 * time.Millisecond, Log: e.stderr,
		Pin:     map[string][]string{"reader": {"w1"}, "target": {"w2"}, "drafter": {"w3"}},
		Timings: cluster.Timings{Lease: 2 * time.Second, AckWait: 3 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	go func() {
		if !stageGot(c, "drafter", 10, 60*time.Second) {
			t.Error("the drafters did not get going")
			return
		}
		ws[1].cmd.Process.Signal(syscall.SIGKILL)
	}()
	rep, err := c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the run hung: %v", err)
	}
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s: %v %s\nw2:\n%s", rep.Status, err, rep.Error, ws[1].output())
	}
	wantEdges(t, rep, batches)
	for _, stage := range []string{"target", "drafter"} {
		var in int64
		for _, r := range rep.Stages[stage].Replicas {
			in += r.ItemsIn
		}
		if in != batches {
			t.Errorf("stage %s took %d batches, want %d", stage, in, batches)
		}
	}
	restarted := 0
	for _, r := range rep.Stages["target"].Replicas {
		if strings.HasPrefix(r.Worker, "w2>") {
			restarted++
		}
	}
	if restarted != 3 {
		t.Errorf("%d of 3 target replicas restarted off w2: %+v", restarted, rep.Stages["target"].Replicas)
	}
	if _, err := os.Stat(ckpt); err != nil {
		t.Errorf("no checkpoint: %v", err)
	}
}

// stageGot polls the coordinator until stage's replicas have taken n
// items in all.
func stageGot(c *cluster.Coordinator, stage string, n int64, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st := c.Snapshot().Stage(stage); st != nil {
			var in int64
			for _, r := range st.Replicas {
				in += r.ItemsIn
			}
			if in >= n {
				return true
			}
		}
	}
	return false
}

// TestSourceLost: the seed's reader (synthetic_source, which resumes) on
// w2, SIGKILLed mid-run with part of its items sent. It restarts on a live
// worker and resumes after what it had stored: nothing is emitted twice
// and nothing is skipped, so every edge and stage counts 300 once.
func TestSourceLost(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ws := workers(t, srv.URL, srv.Token, 3)
	rep, err, _ := coordinatePlaced(t, srv, 3, map[string][]string{"reader": {"w2"}}, func(c *cluster.Coordinator) {
		if !sinkGot(c, 60, 30*time.Second) {
			t.Error("the run did not get going")
			return
		}
		ws[1].cmd.Process.Signal(syscall.SIGKILL)
	}, "stage.drafter.config.sync=false", "stage.target.config.service_time=10ms", "stage.drafter.config.service_time=5ms")
	if err != nil {
		t.Fatalf("%v\nw2:\n%s", err, ws[1].output())
	}
	if rep.Status != report.OK {
		t.Fatalf("status %s: %s", rep.Status, rep.Error)
	}
	wantEdges(t, rep, 300)
	var out int64
	for _, r := range rep.Stages["reader"].Replicas {
		out += r.ItemsOut
		if !strings.HasPrefix(r.Worker, "w2>") {
			t.Errorf("the reader did not restart off w2: %+v", r)
		}
	}
	if out != 300 {
		t.Errorf("the reader sent %d, want 300", out)
	}
	resumed := false
	for _, w := range []*proc{ws[0], ws[2]} {
		resumed = resumed || strings.Contains(w.output(), "stage reader replica 0 resumes after its item")
	}
	if !resumed {
		t.Errorf("no worker said the reader resumed:\n%s\n%s", ws[0].output(), ws[2].output())
	}
}
