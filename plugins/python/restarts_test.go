package python

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/host"
)

// restartsSpec: items (synthetic_source's blobs) into three DDP ranks of
// testdata/restarts.py, a group kind that restores; rank 1 waits to be
// killed at step 4, after rank 0's save of step 3.
const restartsSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = %d
    size_bytes = 8
  }
}
stage "train" {
  node     = "restarts/restarts"
  replicas = 3
  %s
  config {
    out      = %q
    items    = %d
    pause_at = 4
  }
}
edge "a" {
  from = src.out
  to   = train.in
}`

// restartsRun runs items through testdata/restarts.py's three ranks under
// one process, SIGKILLing rank 1's process each time it says it waits to
// be killed, kills times at most; it returns the run's error, the kills
// done, the ranks' folder and dflow's stderr.
func restartsRun(t *testing.T, items int, restarts string, kills int, sets ...string) (error, int, string, *syncBuf) {
	t.Helper()
	needModules(t, "grpc", "google.protobuf", "numpy", "torch")
	t.Setenv("DFLOW_PYTHON", system)
	out := t.TempDir()
	var stderr syncBuf
	h := host.New(&stderr)
	t.Cleanup(h.Close)
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	plugin, err := filepath.Abs("testdata/dflow-plugin-restarts")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Load("restarts", plugin, reg); err != nil {
		t.Fatal(err)
	}
	g, diags := (&graph.Loader{Catalog: reg, Sets: sets}).Load("restarts.hcl", []byte(fmt.Sprintf(restartsSpec, items, restarts, out, items)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(ctx, g, engine.Options{Registry: reg})
		done <- err
	}()
	paused := filepath.Join(out, "paused-1")
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	killed := 0
	for {
		select {
		case err := <-done:
			if ctx.Err() != nil {
				t.Fatalf("the run did not end within the test's deadline: %v\n%s", err, stderr.String())
			}
			return err, killed, out, &stderr
		case <-tick.C:
		}
		b, err := os.ReadFile(paused)
		if err != nil || killed == kills {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil {
			t.Fatalf("paused-1: %q", b)
		}
		os.Remove(paused)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill rank 1 (%d): %v", pid, err)
		}
		killed++
	}
}

// TestDDPRestartsWhole: under one process, three DDP ranks (gloo) of a
// Python group kind that restores, in a stage with restarts = 1, rank 1
// SIGKILLed at step 4 (after rank 0's save of step 3; ranks 0 and 2 wait
// in torch's all-reduce, which fails as it dies): the group restarts
// whole, every rank with a fresh MASTER_PORT and told to restore step 3,
// and the run ends ok with every item trained exactly once in the final
// save (the items of steps 3 and 4 came back, those before did not); the
// restart is said.
func TestDDPRestartsWhole(t *testing.T) {
	const items = 24
	err, killed, out, stderr := restartsRun(t, items, "restarts = 1", 1)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if killed != 1 {
		t.Fatalf("rank 1 was killed %d times, want once", killed)
	}
	b, err := os.ReadFile(filepath.Join(out, "final.json"))
	if err != nil {
		t.Fatal(err)
	}
	var final struct {
		Step   int
		Counts []float64
	}
	if err := json.Unmarshal(b, &final); err != nil {
		t.Fatal(err)
	}
	t.Logf("final save: step %d, counts %v", final.Step, final.Counts)
	if len(final.Counts) != items {
		t.Fatalf("%d counts, want %d", len(final.Counts), items)
	}
	for seq, n := range final.Counts {
		if n != 1 {
			t.Errorf("item %d trained %v times, want once", seq, n)
		}
	}
	var first []string
	for rank := range 3 {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("starts-%d", rank)))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(s) != 2 || !strings.HasPrefix(s[0], "restore=none ") || !strings.HasPrefix(s[1], "restore=3 ") {
			t.Errorf("rank %d's starts %q: want a first start, then a restart told to restore step 3", rank, s)
			continue
		}
		if s[0] == "restore=none "+strings.TrimPrefix(s[1], "restore=3 ") {
			t.Errorf("rank %d restarted with the same MASTER_PORT: %q", rank, s)
		}
		if first == nil {
			first = s
		} else if fmt.Sprint(s) != fmt.Sprint(first) {
			t.Errorf("rank %d's starts %q, rank 0's %q: every rank gets rank 0's port", rank, s, first)
		}
	}
	for line := range strings.Lines(stderr.String()) {
		if strings.HasPrefix(line, "dflow: ") {
			t.Log(strings.TrimSpace(line))
		}
	}
	for _, want := range []string{`dflow: stage "train": the process of rank 1 of 3 died (`,
		"and restarts whole (restart 1 of 1): every rank starts again, restoring its save of step 3; what each rank took since comes back to it"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

// TestDDPRestartsUsedUp: the same rank killed with no restarts allowed,
// and again once its stage's one restart is used, fails the run, naming
// the stage, the rank, the restarts used and its last words on stderr.
func TestDDPRestartsUsedUp(t *testing.T) {
	for _, tc := range []struct {
		name, restarts string
		kills          int
		sets           []string
		want           []string
	}{
		{"no restarts", "", 1, nil, nil},
		{"used up", "restarts = 1", 2, []string{"stage.train.config.pause_always=true"}, []string{"; its group restarted once, all that restarts = 1 allows; last stderr lines:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err, killed, _, stderr := restartsRun(t, 24, tc.restarts, tc.kills, tc.sets...)
			if err == nil || killed != tc.kills {
				t.Fatalf("killed %d times (want %d), the run's error %v\n%s", killed, tc.kills, err, stderr)
			}
			t.Log(err)
			for _, want := range append([]string{`stage "train" replica 1: plugin restarts (`, "): rank 1 of 3: the plugin process failed",
				"restarts: rank 1 waits to be killed at step 4"}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
		})
	}
}
