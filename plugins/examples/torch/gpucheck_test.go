package torch

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGPUCheckOnCPU runs bench/gpu/dflash-torch, the PyTorch job's check
// for one GPU, where torch has no CUDA: it falls back to the CPU and says
// so, times an item's trip part by part against a device-to-device copy,
// and runs specs/dflash-torch.hcl on 6 small batches to its figures
// (samples/s, the drafters' wait for data), ending ok. So the check works
// the first time a GPU is there but for what only a GPU does.
func TestGPUCheckOnCPU(t *testing.T) {
	python(t)
	if testing.Short() {
		t.Skip("builds dflow and runs the PyTorch job")
	}
	py := os.Getenv("DFLOW_PYTHON")
	if exec.Command(py, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)").Run() == nil {
		t.Skipf("%s's torch has CUDA: this test runs the check's CPU fallback (bench/gpu/dflash-torch runs it on the GPU)", py)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	dflow := filepath.Join(tmp, "dflow")
	build := exec.Command("go", "build", "-o", dflow, "./cmd/dflow")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/dflow: %v\n%s", err, out)
	}
	corpus := filepath.Join(tmp, "corpus.txt")
	if err := os.WriteFile(corpus, []byte(strings.Repeat("func main() { fmt.Println(\"hello, dflow\") }\n", 300)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "bench/gpu/dflash-torch"))
	cmd.Env = append(os.Environ(), "DFLOW="+dflow, "OUT="+tmp, "BATCHES=6", "TARGETS=2", "BATCH_SIZE=4", "SEQ_LEN=32",
		"CORPUS="+corpus, "ROUNDS=5", "RUN_TIMEOUT=240")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("bench/gpu/dflash-torch in %v:\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("bench/gpu/dflash-torch: %v", err)
	}
	for _, want := range []string{
		"falling back to the CPU",
		"device-to-device copy (the baseline)",
		"device to host (into shared memory)",
		"shared memory (dflow's two copies)",
		"host to device (the whole item)",
		"x the device-to-device copy",
		"status ok",
		"samples/s ",
		": 6 batches of 4 sequences",
		"of each step for data, rank_divergence 0",
		"target   on cpu",
		"done on cpu, fail=0",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the check's output lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "dflash-torch.log")); err != nil {
		t.Errorf("no log: %v", err)
	}
}
