package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// TestMain lets the test binary act as dflow itself (DFLOW_AS_MAIN=1), so
// signal tests run a real process without a separate build step. Every
// process this binary starts of itself is such a dflow (the workers
// --local-cluster starts, the processes the tests start), so the variable
// is set once for the whole process: no test sets it with t.Setenv,
// which would keep it from running in parallel.
func TestMain(m *testing.M) {
	if os.Getenv("DFLOW_AS_MAIN") == "1" {
		main()
		return
	}
	os.Setenv("DFLOW_AS_MAIN", "1")
	testutil.RaceExitAtOnce()
	// Most of these tests wait, on worker processes, leases and drains,
	// more than they compute: 4 at a time even on 2 cores.
	testutil.WaitingTests(4)
	var err error
	if repoRoot, err = filepath.Abs("../.."); err != nil {
		panic(err)
	}
	testutil.Main(m)
}

// repoRoot is the repository's root, absolute.
var repoRoot string

func readReport(t *testing.T, path string) *report.Report {
	t.Helper()
	rep, err := report.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestRunOK(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "r.json")
	code, stdout, stderr := dflow(t, "run", "../../specs/fan.hcl", "--report", out)
	if code != exitOK || !strings.HasPrefix(stdout, "run ok in ") {
		t.Fatalf("code %d\n%s%s", code, stdout, stderr)
	}
	// The summary, on stdout, follows the spec's order and shows each
	// queue's depth; stderr has what the run said as it went, and no
	// line of the summary.
	if !strings.Contains(stdout, "edge  to_wide    round_robin produced=200 consumed=200 mean depth=[") ||
		strings.Index(stdout, "stage source") > strings.Index(stdout, "stage sink") {
		t.Errorf("summary:\n%s", stdout)
	}
	if !strings.HasPrefix(stderr, "dflow: running ../../specs/fan.hcl: ") || strings.Contains(stderr, "run ok") || strings.Contains(stderr, "edge  to_wide") {
		t.Errorf("stderr:\n%s", stderr)
	}
	rep := readReport(t, out)
	if rep.Status != report.OK || rep.Spec != "../../specs/fan.hcl" || len(rep.Stages) != 4 {
		t.Fatalf("report: %+v", rep)
	}
	for name, e := range rep.Edges {
		if e.Produced != e.Consumed || e.Produced != 200 {
			t.Errorf("edge %s: produced %d consumed %d, want 200", name, e.Produced, e.Consumed)
		}
	}
	if got := rep.Stages["sink"].Replicas[0].ItemsIn; got != 400 {
		t.Errorf("sink got %d items, want 400 (fan-out then fan-in)", got)
	}
	// The report's raw JSON has the documented keys (docs/runtime.md).
	raw, _ := os.ReadFile(out)
	for _, key := range []string{`"wall_seconds"`, `"busy_seconds"`, `"service_seconds"`, `"mean_depth"`, `"simulated": false`} {
		if !bytes.Contains(raw, []byte(key)) {
			t.Errorf("report lacks %s", key)
		}
	}
}

func TestRunFailure(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr := dflow(t, "run", "../../specs/fan.hcl", "--set", "stage.wide.config.fail_after=3", "--report", out)
	if code != exitFailed || !strings.Contains(stderr, `stage "wide" replica`) || !strings.Contains(stderr, "injected failure after 3 items") {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	if rep := readReport(t, out); rep.Status != report.Failed || !strings.Contains(rep.Error, "injected failure") {
		t.Errorf("report status %s error %q", rep.Status, rep.Error)
	}
	if code, _, _ := dflow(t, "run", "../../graph/testdata/validate/cycle.hcl"); code != exitFailed {
		t.Errorf("invalid spec: code %d", code)
	}
}

// TestRunDrainInProcess: an interrupt drains; exit 130, the report says
// interrupted and every edge balances.
func TestRunDrainInProcess(t *testing.T) {
	t.Parallel()
	sig := make(chan os.Signal, 1)
	sig <- os.Interrupt
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, registry: nodes.Default.Clone(), signals: sig}
	out := filepath.Join(t.TempDir(), "r.json")
	code := e.main([]string{"run", "../../specs/seed.hcl", "--var", "items=100000", "--report", out})
	if code != exitInterrupted {
		t.Fatalf("code %d\n%s", code, stderr.String())
	}
	rep := readReport(t, out)
	if rep.Status != report.Interrupted {
		t.Errorf("status %s", rep.Status)
	}
	for name, ed := range rep.Edges {
		if ed.Produced != ed.Consumed {
			t.Errorf("edge %s: produced %d consumed %d", name, ed.Produced, ed.Consumed)
		}
	}
}

