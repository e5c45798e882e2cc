package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/report"
)

// TestRunRebalanceFlag: --rebalance on a spec without a rebalance block
// shares a budget between the stages that carry the work and can move
// (the seed with hs shared: target and drafter, not the sink that costs
// nothing), and says why when no two can (hs round_robin).
func TestRunRebalanceFlag(t *testing.T) {
	code, _, stderr := dflow(t, "run", "../../specs/seed.hcl", "--rebalance", "--interval", "0", "--var", "items=20")
	if code != exitFailed || !strings.Contains(stderr, `dflow run: --rebalance: no two stages of ../../specs/seed.hcl can move replicas between them`) ||
		!strings.Contains(stderr, `edge "hs" into stage "drafter" is round_robin`) || !strings.Contains(stderr, "--set edge.NAME.policy=shared") {
		t.Errorf("round_robin: code %d\n%s", code, stderr)
	}
	code, _, stderr = dflow(t, "run", "../../specs/seed.hcl", "--rebalance", "--set", "edge.hs.policy=shared", "--interval", "0", "--var", "items=20")
	if code != exitOK || !strings.Contains(stderr, "dflow: rebalance: target and drafter share 8 replicas (now 5+3); looks every 10s") ||
		strings.Contains(stderr, "keeps its split") {
		t.Errorf("shared: code %d\n%s", code, stderr)
	}
}

// TestRunRebalanceLive: a run with a rebalance block moves replicas while
// it goes: from 1 target and 7 drafters (stateless here) it moves four
// drafters to the targets at its first look (three, on a loaded machine), says so, lists the move in
// the report, and every item is counted once (the run ends ok only if
// its books balance).
func TestRunRebalanceLive(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "live.hcl")
	src := liveSpec
	if err := os.WriteFile(spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.json")
	code, stdout, stderr := dflow(t, "run", spec, "--interval", "200ms", "--report", out, "--plot", filepath.Join(dir, "p.png"))
	// The best split is 5+3; the fits of a loaded machine's first figures
	// may rank 4+4 first (3 moved).
	said := regexp.MustCompile(`moved ([34]) replicas drafter -> target: target 100% busy`).FindStringSubmatch(stderr)
	if code != exitOK || said == nil {
		t.Fatalf("code %d\n%s\n%s", code, stdout, stderr)
	}
	moved, _ := strconv.Atoi(said[1])
	rep, err := report.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != report.OK || len(rep.Moves) != 1 || rep.Moves[0].Replicas != moved || rep.Edges["trained"].Consumed != 300 ||
		len(rep.Stages["target"].Replicas) != 1+moved || len(rep.Stages["drafter"].Replicas) != 7 {
		t.Errorf("report: status %s, moves %+v, %d items at the sink, %d targets, %d drafters",
			rep.Status, rep.Moves, rep.Edges["trained"].Consumed, len(rep.Stages["target"].Replicas), len(rep.Stages["drafter"].Replicas))
	}
	if len(rep.Diagnosis) != 1 || !strings.Contains(rep.Diagnosis[0], "the rebalance moved 4 replicas drafter -> target") ||
		!strings.Contains(rep.Diagnosis[0], ", measured +") {
		t.Errorf("diagnosis %q", rep.Diagnosis)
	}
	// 20 items/s before the move, up to 100 after: a load that stretches
	// the sleeps lowers both.
	if g := rep.Moves[0].MeasuredGain; g == nil || *g < 0.3 {
		t.Errorf("measured gain %v, want well above 0", g)
	}
}

