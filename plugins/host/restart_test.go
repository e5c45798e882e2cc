package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/zclconf/go-cty/cty"
)

// trainerCheckpoint is trainerKind's save: how many times the group has
// trained each item (by seq), as of a step.
type trainerCheckpoint struct {
	Step    int
	Trained []float32
}

// trainerKind is a group kind that restores (Sync and Moves) and trains
// "a model" that counts how many times the group has trained each item:
// each step all-reduces a vector with a 1 at each of the member's items'
// seqs. Rank 0 saves every `every` steps (out/ckpt-STEP.json, then
// Saved); each member, told to restore, loads the save of that step. The
// group's last member writes out/final.json. Each member appends its
// start to out/starts-RANK ("restore=STEP port=MASTER_PORT"). On its
// first start (on every start with pause_always), rank 1 at step
// pause_at writes its pid to out/paused-1 and waits to be killed; on its
// first start, rank 0 fails (returns an error) at step fail_at.
var trainerKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "trainer",
		Config: []graph.Field{
			{Name: "out", Type: graph.String, Required: true},
			{Name: "items", Type: graph.Int, Required: true},
			{Name: "k", Type: graph.Int, Default: cty.NumberIntVal(1)},
			{Name: "every", Type: graph.Int, Default: cty.NumberIntVal(3)},
			{Name: "pause_at", Type: graph.Int, Default: cty.NumberIntVal(-1)},
			{Name: "pause_always", Type: graph.Bool, Default: cty.False},
			{Name: "fail_at", Type: graph.Int, Default: cty.NumberIntVal(-1)},
		},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		},
	},
	Sync:  nodes.Always,
	Moves: true, // a kind that restores
	New: func(cfg *graph.Config) (nodes.Node, error) {
		out, items, k, every := cfg.String("out"), int(cfg.Int("items")), int(cfg.Int("k")), int(cfg.Int("every"))
		pauseAt, always, failAt := int(cfg.Int("pause_at")), cfg.Bool("pause_always"), int(cfg.Int("fail_at"))
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			g := r.Group()
			if err := g.Saves(ctx); err != nil {
				return err
			}
			ck := trainerCheckpoint{Step: -1, Trained: make([]float32, items)}
			restore := "none"
			var re *nodes.Restore
			switch err := g.Keep(ctx, nil); {
			case errors.As(err, &re):
				restore = fmt.Sprint(re.Step)
				if re.Step >= 0 {
					b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("ckpt-%d.json", re.Step)))
					if err != nil {
						return err
					}
					if err := json.Unmarshal(b, &ck); err != nil {
						return err
					}
				}
			case err != nil:
				return err
			}
			f, err := os.OpenFile(filepath.Join(out, fmt.Sprintf("starts-%d", r.Index())), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			fmt.Fprintf(f, "restore=%s port=%s\n", restore, os.Getenv("MASTER_PORT"))
			f.Close()
			for st, err := range sdk.Steps(ctx, r, "in", k) {
				if err != nil {
					return err
				}
				if r.Index() == 1 && st.Index == pauseAt && (restore == "none" || always) {
					fmt.Fprintf(sdk.Stderr, "trainer: rank 1 waits to be killed at step %d\n", st.Index)
					tmp := filepath.Join(out, "paused-1.tmp")
					if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
						return err
					}
					if err := os.Rename(tmp, filepath.Join(out, "paused-1")); err != nil {
						return err
					}
					<-ctx.Done()
					return ctx.Err()
				}
				if r.Index() == 0 && st.Index == failAt && restore == "none" {
					return fmt.Errorf("trainer: rank 0 fails on purpose at step %d", st.Index)
				}
				grad := make([]float32, items)
				for _, it := range st.Items {
					grad[it.(*synthetic.Blob).Seq]++
				}
				if _, err := g.AllReduceSum(ctx, grad); err != nil {
					return err
				}
				for i, v := range grad {
					ck.Trained[i] += v
				}
				ck.Step = st.Index + 1 // the steps since the first start
				if re != nil && re.Step >= 0 {
					ck.Step += re.Step
				}
				if r.Index() == 0 && (ck.Step)%every == 0 {
					b, _ := json.Marshal(ck)
					if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("ckpt-%d.json", ck.Step)), b, 0o644); err != nil {
						return err
					}
					if err := g.Saved(ctx, ck.Step); err != nil {
						return err
					}
				}
			}
			last, err := g.Finish(ctx)
			if err != nil || !last {
				return err
			}
			b, _ := json.Marshal(ck)
			return os.WriteFile(filepath.Join(out, "final.json"), b, 0o644)
		}), nil
	},
}

const trainerSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = %d
    size_bytes = 8
  }
}
stage "t" {
  node     = "tg/trainer"
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
  to   = t.in
}`

// runTrainer runs items through trainerKind's three ranks, killing rank
// 1's process (SIGKILL) each time it says it waits to be killed, kills
// times at most, and returns the run's error and the kills done.
func runTrainer(t *testing.T, f *fixture, items int, restarts string, kills int, sets ...string) (out string, killed int, err error) {
	return runTrainerWhen(t, f, items, restarts, kills, func() bool { return true }, sets...)
}

// runTrainerWhen is runTrainer, killing only once ready says so.
func runTrainerWhen(t *testing.T, f *fixture, items int, restarts string, kills int, ready func() bool, sets ...string) (out string, killed int, err error) {
	t.Helper()
	out = t.TempDir()
	l := &graph.Loader{Catalog: f.reg, Sets: sets}
	g, diags := l.Load("p.hcl", []byte(fmt.Sprintf(trainerSpec, items, restarts, out, items)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := engine.Run(ctx, g, engine.Options{Registry: f.reg})
		done <- err
	}()
	paused := filepath.Join(out, "paused-1")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return out, killed, err
		case <-tick.C:
		}
		b, err := os.ReadFile(paused)
		if err != nil || killed == kills || !ready() {
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

// rankStarts reads a rank's starts file: one line a start.
func rankStarts(t *testing.T, out string, rank int) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("starts-%d", rank)))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestGroupRestartsWhole: under one process, a group kind that restores
// (the Go SDK's Sync and Moves) whose stage allows restarts, its rank 1
// SIGKILLed after the group's save of step 3: every rank starts again
// with a fresh MASTER_PORT, told to restore step 3, the items after that
// save come back to the ranks that took them, once, and the run ends ok
// with every item trained exactly once in the final save; the restart is
// said. With k = 2 too (items taken two a step), and killed before the
// first save (restore -1: every item comes back).
func TestGroupRestartsWhole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "trainer"), f.reg); err != nil {
		t.Fatal(err)
	}
	spec, _ := f.reg.Spec("tg/trainer")
	if !spec.Restores {
		t.Fatal("tg/trainer is not registered as restoring (graph.Kind.Restores)")
	}
	for _, tc := range []struct {
		name    string
		sets    []string
		restore string // what the restarts are told
		said    string // how the restart is said
	}{
		{"k=1", nil, "3", "restoring its save of step 3; what each rank took since comes back to it"},
		{"k=2", []string{"stage.t.config.k=2"}, "3", "restoring its save of step 3"},
		{"before the first save", []string{"stage.t.config.every=100"}, "-1", "from scratch, as the group had saved nothing yet; everything each rank took comes back to it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stderr := &syncBuf{}
			f.h.SetStderr(stderr)
			const items = 40
			out, killed, err := runTrainer(t, f, items, "restarts = 2", 1, tc.sets...)
			if err != nil {
				t.Fatalf("%v\n%s", err, f.stderr.String())
			}
			if killed != 1 {
				t.Fatalf("rank 1 was killed %d times, want 1", killed)
			}
			trainedOnce(t, out)
			for rank := range 3 {
				s := rankStarts(t, out, rank)
				if len(s) != 2 || !strings.HasPrefix(s[0], "restore=none ") || !strings.HasPrefix(s[1], "restore="+tc.restore+" ") {
					t.Errorf("rank %d's starts %q: want a first start, then a restart told to restore %s", rank, s, tc.restore)
				}
				if rank > 0 && !slices.Equal(s, rankStarts(t, out, 0)) {
					t.Errorf("rank %d's starts %q, rank 0's %q: every rank gets rank 0's port", rank, s, rankStarts(t, out, 0))
				}
				if len(s) == 2 && strings.Fields(s[0])[1] == strings.Fields(s[1])[1] {
					t.Errorf("rank %d restarted with the same MASTER_PORT: %q", rank, s)
				}
			}
			for line := range strings.Lines(stderr.String()) {
				if strings.HasPrefix(line, "dflow: ") {
					t.Log(strings.TrimSpace(line))
				}
			}
			for _, want := range []string{`dflow: stage "t": the process of rank 1 of 3 died (the plugin process failed: `,
				"its group cannot go on without it, and restarts whole (restart 1 of 2): every rank starts again, " + tc.said} {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
				}
			}
		})
	}
}

// TestGroupRestartsUsedUp: a rank whose process dies with no restarts
// allowed, or with its restarts used up, fails the run, naming the stage,
// the rank, the restarts used and its last stderr lines.
func TestGroupRestartsUsedUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "trainer"), f.reg); err != nil {
		t.Fatal(err)
	}
	t.Run("no restarts", func(t *testing.T) {
		_, killed, err := runTrainer(t, f, 40, "", 1)
		if err == nil || killed != 1 {
			t.Fatalf("killed %d, err %v", killed, err)
		}
		for _, want := range []string{`stage "t" replica 1: plugin tg (`, "): rank 1 of 3: the plugin process failed", "trainer: rank 1 waits to be killed at step 4"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
		}
	})
	t.Run("used up", func(t *testing.T) {
		_, killed, err := runTrainer(t, f, 40, "restarts = 1", 2, "stage.t.config.pause_always=true")
		if err == nil || killed != 2 {
			t.Fatalf("killed %d, err %v", killed, err)
		}
		for _, want := range []string{`stage "t" replica 1: plugin tg (`, "): rank 1 of 3: the plugin process failed",
			"; its group restarted once, all that restarts = 1 allows; last stderr lines:", "trainer: rank 1 waits to be killed at step 4"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
		}
	})
}

// TestGroupRestartsNotOnItsOwnError: restarts are for a rank's process
// that dies: a rank that fails by itself (its Done carries the error)
// fails the run, with its own error, once no peer's death has explained
// it within deathGrace; the group is not restarted.
func TestGroupRestartsNotOnItsOwnError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "trainer"), f.reg); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	out, _, err := runTrainer(t, f, 40, "restarts = 2", 0, "stage.t.config.pause_at=-1", "stage.t.config.fail_at=2")
	if err == nil {
		t.Fatal("the run ended ok")
	}
	for _, want := range []string{`stage "t" replica 0: plugin tg (`, "): rank 0 of 3: trainer: rank 0 fails on purpose at step 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if took := time.Since(began); took < deathGrace {
		t.Errorf("the run failed %v after it began, before deathGrace (%v) had passed", took, deathGrace)
	}
	if s := rankStarts(t, out, 0); len(s) != 1 {
		t.Errorf("rank 0 started %d times (%q), want once: no restart", len(s), s)
	}
	if strings.Contains(f.stderr.String(), "restarts whole") {
		t.Errorf("dflow said a restart:\n%s", f.stderr.String())
	}
}

// TestRankList: how a restart names the ranks whose processes died.
func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		ranks []int
		want  string
	}{
		{[]int{1}, "rank 1"},
		{[]int{1, 2}, "ranks 1 and 2"},
		{[]int{2, 0, 1}, "ranks 2, 0 and 1"},
	} {
		if got := rankList(tc.ranks); got != tc.want {
			t.Errorf("rankList(%v) = %q, want %q", tc.ranks, got, tc.want)
		}
	}
	for n, want := range map[int]string{1: "once", 2: "twice", 3: "3 times"} {
		if got := count(n, "time"); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestGroupRestartsAfterAPeersError: a rank's collective fails when a
// peer's process dies, and dflow may hear of that first: here rank 0
// fails by itself at step 4 while rank 1 waits to be killed there, and
// rank 1 is killed only once dflow has said it waits for a death to
// explain rank 0's error. The death comes within deathGrace: the group
// restarts whole, and the run ends ok with every item trained once.
func TestGroupRestartsAfterAPeersError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	stderr := &syncBuf{}
	f.h.SetStderr(stderr)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "trainer"), f.reg); err != nil {
		t.Fatal(err)
	}
	const waits = `dflow: stage "t": rank 0 of 3 failed (trainer: rank 0 fails on purpose at step 4); waiting up to`
	out, killed, err := runTrainerWhen(t, f, 40, "restarts = 1", 1, func() bool { return strings.Contains(stderr.String(), waits) }, "stage.t.config.fail_at=4")
	if err != nil || killed != 1 {
		t.Fatalf("killed %d, err %v\n%s", killed, err, stderr.String())
	}
	trainedOnce(t, out)
	if want := "the process of rank 1 of 3 died"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
	}
}

// fakeClock records the latest account it was given.
type fakeClock struct{ idle, blocked time.Duration }

func (c *fakeClock) OwnTimes(idle, blocked time.Duration, _, _ bool) {
	c.idle, c.blocked = idle, blocked
}
func (c *fakeClock) OwnService(time.Duration, map[time.Duration]int64) {}

// TestCarriedClock: a member's own account of its time goes on over its
// group's restarts: each attempt's plugin counts from zero, and the
// attempts before are added.
func TestCarriedClock(t *testing.T) {
	fc := &fakeClock{}
	rs := &restarter{}
	a := &attempt{rs: rs}
	c := a.carry(1, &pluginClock{fc})
	c.begin()
	c.c.OwnTimes(2*time.Second, time.Second, false, false)
	if fc.idle != 2*time.Second || fc.blocked != time.Second {
		t.Fatalf("first attempt: %v idle, %v blocked", fc.idle, fc.blocked)
	}
	c = (&attempt{rs: rs}).carry(1, &pluginClock{fc})
	c.begin() // the restarted plugin's first account: nothing yet
	if fc.idle != 2*time.Second || fc.blocked != time.Second {
		t.Errorf("the restart began at %v idle, %v blocked; want the first attempt's 2s, 1s", fc.idle, fc.blocked)
	}
	c.c.OwnTimes(time.Second, 0, true, false)
	if fc.idle != 3*time.Second || fc.blocked != time.Second {
		t.Errorf("the restart's 1s idle made %v idle, %v blocked; want 3s, 1s", fc.idle, fc.blocked)
	}
	if (*attempt)(nil).carry(0, nil) != nil || a.carry(0, nil) != nil {
		t.Error("a replica its plugin does not measure got a clock")
	}
}

// trainedOnce checks the final save the trainer wrote in out: every item
// trained into it once.
func trainedOnce(t *testing.T, out string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "final.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ck trainerCheckpoint
	if err := json.Unmarshal(b, &ck); err != nil {
		t.Fatal(err)
	}
	for seq, n := range ck.Trained {
		if n != 1 {
			t.Errorf("item %d trained %v times in the final save, want once", seq, n)
		}
	}
}