// TestRunSignals runs dflow as a real process: one SIGINT drains (exit
// 130, balanced report); two abort (exit 130 at once).
func TestRunSignals(t *testing.T) {
	t.Parallel()
	for _, signals := range []int{1, 2} {
		t.Run(map[int]string{1: "drain", 2: "abort"}[signals], func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "r.json")
			args := []string{"run", "../../specs/seed.hcl", "--var", "items=100000", "--report", out}
			if signals == 2 {
				// a drain that takes seconds, so the second Ctrl-C falls in
				// it on a loaded machine too: the drafters' step in hand
				// alone takes 2s (with 400ms the drain finished first in a
				// full race run, the first Ctrl-C come as the run began,
				// with little in flight)
				args = append(args, "--set", "stage.drafter.config.service_time=2s")
			}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "DFLOW_AS_MAIN=1")
			var stdout, stderr testutil.SyncBuffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if !testutil.Within(20*time.Second, func() bool { return strings.Contains(stderr.String(), "dflow: running") }) {
				cmd.Process.Kill()
				t.Fatalf("never started:\n%s", stderr.String())
			}
			for i := 0; i < signals; i++ {
				cmd.Process.Signal(syscall.SIGINT)
				if i == 0 && signals == 2 && !testutil.Within(20*time.Second, func() bool { return strings.Contains(stderr.String(), "draining") }) {
					cmd.Process.Kill()
					t.Fatalf("never drained:\n%s", stderr.String())
				}
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("did not exit:\n%s", stderr.String())
			}
			if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
				t.Fatalf("exit %d\n%s", code, stderr.String())
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("no report: %v\n%s", err, stderr.String())
			}
			var rep report.Report
			json.Unmarshal(raw, &rep)
			if want := map[int]string{1: report.Interrupted, 2: report.Aborted}[signals]; rep.Status != want {
				t.Errorf("status %q, want %q", rep.Status, want)
			}
			unequal := false
			for _, ed := range rep.Edges {
				unequal = unequal || ed.Produced != ed.Consumed
			}
			if signals == 2 && unequal && !strings.Contains(stdout.String(), "the abort stopped the run with") {
				t.Errorf("abort: unequal counts not explained in the summary:\n%s%s", stdout.String(), stderr.String())
			}
			if signals == 1 {
				for name, ed := range rep.Edges {
					if ed.Produced != ed.Consumed {
						t.Errorf("drain: edge %s produced %d consumed %d", name, ed.Produced, ed.Consumed)
					}
				}
			}
		})
	}
}

