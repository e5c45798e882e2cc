package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/lm"
	_ "github.com/dflow-dev/dflow/nodes/text"
)

// trainSpec is text_reader feeding lm_train: a corpus read twice and a
// model written.
func trainSpec(corpus, out string) string {
	return fmt.Sprintf(`
stage "reader" {
  node = "text_reader"
  config {
    path  = %q
    limit = 2
  }
}
stage "train" {
  node = "lm_train"
  config {
    path  = %q
    out   = %q
    steps = 2
  }
}
edge "tokens" {
  from = reader.out
  to   = train.in
}
`, corpus, corpus, out)
}

// rootsWorker starts one in-process worker, w1, with roots r.
func rootsWorker(t *testing.T, r Roots) *testCluster {
	t.Helper()
	tc := startClusterWith(t, 0, nodes.Default)
	ctx, cancel := context.WithCancel(context.Background())
	nc := tc.connect(t, "w1")
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		defer nc.Close()
		if err := RunWorker(ctx, WorkerOptions{Name: "w1", Conn: nc, Registry: tc.reg, Load: loader(tc.reg), Roots: &r}); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); tc.wg.Wait() })
	return tc
}

// refused runs spec on the worker and wants the coordinator's error to
// say each of words.
func refused(t *testing.T, tc *testCluster, spec string, words ...string) {
	t.Helper()
	file := writeSpec(t, "train.hcl", spec)
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	job := wire.Job{Filename: file, Src: src}
	g, err := loader(tc.reg)(&job)
	if err != nil {
		t.Fatal(err)
	}
	nc := tc.connect(t, "coordinator")
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := NewCoordinator(ctx, CoordOptions{Conn: nc, Graph: g, Job: job, Workers: 1, Registry: tc.reg})
	if err == nil {
		_, err = c.Run(ctx)
	}
	if err == nil {
		t.Fatal("the job ran; want it refused")
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q:\n%v", w, err)
		}
	}
}

func corpusIn(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "corpus.txt")
	if err := os.WriteFile(p, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 400)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWorkerRefusesCheckpointOutsideRoots: lm_train's out (a declared
// write path) outside the worker's --write folders is refused before any
// replica starts, naming the worker, the stage, the field and the folders
// allowed; nothing is written there. A path that climbs out with .. is
// refused alike.
func TestWorkerRefusesCheckpointOutsideRoots(t *testing.T) {
	t.Parallel()
	allowed, outside := t.TempDir(), t.TempDir()
	corpus := corpusIn(t, allowed)
	tc := rootsWorker(t, Roots{Write: []string{allowed}})
	out := filepath.Join(outside, "model.safetensors")
	refused(t, tc, trainSpec(corpus, out), "worker w1 refused the job", `stage "train": out = "`+out+`"`, "write only under", allowed)
	climb := allowed + "/../" + filepath.Base(outside) + "/model.safetensors"
	refused(t, tc, trainSpec(corpus, climb), "worker w1 refused the job", "outside the folders allowed")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s was written (%v)", out, err)
	}
}

// TestWorkerRefusesCorpusThroughSymlink: a corpus under an allowed folder
// by its name but, through a link, in a folder outside it is refused,
// naming where it leads.
func TestWorkerRefusesCorpusThroughSymlink(t *testing.T) {
	t.Parallel()
	allowed, outside := t.TempDir(), t.TempDir()
	corpusIn(t, outside)
	link := filepath.Join(allowed, "data")
	if err := os.Symlink(outside, link); err != nil {
		t.Skip("no symlinks here:", err)
	}
	tc := rootsWorker(t, Roots{Write: []string{allowed}})
	out := filepath.Join(allowed, "model.safetensors")
	real, _ := filepath.EvalSymlinks(outside)
	refused(t, tc, trainSpec(filepath.Join(link, "corpus.txt"), out),
		"worker w1 refused the job", `stage "reader": path = "`+filepath.Join(link, "corpus.txt")+`"`, "it leads to "+filepath.Join(real, "corpus.txt"))
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s was written (%v)", out, err)
	}
}
