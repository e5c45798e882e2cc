package python

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/dflow-dev/dflow/report"
)

// ddpSpec: 7 items (synthetic_source's blobs, seq 0..6) into three DDP
// ranks of the tests' group kind (testdata/ddp.py), with gloo's timeout
// and the time at which a rank still running dumps its stacks and exits.
const ddpSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = 7
    size_bytes = 8
  }
}
stage "train" {
  node     = "ddp/ddp"
  replicas = 3
  config {
    out         = %q
    lockstep    = %v
    crash_at    = %d
    timeout_s   = %d
    watchdog_at = %d
  }
}
edge "a" {
  from = src.out
  to   = train.in
}`

// rankFile is what a rank of testdata/ddp.py writes at its end.
type rankFile struct {
	Rank    int
	Env     map[string]string
	Device  string
	Group   bool
	Trained int
	Sum     float64
	Params  [][]float64
	Last    bool
}

// ddpTimeout is gloo's timeout in the DDP tests (ddp.py's timeout_s):
// far longer than the ranks' rendezvous and steps take on a loaded
// machine, and well inside the tests' deadline, so that a rank left
// waiting for a peer fails the run with torch's message.
const ddpTimeout = 60 * time.Second

// ddpStacksBefore is how long before its context's deadline a DDP test's
// ranks still running write their Python stacks on stderr and exit
// (ddp.py's watchdog_at): a rank blocked where no timeout reaches it
// fails the run, saying where it was, rather than hangs it.
const ddpStacksBefore = 30 * time.Second

// ddpRun starts 7 items through three DDP ranks (lockstep or the naive
// loop) and returns the run's end on a channel, with the folder the
// ranks write to. ctx must have a deadline.
func ddpRun(t *testing.T, ctx context.Context, lockstep bool, crashAt int) (<-chan error, string, *syncBuf) {
	t.Helper()
	needModules(t, "grpc", "google.protobuf", "numpy", "torch")
	t.Setenv("DFLOW_PYTHON", system)
	// c10d's log: where rank 0's store listens and what each rank
	// connected to, in the stderr a failure shows.
	t.Setenv("TORCH_CPP_LOG_LEVEL", "INFO")
	deadline, ok := ctx.Deadline()
	if !ok {
		t.Fatal("ddpRun: ctx has no deadline")
	}
	out := t.TempDir()
	var stderr syncBuf
	h := host.New(&stderr)
	t.Cleanup(h.Close)
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	plugin, err := filepath.Abs("testdata/dflow-plugin-ddp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Load("ddp", plugin, reg); err != nil {
		t.Fatal(err)
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("ddp.hcl", []byte(fmt.Sprintf(ddpSpec, out, lockstep, crashAt,
		int(ddpTimeout/time.Second), deadline.Add(-ddpStacksBefore).Unix())))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(ctx, g, engine.Options{Registry: reg})
		done <- err
	}()
	return done, out, &stderr
}

// ddpWait is the end of a DDP run (ddpRun's), or fails the test if the run
// has not ended 30 s past ctx's deadline (the engine gives its replicas
// a few seconds after cancellation), saying where the ranks were.
func ddpWait(t *testing.T, ctx context.Context, done <-chan error, out string, stderr *syncBuf) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("the run did not end 30 s after its deadline; %s\nstderr:\n%s", ddpRanks(out), stderr)
		return nil
	}
}

// ddpRanks says what each rank of a DDP run wrote to out: the steps or
// items it began (trained-RANK) and whether it wrote its report
// (rank-RANK.json), for a failure's message.
func ddpRanks(out string) string {
	var b strings.Builder
	for i := range 3 {
		lines, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("trained-%d", i)))
		began := strings.ReplaceAll(strings.TrimSpace(string(lines)), "\n", "; ")
		if err != nil {
			began = "none: not past init_process_group and DDP's setup"
		}
		_, err = os.Stat(filepath.Join(out, fmt.Sprintf("rank-%d.json", i)))
		fmt.Fprintf(&b, "rank %d: began [%s], report written %v; ", i, began, err == nil)
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// TestDDPLockstep: three DDP ranks (gloo) of a Python group kind train on
// 7 items, one a step, and end: each rank sees torchrun's environment,
// the ranks' parameters are identical at the end, and the sum of the
// items they trained is 7 on every rank. The ranks also use dflow's
// group through the module (saves, saved, finish: one is the last).
func TestDDPLockstep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done, out, stderr := ddpRun(t, ctx, true, -1)
	if err := ddpWait(t, ctx, done, out, stderr); err != nil {
		t.Fatalf("%v\n%s\nstderr:\n%s", err, ddpRanks(out), stderr)
	}
	var ranks [3]rankFile
	port := ""
	trained := 0
	for i := range ranks {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		r := &ranks[i]
		if err := json.Unmarshal(b, r); err != nil {
			t.Fatal(err)
		}
		t.Logf("rank %d: trained %d, sum %v, params %v, env %v", i, r.Trained, r.Sum, r.Params, r.Env)
		trained += r.Trained
		if r.Sum != 7 {
			t.Errorf("rank %d: the items trained sum to %v over the group, want 7", i, r.Sum)
		}
		if fmt.Sprint(r.Params) != fmt.Sprint(ranks[0].Params) {
			t.Errorf("rank %d's parameters %v differ from rank 0's %v", i, r.Params, ranks[0].Params)
		}
		if !r.Group || r.Device != "cpu" {
			t.Errorf("rank %d: group %v, device %q; want true, cpu", i, r.Group, r.Device)
		}
		want := map[string]string{"RANK": fmt.Sprint(i), "WORLD_SIZE": "3", "LOCAL_RANK": fmt.Sprint(i),
			"LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "", "DFLOW_DEVICE": "cpu"}
		for k, v := range want {
			if got, ok := r.Env[k]; !ok || got != v {
				t.Errorf("rank %d: %s=%q, want %q", i, k, got, v)
			}
		}
		if port == "" {
			port = r.Env["MASTER_PORT"]
		} else if r.Env["MASTER_PORT"] != port {
			t.Errorf("rank %d: MASTER_PORT %s, rank 0's %s", i, r.Env["MASTER_PORT"], port)
		}
	}
	if trained != 7 {
		t.Errorf("the ranks trained %d items, want 7", trained)
	}
	if lasts := btoi(ranks[0].Last) + btoi(ranks[1].Last) + btoi(ranks[2].Last); lasts != 1 {
		t.Errorf("%d ranks were told by finish that they were the group's last, want 1", lasts)
	}
	if ranks[0].Params == nil {
		t.Error("no parameters")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDDPNaiveLoopHangs shows what the lockstep is for: the same ranks
// looping over their items (recv) hang, since a rank that has run out
// stops joining DDP's all-reduce (it waits at its final barrier) while
// another waits in its step's all-reduce. The test waits until a rank is
// at the barrier while another is not and nothing has moved for 10 s,
// the run not ended, then stops the run.
func TestDDPNaiveLoopHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 10 s for a hang")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done, out, stderr := ddpRun(t, ctx, false, -1)
	// state: what each rank has begun, as its file says
	state := func() (lines string, items, barriers int) {
		for i := range 3 {
			b, _ := os.ReadFile(filepath.Join(out, fmt.Sprintf("trained-%d", i)))
			lines += fmt.Sprintf("rank %d: %q; ", i, b)
			items += strings.Count(string(b), "item ")
			barriers += strings.Count(string(b), "barrier")
		}
		return lines, items, barriers
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last, since := "", time.Now()
	for {
		select {
		case err := <-done:
			lines, _, _ := state()
			t.Fatalf("the naive loop ended (%v); it should hang. %s\n%s", err, lines, stderr)
		case <-tick.C:
		}
		lines, items, barriers := state()
		if lines != last {
			last, since = lines, time.Now()
			continue
		}
		if barriers >= 1 && barriers < 3 && time.Since(since) >= 10*time.Second {
			t.Logf("hung: nothing moved for 10 s with %d items begun, %d of 3 ranks at the final barrier: %s", items, barriers, lines)
			break
		}
	}
	cancel()
	select {
	case err := <-done:
		t.Logf("stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not end 30 s after it was cancelled")
	}
}

// TestDDPRankDies: a rank whose process dies at a step fails the run,
// naming the stage, the rank and its last words on stderr, while the
// other ranks wait in torch's all-reduce for it: dflow stops them, and
// the run ends rather than hangs.
func TestDDPRankDies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done, out, stderr := ddpRun(t, ctx, true, 1)
	err := ddpWait(t, ctx, done, out, stderr)
	if err == nil {
		t.Fatal("the run ended ok")
	}
	if ctx.Err() != nil || strings.Contains(stderr.String(), "(most recent call first)") {
		t.Fatalf("the run hung until the test's deadline: %v\n%s\nstderr:\n%s", err, ddpRanks(out), stderr)
	}
	t.Log(err)
	for _, want := range []string{`stage "train" replica 1: plugin ddp (`, "): rank 1 of 3: the plugin process failed", "ddp: rank 1 dying on purpose at step 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestPythonSteps: the module's steps, without torch: 7 items over 3
// ranks, k at a time: every rank has the same steps, each step's total
// the same on every rank and the sum of its ranks' items, each item
// once, and all_reduce and finish through dflow's group.
func TestPythonSteps(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	t.Setenv("DFLOW_PYTHON", system)
	var stderr syncBuf
	h := host.New(&stderr)
	t.Cleanup(h.Close)
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	plugin, err := filepath.Abs("testdata/dflow-plugin-steps")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Load("steps", plugin, reg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			out := t.TempDir()
			src := fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count      = 7
    size_bytes = 8
  }
}
stage "s" {
  node     = "steps/steps"
  replicas = 3
  config {
    out = %q
    k   = %d
  }
}
edge "a" {
  from = src.out
  to   = s.in
}`, out, k)
			g, diags := (&graph.Loader{Catalog: reg}).Load("steps.hcl", []byte(src))
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := engine.Run(ctx, g, engine.Options{Registry: reg}); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			type rank struct {
				Steps   [][4]int
				Seqs    []int
				SeqSum  float64 `json:"seq_sum"`
				Members int
				Rank    string
				Last    bool
			}
			var ranks [3]rank
			seen := map[int]bool{}
			lasts := 0
			for i := range ranks {
				b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", i)))
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(b, &ranks[i]); err != nil {
					t.Fatal(err)
				}
				r := ranks[i]
				t.Logf("rank %d: steps %v, seqs %v", i, r.Steps, r.Seqs)
				if r.Rank != fmt.Sprint(i) || r.SeqSum != 21 || r.Members != 3 {
					t.Errorf("rank %d: RANK %q, all-reduced seqs %v of %d members; want %d, 21 (0+...+6), 3", i, r.Rank, r.SeqSum, r.Members, i)
				}
				for _, s := range r.Seqs {
					if seen[s] {
						t.Errorf("item %d twice", s)
					}
					seen[s] = true
				}
				if r.Last {
					lasts++
				}
			}
			if len(seen) != 7 || lasts != 1 {
				t.Errorf("%d items seen (want 7), %d ranks last (want 1)", len(seen), lasts)
			}
			sum := 0
			for s := range ranks[0].Steps {
				total, items := ranks[0].Steps[s][2], 0
				for i, r := range ranks {
					if len(r.Steps) != len(ranks[0].Steps) {
						t.Fatalf("rank %d took %d steps, rank 0 %d", i, len(r.Steps), len(ranks[0].Steps))
					}
					st := r.Steps[s]
					if st[0] != s || st[1] > k || st[2] != total || st[3] != 3 {
						t.Errorf("rank %d step %d: [index items total members] %v; total %d on rank 0, k %d", i, s, st, total, k)
					}
					items += st[1]
				}
				if items != total {
					t.Errorf("step %d: %d items, total %d", s, items, total)
				}
				sum += total
			}
			if sum != 7 {
				t.Errorf("the steps' totals sum to %d, want 7", sum)
			}
		})
	}
}