// TestRunMonitoring: status lines follow the spec, the report has a
// series, --plot and `dflow plot` draw it, bad monitoring flags fail
// clearly.
func TestRunMonitoring(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rj, png := filepath.Join(dir, "r.json"), filepath.Join(dir, "run.png")
	code, _, stderr := dflow(t, "run", "../../specs/fan.hcl", "--interval", "50ms", "--report", rj, "--plot", png)
	if code != exitOK {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "q_to_narrow=") || !strings.Contains(stderr, "q_to_wide=[") || !strings.Contains(stderr, "wide busy=[") {
		t.Errorf("status lines:\n%s", stderr)
	}
	rep := readReport(t, rj)
	if len(rep.Series) == 0 || len(rep.Series[0].Queues["to_wide"]) != 4 || rep.Diagnosis == nil {
		t.Errorf("series %d points, diagnosis %v", len(rep.Series), rep.Diagnosis)
	}
	if fi, err := os.Stat(png); err != nil || fi.Size() < 1000 {
		t.Errorf("--plot: %v", err)
	}
	png2 := filepath.Join(dir, "again.png")
	if code, stdout, stderr := dflow(t, "plot", rj, "-o", png2); code != 0 || !strings.Contains(stdout, "again.png") {
		t.Errorf("dflow plot: code %d %s", code, stderr)
	}
	if code, _, stderr := dflow(t, "plot", filepath.Join(dir, "none.json"), "-o", png2); code != exitFailed || !strings.Contains(stderr, "none.json") {
		t.Errorf("plot of a missing report: code %d %s", code, stderr)
	}
	if code, _, _ := dflow(t, "plot", rj); code != exitUsage {
		t.Errorf("plot without -o: code %d", code)
	}
	if code, _, stderr := dflow(t, "run", "../../specs/fan.hcl", "--metrics-addr", "nonsense"); code != exitFailed || !strings.Contains(stderr, `metrics address "nonsense"`) {
		t.Errorf("bad --metrics-addr: code %d %s", code, stderr)
	}
	// With --interval 0 there are no status lines and no series.
	code, _, stderr = dflow(t, "run", "../../specs/fan.hcl", "--interval", "0", "--report", rj)
	if code != 0 || strings.Contains(stderr, "q_to_wide=") || len(readReport(t, rj).Series) != 0 {
		t.Errorf("--interval 0: code %d\n%s", code, stderr)
	}
}

// TestSimFromOverrides: sim --from simulates the spec with the overrides
// of the run that measured the report (its 60 items, not the spec's 20),
// under the command line's own (a --var given wins); the same for
// compare --sim --from; a report of another spec lends its service
// times but not its overrides, and says so.
func TestSimFromOverrides(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := "variable \"n\" {\n  default = 20\n}\n" + strings.Replace(oneEdge, "count = 20", "count = var.n", 1)
	spec := writeSpec(t, src)
	measured := filepath.Join(dir, "run.json")
	if code, _, stderr := dflow(t, "run", spec, "--var", "n=60", "--set", "edge.e.capacity=3", "--report", measured, "--interval", "0"); code != exitOK {
		t.Fatalf("run: code %d\n%s", code, stderr)
	}
	simulated := filepath.Join(dir, "sim.json")
	for _, c := range []struct {
		spec  string
		flags []string
		items int64
		says  string
	}{
		{spec, nil, 60, "dflow sim: the spec as the run of " + measured + " had it: --var n=60 --set edge.e.capacity=3 (this command's flags on top)\n"},
		{spec, []string{"--var", "n=7"}, 7, "--var n=60 --set edge.e.capacity=3"},
		{writeSpec(t, src), nil, 20, "is a report of " + spec + ", not of "},
	} {
		args := append([]string{"sim", c.spec, "--from", measured, "--report", simulated, "--interval", "0"}, c.flags...)
		code, stdout, stderr := dflow(t, args...)
		if code != exitOK || !strings.Contains(stderr, c.says) || !strings.HasPrefix(stdout, "simulation ok") {
			t.Fatalf("%v: code %d, want %q\n%s%s", args, code, c.says, stdout, stderr)
		}
		rep := readReport(t, simulated)
		if got := rep.Edges["e"].Consumed; got != c.items {
			t.Errorf("%v: simulated %d items, want %d", args, got, c.items)
		}
		if c.items == 60 && (rep.Edges["e"].Capacity != 3 || rep.Overrides.Vars["n"] != "60" || len(rep.Overrides.Sets) != 1) {
			t.Errorf("%v: capacity %d, overrides %+v; want the run's", args, rep.Edges["e"].Capacity, rep.Overrides)
		}
	}
	code, stdout, stderr := dflow(t, "compare", spec, "--edge", "e", "--sim", "--from", measured)
	if code != exitOK || !strings.Contains(stderr, "dflow compare: the spec as the run of "+measured+" had it: --var n=60") || !strings.Contains(stdout, "(simulated)") {
		t.Errorf("compare --sim --from: code %d\n%s%s", code, stdout, stderr)
	}
}