// TestSimRebalance: dflow sim --rebalance simulates the policy: from the
// seed's worst split (1+7, hs shared) it moves drafters to the targets at
// its first look and says so, and the report lists the move; on
// specs/moving.hcl it moves targets to the drafters after the costs
// change. --split and --rebalance together are a usage error.
func TestSimRebalance(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr := dflow(t, "sim", "../../specs/seed.hcl", "--rebalance", "--set", "edge.hs.policy=shared", "--set", "stage.target.replicas=1",
		"--set", "stage.drafter.replicas=7", "--var", "items=1000", "--interval", "0", "--report", out)
	if code != exitOK || !strings.Contains(stderr, "moved 4 replicas drafter -> target: target 100% busy, drafter ") {
		t.Fatalf("seed 1+7: code %d\n%s", code, stderr)
	}
	rep, err := report.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Moves) != 1 || rep.Moves[0].From != "drafter" || rep.Moves[0].To != "target" || rep.Moves[0].Replicas != 4 ||
		len(rep.Diagnosis) != 1 || !strings.Contains(rep.Diagnosis[0], "the rebalance moved 4 replicas drafter -> target") {
		t.Errorf("report: moves %+v, diagnosis %q", rep.Moves, rep.Diagnosis)
	}
	// A spec's rebalance block is simulated without the flag, and
	// --rebalance=false keeps the spec's split.
	code, _, stderr = dflow(t, "sim", "../../specs/moving.hcl", "--interval", "0")
	if code != exitOK || !strings.Contains(stderr, "target -> drafter") {
		t.Errorf("moving.hcl: code %d\n%s", code, stderr)
	}
	code, stdout, stderr := dflow(t, "sim", "../../specs/moving.hcl", "--interval", "0", "--rebalance=false")
	if code != exitOK || strings.Contains(stderr, "moved") || !strings.Contains(stderr, "dflow: rebalance: off (--rebalance=false)") ||
		!strings.Contains(stdout, "simulation ok: 15.04s") {
		t.Errorf("moving.hcl --rebalance=false: code %d\n%s%s", code, stdout, stderr)
	}
	code, _, stderr = dflow(t, "run", "../../specs/moving.hcl", "--interval", "0", "--rebalance=false", "--var", "items=40")
	if code != exitOK || strings.Contains(stderr, "moved") || !strings.Contains(stderr, "dflow: rebalance: off (--rebalance=false)") {
		t.Errorf("run moving.hcl --rebalance=false: code %d\n%s", code, stderr)
	}
	if code, _, stderr := dflow(t, "sim", "../../specs/moving.hcl", "--rebalance", "--split", "target,drafter=8"); code != exitUsage ||
		!strings.Contains(stderr, "give one of them") {
		t.Errorf("--split with --rebalance: code %d\n%s", code, stderr)
	}
}

// liveSpec is the rebalance tests' pipeline: 1 target and 7 drafters,
// stateless, the targets the bottleneck until four drafters move to them.
const liveSpec = `stage "reader" {
  node = "synthetic_source"
  config {
    count = 300
  }
}
stage "target" {
  node = "synthetic_work"
  config {
    service_time = "50ms"
  }
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 7
  config {
    service_time = "25ms"
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from = reader.out
  to   = target.in
}
edge "hs" {
  from = target.out
  to   = drafter.in
}
edge "trained" {
  from = drafter.out
  to   = done.in
}
rebalance {
  stages = ["target", "drafter"]
}
`