// stepsWaitSpec: 24 items from a source taking service_time each into
// three ranks of the steps kind, each step computing compute_ms.
const stepsWaitSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count        = 24
    size_bytes   = 8
    service_time = %q
  }
}
stage "s" {
  node     = "steps/steps"
  replicas = 3
  config {
    out        = %q
    compute_ms = %d
  }
}
edge "a" {
  from = src.out
  to   = s.in
}`

// TestStepsDataWait: the module's steps measure each step's wait for
// data and its compute, as node metrics (data_wait_seconds and
// compute_seconds, summed over the ranks). Behind a slow source (100ms an
// item, the ranks computing nothing) the wait is most of each step and
// the diagnosis says the source is the bottleneck; behind a fast one
// (the ranks computing 200ms a step) it is a small share, and the
// diagnosis does not say so.
func TestStepsDataWait(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	t.Setenv("DFLOW_PYTHON", system)
	var stderr syncBuf
	h := host.New(&stderr)
	t.Cleanup(h.Close)
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	plugin, err := filepath.Abs("testdata/dflow-plugin-steps")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Load("steps", plugin, reg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, source string
		compute      int
		slow         bool
	}{
		{"slow source", "100ms", 0, true},
		{"slow compute", "0s", 200, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, diags := (&graph.Loader{Catalog: reg}).Load("steps.hcl", []byte(fmt.Sprintf(stepsWaitSpec, c.source, t.TempDir(), c.compute)))
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rep, err := engine.Run(ctx, g, engine.Options{Registry: reg})
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			m := rep.Stages["s"].Metrics
			share, ok := rep.Stages["s"].DataWaitShare()
			t.Logf("data wait %.3fs, compute %.3fs: %.0f%% waiting", m[report.DataWait], m[report.Compute], 100*share)
			if !ok || m[report.DataWait] <= 0 {
				t.Fatalf("no data wait and compute measured: metrics %v", m)
			}
			if c.slow && share < 0.6 || !c.slow && share > 0.4 {
				t.Errorf("waiting %.0f%% of each step for data; want more than 60%% behind the slow source, less than 40%% behind the fast one", 100*share)
			}
			diag := strings.Join(monitor.Diagnose(g, rep, nil), "\n")
			said := strings.Contains(diag, "s waits ") && strings.Contains(diag, "of each step for data") && strings.Contains(diag, "stage src is the bottleneck")
			if said != c.slow {
				t.Errorf("the diagnosis says the source is the bottleneck: %v, want %v:\n%s", said, c.slow, diag)
			}
		})
	}
}