// TestSimAndCompare: sim writes a simulated report; --from replays a real
// report; --split ranks splits; compare prints a table, JSON and a chart.
func TestSimAndCompare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rj := filepath.Join(dir, "sim.json")
	code, stdout, stderr := dflow(t, "sim", "../../specs/seed.hcl", "--report", rj, "--interval", "1s")
	if code != 0 || !strings.HasPrefix(stdout, "simulation ok") || !strings.Contains(stderr, "q_hs=[8 8 0]") || strings.Contains(stdout, "q_hs=") {
		t.Fatalf("sim: code %d, the summary on stdout, the status lines on stderr\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, `policy = "shared" balances it (simulated: 1.6`) {
		t.Errorf("diagnosis lacks the predicted gain:\n%s", stdout)
	}
	rep := readReport(t, rj)
	if !rep.Simulated || rep.Edges["hs"].Consumed != 300 || len(rep.Series) < 4 {
		t.Errorf("simulated report: %+v", rep.Edges["hs"])
	}
	// Replay the simulated report's service times under shared.
	code, stdout, stderr = dflow(t, "sim", "../../specs/seed.hcl", "--from", rj, "--set", "edge.hs.policy=shared", "--interval", "0")
	if code != 0 || !strings.Contains(stdout, "simulation ok: 3.") {
		t.Errorf("sim --from: code %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = dflow(t, "sim", "../../specs/seed.hcl", "--split", "target,drafter=8")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 0 || len(lines) != 9 || !strings.HasPrefix(lines[2], "1 ") {
		t.Fatalf("split: code %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := dflow(t, "sim", "../../specs/seed.hcl", "--split", "target=8"); code != exitUsage || !strings.Contains(stderr, "want A,B=N") {
		t.Errorf("bad split: code %d %s", code, stderr)
	}
	png := filepath.Join(dir, "cmp.png")
	code, stdout, stderr = dflow(t, "compare", "../../specs/seed.hcl", "--edge", "hs", "--sim", "--plot", png)
	if code != 0 || !strings.Contains(stdout, "round_robin") || !strings.Contains(stdout, "1.00x") || !strings.Contains(stdout, "[8") {
		t.Fatalf("compare: code %d\n%s%s", code, stdout, stderr)
	}
	if fi, err := os.Stat(png); err != nil || fi.Size() < 1000 {
		t.Errorf("compare --plot: %v", err)
	}
	code, stdout, _ = dflow(t, "compare", "../../specs/seed.hcl", "--edge", "hs", "--sim", "--json")
	var cmp comparison
	if err := json.Unmarshal([]byte(stdout), &cmp); err != nil || code != 0 || len(cmp.Rows) != 2 {
		t.Fatalf("compare --json: %v\n%s", err, stdout)
	}
	if s := cmp.Rows[1].Speedup; s < 1.5 || s > 1.8 || cmp.Rows[1].Policy != "shared" || len(cmp.Rows[0].Utilization) != 3 {
		t.Errorf("shared speedup %.2f, rows %+v", s, cmp.Rows)
	}
	// Real runs, scaled down.
	code, stdout, stderr = dflow(t, "compare", "../../specs/seed.hcl", "--edge", "hs", "--var", "items=60")
	if code != 0 || !strings.Contains(stdout, "(measured)") || !strings.Contains(stdout, "shared") {
		t.Errorf("compare (real): code %d\n%s%s", code, stdout, stderr)
	}
	if code, _, _ := dflow(t, "compare", "../../specs/seed.hcl"); code != exitUsage {
		t.Errorf("compare without --edge: code %d", code)
	}
}

// TestEval: dflow eval measures a saved drafter next to the n-gram
// baseline; bad files fail clearly.
func TestEval(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m, _ := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 7)
	target := filepath.Join(dir, "t.safetensors")
	m.Save(target, nil)
	d, _ := nn.NewDrafter(nn.DrafterConfig{D: 16, K: 2, Layers: 1, Heads: 2, Hidden: 16, BlockSize: 4}, m.P("wte"), 1)
	drafter := filepath.Join(dir, "d.safetensors")
	d.Save(drafter, nil, nil)
	corpus := filepath.Join(dir, "c.txt")
	os.WriteFile(corpus, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 2000)), 0o644)
	code, stdout, stderr := dflow(t, "eval", drafter, "--target", target, "--corpus", corpus, "--prompts", "3", "--cycles", "4")
	if code != 0 || !strings.Contains(stdout, "drafter") || !strings.Contains(stdout, "n-gram") || !strings.Contains(stdout, "at most 4") {
		t.Fatalf("eval: code %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := dflow(t, "eval", filepath.Join(dir, "none.safetensors"), "--target", target, "--corpus", corpus); code != exitFailed || !strings.Contains(stderr, "none.safetensors") {
		t.Errorf("missing drafter: code %d %s", code, stderr)
	}
}