// TestRebalanceAcrossHosts: the same run over two worker processes moves
// four drafters to the targets at its first look, each new target on the
// worker whose drafter left (its freed device; 3 or 4 drafters move, as
// the first figures rank 5+3 or 4+4), and every item is
// counted once: the run ends ok only if its books balance across the
// workers. The spare slots that did not start are left out of the report.
func TestRebalanceAcrossHosts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "live.hcl")
	if err := os.WriteFile(spec, []byte(liveSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.json")
	coord := startDflow(t, nil, "run", spec, "--local-cluster", "2", "--interval", "200ms", "--report", out)
	code := coord.wait(t, 120*time.Second)
	log := coord.output()
	// 4 (5+3, the best split), or 3 where a loaded machine's first
	// figures rank 4+4 first, as in one process (TestRunRebalanceLive)
	said := regexp.MustCompile(`moved ([34]) replicas drafter -> target: target `).FindStringSubmatch(log)
	if code != exitOK || said == nil {
		t.Fatalf("code %d\n%s", code, log)
	}
	n, _ := strconv.Atoi(said[1])
	rep := readReport(t, out)
	wantEdges(t, rep, 300)
	if rep.Status != report.OK || len(rep.Moves) != 1 || rep.Moves[0].Replicas != n ||
		len(rep.Stages["target"].Replicas) != 1+n || len(rep.Stages["drafter"].Replicas) != 7 {
		t.Errorf("report: status %s, moves %+v, %d targets, %d drafters", rep.Status, rep.Moves,
			len(rep.Stages["target"].Replicas), len(rep.Stages["drafter"].Replicas))
	}
	// Each worker says which drafter left and which target took its
	// device; the target runs where the drafter did.
	moved := regexp.MustCompile(`dflow worker (\S+): run \S+: drafter\[(\d+)\] leaves after its item in hand, and target\[(\d+)\] starts on its device`)
	ms := moved.FindAllStringSubmatch(log, -1)
	if len(ms) != n {
		t.Fatalf("%d moves said by the workers, want %d:\n%s", len(ms), n, log)
	}
	where := map[string]map[int]string{}
	for _, st := range []string{"target", "drafter"} {
		where[st] = map[int]string{}
		for _, r := range rep.Stages[st].Replicas {
			where[st][r.Index] = r.Worker
		}
	}
	for _, m := range ms {
		d, _ := strconv.Atoi(m[2])
		tg, _ := strconv.Atoi(m[3])
		if where["target"][tg] != m[1] || where["drafter"][d] != m[1] {
			t.Errorf("drafter %d on %s left for target %d on %s, said by worker %s", d, where["drafter"][d], tg, where["target"][tg], m[1])
		}
		for _, r := range rep.Stages["target"].Replicas {
			if r.Index == tg && r.ItemsIn == 0 {
				t.Errorf("target %d started on %s and took nothing", tg, m[1])
			}
		}
	}
}

// TestRebalanceWorkerLost: a worker that a move gave a new target is
// SIGKILLed after the move; its replicas restart on the others (the
// target that started there among them, and its spare slots still
// parked), and every item is counted once: ok, 300 through every edge.
func TestRebalanceWorkerLost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "live.hcl")
	if err := os.WriteFile(spec, []byte(strings.Replace(liveSpec, "count = 300", "count = 400", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t)
	ws := workers(t, srv.URL, srv.Token, 3)
	out := filepath.Join(dir, "r.json")
	coord := startDflow(t, nil, "run", spec, "--cluster", srv.URL, "--token", srv.Token, "--workers", "3",
		"--lease", "2s", "--interval", "200ms", "--report", out)
	var victim *proc
	for deadline := time.Now().Add(60 * time.Second); victim == nil; time.Sleep(20 * time.Millisecond) {
		for _, w := range ws {
			if strings.Contains(w.output(), "starts on its device") {
				victim = w
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no move within 60s:\n%s", coord.output())
		}
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	if code := coord.wait(t, 120*time.Second); code != exitOK {
		t.Fatalf("code %d\n%s", code, coord.output())
	}
	rep := readReport(t, out)
	if rep.Status != report.OK {
		t.Fatalf("status %s: %s", rep.Status, rep.Error)
	}
	wantEdges(t, rep, 400)
	if !strings.Contains(coord.output(), "lost") {
		t.Errorf("no worker counted lost:\n%s", coord.output())
	}
}

// TestRebalanceKeepsOnePerWorker: with one drafter on each of two
// workers, no drafter moves to the targets, however busy they are: a
// worker's side of the drafters' input holds what it fetched for its
// drafter, and a parked slot would not read it. The run ends ok, every
// item once.
func TestRebalanceKeepsOnePerWorker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "two.hcl")
	two := strings.Replace(strings.Replace(liveSpec, "replicas = 7", "replicas = 2", 1), "count = 300", "count = 100", 1)
	if err := os.WriteFile(spec, []byte(two), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.json")
	coord := startDflow(t, nil, "run", spec, "--local-cluster", "2", "--interval", "200ms", "--report", out)
	if code := coord.wait(t, 120*time.Second); code != exitOK {
		t.Fatalf("code %d\n%s", code, coord.output())
	}
	rep := readReport(t, out)
	wantEdges(t, rep, 100)
	if rep.Status != report.OK || len(rep.Moves) != 0 || len(rep.Stages["drafter"].Replicas) != 2 {
		t.Errorf("report: status %s, moves %+v, %d drafters", rep.Status, rep.Moves, len(rep.Stages["drafter"].Replicas))
	}
}

// TestRebalanceFlagAcrossHosts: --rebalance on a spec without the block
// moves replicas across hosts as the block does (the workers load the
// spec without it: their graphs take the rebalanced stages from the spare
// slots, which stay parked until a move starts one).
func TestRebalanceFlagAcrossHosts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "flag.hcl")
	src := liveSpec[:strings.Index(liveSpec, "rebalance {")]
	if err := os.WriteFile(spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.json")
	coord := startDflow(t, nil, "run", spec, "--rebalance", "--local-cluster", "2", "--interval", "200ms", "--report", out)
	if code := coord.wait(t, 120*time.Second); code != exitOK {
		t.Fatalf("code %d\n%s", code, coord.output())
	}
	rep := readReport(t, out)
	wantEdges(t, rep, 300)
	if rep.Status != report.OK || len(rep.Moves) == 0 || len(rep.Stages["target"].Replicas) != 1+rep.Moves[0].Replicas {
		t.Errorf("report: status %s, moves %+v, %d targets\n%s", rep.Status, rep.Moves, len(rep.Stages["target"].Replicas), coord.output())
	}
}

// TestRebalanceGroupsAcrossHosts: groups move across hosts too, from 1
// target and 7 drafters over two worker processes. The seed's drafters
// step together (synthetic, stateless): members leave the group at a
// step boundary and the targets that start take items, every item once.
// The DFlash job's drafters train (drafter_train, whose state moves):
// its checkpoint counts every batch once across the changes of the
// group's size.
func TestRebalanceGroupsAcrossHosts(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	split := []string{"--rebalance", "--set", "edge.hs.policy=shared", "--set", "stage.target.replicas=1", "--set", "stage.drafter.replicas=7",
		"--local-cluster", "2", "--interval", "500ms"}
	// The DFlash job runs as the README installs dflow (its workers'
	// arithmetic under -race would take minutes on two cores).
	run := func(t *testing.T, items int, asInstalled bool, args ...string) *report.Report {
		t.Helper()
		out := filepath.Join(t.TempDir(), "r.json")
		args = append(append(args, split...), "--report", out)
		cmd := dflowCmd(nil, args...)
		if asInstalled {
			cmd = exec.Command(installed(t), args...)
		}
		cmd.Dir = root
		coord := startProc(t, cmd)
		if code := coord.wait(t, 240*time.Second); code != exitOK {
			t.Fatalf("code %d\n%s", code, coord.output())
		}
		rep := readReport(t, out)
		wantEdges(t, rep, int64(items))
		if rep.Status != report.OK || len(rep.Moves) == 0 {
			t.Fatalf("status %s, moves %+v\n%s", rep.Status, rep.Moves, coord.output())
		}
		started := 0
		for _, r := range rep.Stages["target"].Replicas {
			if r.Index > 0 && r.ItemsIn > 0 {
				started++
			}
		}
		if started == 0 {
			t.Errorf("no target that a move started took an item: %+v", rep.Stages["target"].Replicas)
		}
		return rep
	}
	t.Run("seed", func(t *testing.T) {
		run(t, 300, false, "run", "specs/seed.hcl", "--var", "items=300")
	})
	t.Run("dflash", func(t *testing.T) {
		if testing.Short() {
			t.Skip("trains a drafter on two workers")
		}
		const batches = 150
		ckpt := filepath.Join(t.TempDir(), "drafter.safetensors")
		rep := run(t, batches, true, "run", "specs/dflash.hcl", "--var", "batches="+strconv.Itoa(batches), "--var", "checkpoint="+ckpt,
			"--set", "stage.drafter.config.eval_prompts=4")
		if got, m := checkpointBatches(t, ckpt), rep.Stages["drafter"].Metrics; got != strconv.Itoa(batches) || m["batches"] != batches {
			t.Errorf("checkpoint: %s batches, the run's metrics %v; want %d, each once", got, m["batches"], batches)
		}
	})
}

// checkpointBatches is the batches a drafter checkpoint says it holds
// the gradients of (its safetensors metadata).
func checkpointBatches(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 8 {
		t.Fatalf("checkpoint: %v", err)
	}
	n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16 | int(b[3])<<24
	var header struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	return header.Meta["batches"]
}

// TestRebalanceGroupWorkerLost: the DFlash job from 1 target and 5
// drafters over three standing workers, saving every 5 steps; the worker
// where a move first let a drafter leave (to start a target on its
// device) is SIGKILLed a moment later, with the drafter that left waiting
// for the group's final save (what it trained since the last save is
// unsettled, and comes back to the other drafters, which drop it) and the
// target that took its device running. The run ends ok, and the
// checkpoint holds the gradients of every batch once.
func TestRebalanceGroupWorkerLost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("trains a drafter on three workers")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const batches = 120
	model := filepath.Join(root, "models/target.safetensors") // the workers run elsewhere
	ckpt := filepath.Join(dir, "drafter.safetensors")
	out := filepath.Join(dir, "r.json")
	srv := startServer(t)
	ws := workers(t, srv.URL, srv.Token, 3, "--read", root, "--write", dir)
	cmd := dflowCmd(nil, "run", "specs/dflash.hcl", "--cluster", srv.URL, "--token", srv.Token, "--workers", "3",
		"--lease", "2s", "--interval", "500ms", "--report", out, "--rebalance",
		"--set", "edge.hs.policy=shared", "--set", "stage.target.replicas=1", "--set", "stage.drafter.replicas=5",
		"--set", "stage.drafter.config.checkpoint_every=5", "--set", "stage.drafter.config.eval_every=0",
		"--set", "stage.drafter.config.eval_prompts=4",
		"--set", "stage.target.config.model="+model, "--set", "stage.drafter.config.target="+model,
		"--var", "batches="+strconv.Itoa(batches), "--var", "checkpoint="+ckpt)
	cmd.Dir = root
	coord := startProc(t, cmd)
	var victim *proc
	for deadline := time.Now().Add(120 * time.Second); victim == nil; time.Sleep(20 * time.Millisecond) {
		for _, w := range ws {
			if strings.Contains(w.output(), "drafter[") && strings.Contains(w.output(), "starts on its device") {
				victim = w
				break
			}
		}
		select {
		case <-coord.waited:
			t.Fatalf("the run ended before a move:\n%s", coord.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no move within 120s:\n%s", coord.output())
		}
	}
	time.Sleep(time.Second) // the drafter leaves after its step, and waits for the final save
	victim.cmd.Process.Signal(syscall.SIGKILL)
	lived := func() string {
		var logs strings.Builder
		for _, w := range ws {
			if w != victim {
				logs.WriteString(w.output())
			}
		}
		return logs.String()
	}
	if code := coord.wait(t, 240*time.Second); code != exitOK {
		t.Fatalf("code %d\n%s\nthe workers that lived:\n%s", code, coord.output(), lived())
	}
	rep := readReport(t, out)
	if rep.Status != report.OK {
		t.Fatalf("status %s: %s", rep.Status, rep.Error)
	}
	wantEdges(t, rep, batches)
	if !strings.Contains(coord.output(), "lost") {
		t.Errorf("no worker counted lost:\n%s", coord.output())
	}
	if got := checkpointBatches(t, ckpt); got != strconv.Itoa(batches) {
		t.Errorf("checkpoint: %s batches; want %d, each once\n%s\nthe workers that lived:\n%s", got, batches, coord.output(), lived())
	}
}
