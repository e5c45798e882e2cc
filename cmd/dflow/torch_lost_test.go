package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// TestTorchDrafterLost: specs/dflash-torch.hcl over three `dflow worker`
// processes, its three PyTorch DDP drafter ranks one on each, and the
// worker holding rank 1 SIGKILLed once the coordinator holds the group's
// save of step 2. A torch process group cannot shrink: the group is lost
// whole (the shares running ranks 0 and 2 restart too, which the
// coordinator says), every rank restarts with a fresh MASTER_PORT and
// restores the save it is told (restore_step), and the batches after it
// come back. The run ends ok, every batch's gradient in the checkpoint
// once (its own count), and the edges' counts exact.
func TestTorchDrafterLost(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a PyTorch drafter on three workers")
	}
	python(t, "grpc, google.protobuf, numpy, torch")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "drafter.safetensors")
	const batches = 24
	file := filepath.Join(root, "specs/dflash-torch.hcl")
	model := filepath.Join(root, "models/target.safetensors")
	vars := map[string]string{"batches": strconv.Itoa(batches), "corpus": filepath.Join(root, "internal/engine"), "checkpoint": ckpt, "targets": "2"}
	sets := []string{"stage.target.config.model=" + model, "stage.drafter.config.target=" + model,
		"stage.drafter.config.checkpoint_every=2", "stage.reader.config.seq_len=32", "stage.reader.config.batch_size=4"}
	e := &env{stdout: &strings.Builder{}, stderr: &testutil.SyncBuffer{}, registry: nodes.Default.Clone()}
	sf := &specFlags{sets: sets}
	for k, v := range vars {
		sf.vars = append(sf.vars, k+"="+v)
	}
	g := e.load(sf, file)
	defer e.closePlugins() // the catalog process the spec's plugin started here
	if g == nil {
		t.Fatalf("spec: %s", e.stderr.(*testutil.SyncBuffer).String())
	}
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bin := installed(t)
	srv := startServer(t)
	ws := workersOf(t, bin, srv.URL, srv.Token, 3, "--read", root, "--write", dir, "--plugins", filepath.Join(root, "plugins/examples/torch"))
	nc, err := cluster.Connect(cluster.ConnOptions{URL: srv.URL, Token: srv.Token, Name: "dflow run " + file})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := cluster.NewCoordinator(context.Background(), cluster.CoordOptions{
		Conn: nc, Graph: g, Workers: 3, Registry: e.registry,
		Job:      cluster.Job{Filename: file, Src: src, Vars: vars, Sets: sets},
		Interval: 200 * time.Millisecond, Log: e.stderr,
		Pin:     map[string][]string{"reader": {"w1"}, "target": {"w1", "w3"}, "drafter": {"w1", "w2", "w3"}},
		Timings: cluster.Timings{Lease: 6 * time.Second, AckWait: 3 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	over := make(chan struct{})
	killed := make(chan bool, 1)
	go func() {
		if !saveHeld(c, "drafter", 2, over) {
			killed <- false
			return
		}
		ws[1].cmd.Process.Signal(syscall.SIGKILL)
		killed <- true
	}()
	rep, err := c.Run(ctx)
	close(over)
	logs := func() string {
		return "coordinator:\n" + e.stderr.(*testutil.SyncBuffer).String() + "\nw1:\n" + ws[0].output() + "\nw2:\n" + ws[1].output() + "\nw3:\n" + ws[2].output()
	}
	if ctx.Err() != nil {
		t.Fatalf("the run hung: %v\n%s", err, logs())
	}
	if !<-killed {
		t.Fatalf("the run ended (%v) before the group's save of step 2 was held: nothing was killed\n%s", err, logs())
	}
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s: %v %s\n%s", rep.Status, err, rep.Error, logs())
	}
	said := e.stderr.(*testutil.SyncBuffer).String()
	for _, want := range []string{
		`stage "drafter" lost member 1 with worker w2, and its group cannot go on without it: the share w\d, on worker w\d, restarts too`,
		`stage "drafter" lost every member of its group: its restarts restore its last save \(step \d+`,
	} {
		if !regexp.MustCompile(want).MatchString(said) {
			t.Errorf("the coordinator did not say %q\n%s", want, logs())
		}
	}
	if !strings.Contains(ws[0].output()+ws[2].output(), "drafter_train: restored the group's save of step") {
		t.Errorf("no rank said it restored the save\n%s", logs())
	}
	wantEdges(t, rep, batches)
	// Every batch's gradient in the model once, by the drafter's own count.
	meta, err := nn.ReadSafetensorsMetadata(ckpt)
	if err != nil {
		t.Fatalf("the checkpoint: %v", err)
	}
	if meta["batches"] != strconv.Itoa(batches) {
		t.Errorf("the checkpoint holds the gradients of %s batches, want %d\n%s", meta["batches"], batches, logs())
	}
}