// buildChecksum builds the example plugin once for the CLI tests, and
// links it under the name dflow looks for (a link: an executable this
// process wrote could be busy for a child another test forks meanwhile).
var buildChecksum = sync.OnceValues(func() (string, error) {
	bin, err := testutil.Built(repoRoot, "./plugins/examples/checksum", nil)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "dflow-plugin-build")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "dflow-plugin-checksum")
	return path, os.Symlink(bin, path)
})

const pluginSpec = `
plugin "checksum" {
  path = "%s"
}
stage "src" {
  node = "synthetic_source"
  config {
    count        = %d
    size_bytes   = 64
    service_time = "%s"
  }
}
stage "crc" {
  node     = "checksum/crc"
  replicas = 2
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = crc.in
}
edge "b" {
  from = crc.out
  to   = sink.in
}
`

// TestPluginCLI: the example plugin, built from source, declared in a
// spec: validate checks its stage, run streams items through it, dflow
// plugins lists it.
func TestPluginCLI(t *testing.T) {
	t.Parallel()
	bin, err := buildChecksum()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := filepath.Join(dir, "p.hcl")
	os.WriteFile(spec, []byte(fmt.Sprintf(pluginSpec, bin, 500, "0s")), 0o644)
	if code, _, stderr := dflow(t, "validate", spec); code != 0 {
		t.Fatalf("validate: %d\n%s", code, stderr)
	}
	code, _, stderr := dflow(t, "run", spec, "--report", filepath.Join(dir, "r.json"))
	if code != 0 || !strings.Contains(stderr, "crc_items=500") {
		t.Fatalf("run: %d\n%s", code, stderr)
	}
	code, _, stderr = dflow(t, "validate", spec, "--set", "stage.crc.config.crash_after=-2")
	if code != exitFailed || !strings.Contains(stderr, "crash_after: must be 0 or more") {
		t.Errorf("plugin config check: %d\n%s", code, stderr)
	}
	code, stdout, _ := dflow(t, "plugins", filepath.Dir(bin))
	if code != 0 || !strings.Contains(stdout, "node checksum/crc") || !strings.Contains(stdout, "config crash_after int = 0") {
		t.Errorf("plugins: %d\n%s", code, stdout)
	}
	os.WriteFile(spec, []byte(fmt.Sprintf(pluginSpec, filepath.Join(dir, "missing"), 5, "0s")), 0o644)
	if code, _, stderr := dflow(t, "validate", spec); code != exitFailed || !strings.Contains(stderr, "plugin failed to start") ||
		strings.Contains(stderr, "unknown node kind") {
		t.Errorf("missing plugin: one error, the plugin's, not one more per stage using it: %d\n%s", code, stderr)
	}
}

// TestPluginSignals: SIGINT or SIGTERM to dflow, twice, leaves no plugin
// process behind.
func TestPluginSignals(t *testing.T) {
	t.Parallel()
	bin, err := buildChecksum()
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		dir := t.TempDir()
		// A private copy, so pgrep sees only this test's processes.
		plug := filepath.Join(dir, "dflow-plugin-checksum")
		data, _ := os.ReadFile(bin)
		os.WriteFile(plug, data, 0o755)
		spec := filepath.Join(dir, "p.hcl")
		os.WriteFile(spec, []byte(fmt.Sprintf(pluginSpec, plug, 100000, "1ms")), 0o644)
		cmd := exec.Command(os.Args[0], "run", spec, "--interval", "0")
		cmd.Env = append(os.Environ(), "DFLOW_AS_MAIN=1")
		var stderr testutil.SyncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if !testutil.Within(20*time.Second, func() bool { return len(plugintest.Procs(plug)) >= 3 }) { // catalog + 2 replicas
			cmd.Process.Kill()
			t.Fatalf("plugins never started:\n%s", stderr.String())
		}
		cmd.Process.Signal(sig)
		if !testutil.Within(20*time.Second, func() bool { return strings.Contains(stderr.String(), "draining") }) {
			cmd.Process.Kill()
			t.Fatalf("%v: never drained:\n%s", sig, stderr.String())
		}
		cmd.Process.Signal(sig)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatal("dflow did not exit")
		}
		if !testutil.Within(5*time.Second, func() bool { return len(plugintest.Procs(plug)) == 0 }) {
			t.Fatalf("%v: plugin processes outlived dflow: %v", sig, plugintest.Procs(plug))
		}
	}
}

