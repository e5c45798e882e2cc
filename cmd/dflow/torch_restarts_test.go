//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/nn"
)

// TestTorchDrafterRestarts: `dflow run specs/dflash-torch.hcl --set
// stage.drafter.restarts=1`, as docs/groups.md types it, in one process,
// with rank 1's process of the PyTorch DDP drafter SIGKILLed once the
// group has written its first checkpoint (step 2): the group restarts
// whole (which dflow says), its ranks restore a save, the batches since
// come back, and the run ends ok with every batch's gradient in the
// checkpoint once (its own count).
func TestTorchDrafterRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a PyTorch drafter")
	}
	python(t, "grpc, google.protobuf, numpy, torch")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(t.TempDir(), "drafter.safetensors")
	model := filepath.Join(root, "models/target.safetensors")
	const batches = 24
	over := make(chan struct{})
	killed := make(chan int, 1)
	go func() {
		// Once the first checkpoint is there, rank 1 is the child of this
		// process whose environment says RANK=1.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-over:
				killed <- 0
				return
			case <-tick.C:
			}
			if _, err := os.Stat(ckpt); err != nil {
				continue
			}
			if pid := childRank(1); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
				killed <- pid
				return
			}
		}
	}()
	code, stdout, stderr := dflow(t, "run", filepath.Join(root, "specs/dflash-torch.hcl"),
		"--var", "batches="+strconv.Itoa(batches), "--var", "corpus="+filepath.Join(root, "internal/engine"), "--var", "checkpoint="+ckpt, "--var", "targets=2",
		"--set", "stage.target.config.model="+model, "--set", "stage.drafter.config.target="+model, "--set", "stage.drafter.config.checkpoint_every=2",
		"--set", "stage.reader.config.seq_len=32", "--set", "stage.reader.config.batch_size=4", "--set", "stage.drafter.restarts=1")
	close(over)
	if pid := <-killed; pid == 0 {
		t.Fatalf("the run ended (code %d) before rank 1 could be killed after the first checkpoint\n%s%s", code, stdout, stderr)
	}
	if code != exitOK {
		t.Fatalf("code %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		`dflow: stage "drafter": the process of rank 1 of 3 died (`,
		"its group cannot go on without it, and restarts whole (restart 1 of 1): every rank starts again, ",
		"drafter_train: restored the group's save of step ",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q\n%s", want, stderr)
		}
	}
	meta, err := nn.ReadSafetensorsMetadata(ckpt)
	if err != nil {
		t.Fatalf("the checkpoint: %v", err)
	}
	if meta["batches"] != strconv.Itoa(batches) {
		t.Errorf("the checkpoint holds the gradients of %s batches, want %d\n%s", meta["batches"], batches, stderr)
	}
}

// childRank is the pid of the child process of this one that runs rank
// of a group (RANK=rank in its environment), or 0.
func childRank(rank int) int {
	self := strconv.Itoa(os.Getpid())
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'
		i := strings.LastIndexByte(string(stat), ')')
		if f := strings.Fields(string(stat[i+1:])); i < 0 || len(f) < 2 || f[1] != self {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == "RANK="+strconv.Itoa(rank) {
				return pid
			}
		}
	}
	return 0
}