// TestRunNeverStarted: a run whose stages fail to build (a corpus too
// short for one batch: valid, but text_reader's constructor refuses it)
// prints the error once and no summary of the run that never started,
// in one process and on a cluster, where the stage is built on a worker;
// the report, when asked for, says failed with the error.
func TestRunNeverStarted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	corpus := filepath.Join(dir, "short.txt")
	os.WriteFile(corpus, []byte("too short for a batch\n"), 0o644)
	spec := writeSpec(t, fmt.Sprintf(`
stage "reader" {
  node = "text_reader"
  config {
    path = %q
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from = reader.out
  to   = done.in
}
`, corpus))
	for _, where := range [][]string{nil, {"--local-cluster", "1"}} {
		out := filepath.Join(dir, "r.json")
		code, stdout, stderr := dflow(t, append([]string{"run", spec, "--report", out}, where...)...)
		if code != exitFailed || strings.Count(stderr, "do not fill one batch") != 1 {
			t.Errorf("%v: code %d, want %d and the error once:\n%s", where, code, exitFailed, stderr)
		}
		for _, summary := range []string{"run failed in", "stage reader", "edge  tokens", "diagnosis:"} {
			if strings.Contains(stdout+stderr, summary) {
				t.Errorf("%v: a run that never started printed %q:\n%s", where, summary, stderr)
			}
		}
		if rep := readReport(t, out); rep.Status != report.Failed || !strings.Contains(rep.Error, "do not fill one batch") {
			t.Errorf("%v: report status %s, error %q", where, rep.Status, rep.Error)
		}
	}
}

// TestLastStatusLineIsFinal: a figure a node sets as it ends, after the
// last interval (drafter_train's final evaluation), is in the last status
// line as in the summary: one figure, not the last periodic one above the
// final one.
func TestLastStatusLineIsFinal(t *testing.T) {
	t.Parallel()
	reg := nodes.Default.Clone()
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "final_metric", Doc: "sets m=1 per item and m=2 at its end",
			Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
			}},
		New: func(*graph.Config) (nodes.Node, error) { return finalMetric{}, nil },
	})
	spec := writeSpec(t, `
stage "src" {
  node = "synthetic_source"
  config {
    count        = 30
    service_time = "10ms"
  }
}
stage "end" {
  node = "final_metric"
}
edge "e" {
  from = src.out
  to   = end.in
}
`)
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, registry: reg}
	if code := e.main([]string{"run", spec, "--interval", "50ms"}); code != exitOK {
		t.Fatalf("code %d\n%s", code, stderr.String())
	}
	var status []string
	summary := "" // on stdout, the status lines on stderr
	for _, line := range strings.Split(stderr.String()+stdout.String(), "\n") {
		if strings.HasPrefix(line, "[") {
			status = append(status, line)
		}
		if strings.HasPrefix(line, "  stage end") {
			summary = line
		}
	}
	if len(status) < 3 || !strings.Contains(status[0], "m=1") {
		t.Fatalf("want periodic status lines with m=1 first:\n%s", stderr.String())
	}
	if last := status[len(status)-1]; !strings.Contains(last, "m=2") || !strings.Contains(summary, "m=2") {
		t.Errorf("the last status line and the summary disagree on m, or miss the final m=2:\n%s\n%s", last, summary)
	}
}

type finalMetric struct{}

func (finalMetric) Run(ctx context.Context, r nodes.Replica) error {
	for {
		if _, err := r.In("in").Recv(ctx); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		r.Metrics().Set("m", 1)
	}
	r.Metrics().Set("m", 2)
	return nil
}
