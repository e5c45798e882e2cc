package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/report"
)

// The cluster audit (issue 44): the exactly-once guarantee for a lost
// worker's restartable replicas, checked from outside the run's own
// counts, for each item type. A plugin (internal/plugintest/audit) is
// both ends of the chain: its source puts a unique id inside each item's
// payload, its sink appends every id it receives to a file as it arrives.
// Between them two restartable stages (synthetic_work, 4 and 3 replicas)
// on shared edges run on w2 and w3; the source and the sink on w1, which
// is never killed. Mid-run one of w2 and w3 is SIGKILLed.
//
// TestAuditBytes runs one such run per item type; bench/audit runs it a
// few hundred times with the victim and the moment drawn at random
// (DFLOW_AUDIT_KILL, DFLOW_AUDIT_AFTER).

// auditItems is how many items the audit's source makes.
const auditItems = 300

// auditSpec is the audit's pipeline: the plugin's path, the item type,
// the replicas of a and b, the sink's file and the policy of the edge
// between a and b fill it in.
const auditSpec = `plugin "audit" {
  path = %q
}

stage "src" {
  node = "audit/source"
  config {
    count = %d
    type  = %q
  }
}

stage "a" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time = "20ms"
  }
}

stage "b" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time = "10ms"
  }
}

stage "dst" {
  node = "audit/sink"
  config {
    file = %q
  }
}

edge "e1" {
  from     = src.out
  to       = a.in
  policy   = "shared"
  capacity = 8
}

edge "e2" {
  from     = a.out
  to       = b.in
  policy   = %q
  capacity = 8
}

edge "e3" {
  from     = b.out
  to       = dst.in
  policy   = "shared"
  capacity = 8
}
`

// buildAudit builds the audit plugin once and links it as
// dflow-plugin-audit in a folder of its own, for a worker's --plugins.
var buildAudit = sync.OnceValues(func() (string, error) {
	bin, err := testutil.Built(repoRoot, "./internal/plugintest/audit", nil)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "dflow-plugin-audit")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "dflow-plugin-audit")
	return path, os.Symlink(bin, path)
})

// auditKill is which worker the audit kills (w2 or w3) and after how
// many ids at the sink: DFLOW_AUDIT_KILL and DFLOW_AUDIT_AFTER (a
// percentage of the ids, 1 to 99) where set, as bench/audit sets them,
// else w2 after 20% (60 ids).
func auditKill(t *testing.T) (victim string, after int) {
	t.Helper()
	victim, after = "w2", auditItems/5
	if v := os.Getenv("DFLOW_AUDIT_KILL"); v != "" {
		if v != "w2" && v != "w3" {
			t.Fatalf("DFLOW_AUDIT_KILL=%s: the audit kills w2 or w3 (w1 holds its source and sink)", v)
		}
		victim = v
	}
	if v := os.Getenv("DFLOW_AUDIT_AFTER"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 99 {
			t.Fatalf("DFLOW_AUDIT_AFTER=%s: want a percentage of the ids at the sink, 1 to 99", v)
		}
		after = max(auditItems*p/100, 1)
	}
	return victim, after
}

// TestAuditBytes: a worker running replicas of the two restartable
// stages is SIGKILLed mid-run, for items of type bytes (a []byte) and
// blob (a *items.Blob). The run must end ok, the sink must have received
// every id exactly once, and the report's counts must be exact.
func TestAuditBytes(t *testing.T) {
	t.Parallel()
	victim, after := auditKill(t)
	for _, typ := range []string{"bytes", "blob"} {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			auditRun(t, typ, victim, after, false, "")
		})
	}
}

// TestAuditChain: the audit with a chain between a and b (2 replicas
// each, a[i] feeding b[i] round robin on one worker: the edge e2 stays in
// process, its items settled through e1's), a worker holding one chain
// SIGKILLed mid-run. The chain restarts whole from its inputs on e1: the
// sink gets every id once, and the report's counts are exact, e2's
// included (it has no stream to count it: its figures follow the chain's
// heads; counted by the lost worker's last snapshot instead, the books
// failed it, e2 produced 293 of 300).
func TestAuditChain(t *testing.T) {
	t.Parallel()
	victim, after := auditKill(t)
	auditRun(t, "bytes", victim, after, true, "")
}

// TestAuditEmbeddedWorker: the audit with w2 an embedder's worker, not
// dflow: examples/embed, a program of a module of its own, built here and
// started as `embed worker --join URL ...` (run.Worker, with the
// program's node kinds and dflow's synthetic ones, and the audit plugin
// from its --plugins folder), beside two dflow workers. w2 is SIGKILLed
// mid-run: its replicas restart on the dflow workers, the sink gets every
// id once, and the report's counts are exact.
func TestAuditEmbeddedWorker(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	bin, err := testutil.Built(filepath.Join(repoRoot, "examples", "embed"), ".", []string{"GOWORK=off", "GOFLAGS="})
	if err != nil {
		t.Fatal(err)
	}
	auditRun(t, "bytes", "w2", auditItems/5, false, bin)
}

// auditRun is one run of the audit: items of type typ, victim killed
// once the sink has after ids; w2, when not "", is the program w2 runs
// as `PROGRAM worker ...` instead of dflow (an embedder's worker).
func auditRun(t *testing.T, typ, victim string, after int, chain bool, w2 string) {
	plugin, err := buildAudit()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ids := filepath.Join(dir, "ids")
	spec := filepath.Join(dir, "audit.hcl")
	a, b, policy := 4, 3, "shared"
	if chain {
		a, b, policy = 2, 2, "round_robin"
	}
	if err := os.WriteFile(spec, fmt.Appendf(nil, auditSpec, plugin, auditItems, typ, a, b, ids, policy), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t)
	bins := []string{installed(t), installed(t), installed(t)}
	if w2 != "" {
		bins[1] = w2
	}
	var ws []*proc
	for i, bin := range bins {
		ws = append(ws, workerOf(t, bin, srv.URL, srv.Token, fmt.Sprintf("w%d", i+1), "--plugins", filepath.Dir(plugin), "--write", dir))
	}
	kill := map[string]*proc{"w2": ws[1], "w3": ws[2]}[victim]
	place := map[string][]string{"src": {"w1"}, "dst": {"w1"}, "a": {"w2", "w3"}, "b": {"w2", "w3"}}
	killedAt := -1 // ids at the sink when the kill was sent
	rep, err, _ := coordinateSpec(t, srv, spec, 3, place, func(*cluster.Coordinator) {
		if !testutil.Within(30*time.Second, func() bool { return len(sinkIDs(ids)) >= after }) {
			t.Errorf("the sink had %d ids after 30s, want %d before the kill", len(sinkIDs(ids)), after)
			return
		}
		killedAt = len(sinkIDs(ids))
		kill.cmd.Process.Signal(syscall.SIGKILL)
	})
	got := sinkIDs(ids)
	missing, twice, bad := auditIDs(got)
	status := "no report"
	if rep != nil {
		status = string(rep.Status)
	}
	// One line that says what the run did: bench/audit prints it.
	t.Logf("audit verdict: %s, %s killed at %d ids (asked %d): the sink got %d ids of %d, %d missing, %d twice, %d bad; status %s",
		typ, victim, killedAt, after, len(got), auditItems, len(missing), len(twice), len(bad), status)
	if err != nil {
		t.Fatalf("%v\nw1:\n%s\nw2:\n%s\nw3:\n%s", err, ws[0].output(), ws[1].output(), ws[2].output())
	}
	if rep.Status != report.OK {
		t.Errorf("status %s: %s", rep.Status, rep.Error)
	}
	if len(missing) > 0 {
		t.Errorf("%d ids never reached the sink: %s", len(missing), short(missing))
	}
	if len(twice) > 0 {
		t.Errorf("%d ids reached the sink more than once: %s", len(twice), short(twice))
	}
	if len(bad) > 0 {
		t.Errorf("%d items at the sink had no id: %q", len(bad), bad[:min(len(bad), 5)])
	}
	// How each edge was carried: e2 a chain's where a and b chain.
	wantCarried := map[string]string{"e1": report.CarriedCrosses, "e2": report.CarriedCrosses, "e3": report.CarriedCrosses}
	if chain {
		wantCarried["e2"] = report.CarriedChain
	}
	for name, want := range wantCarried {
		if got := rep.Edges[name].Carried; got != want {
			t.Errorf("edge %s carried %q, want %q", name, got, want)
		}
	}
	if w2 != "" && !strings.Contains(ws[1].output(), "dflow worker w2: run ") {
		t.Errorf("w2, %s, did not start its share of the run:\n%s", w2, ws[1].output())
	}
	// The report's own counts, exact as well.
	wantEdges(t, rep, auditItems)
	for stage, want := range map[string][2]int64{"src": {0, auditItems}, "a": {auditItems, auditItems}, "b": {auditItems, auditItems}, "dst": {auditItems, 0}} {
		var in, out int64
		for _, r := range rep.Stages[stage].Replicas {
			in += r.ItemsIn
			out += r.ItemsOut
		}
		if in != want[0] || out != want[1] {
			t.Errorf("stage %s: %d items in, %d out, want %d and %d", stage, in, out, want[0], want[1])
		}
	}
	// A kill before half the ids were at the sink finds the victim's
	// replicas of stage a with work left: they restart. (A later one may
	// find them finished, which restarts nothing and is no failure.)
	restarted := false
	for _, stage := range []string{"a", "b"} {
		for _, r := range rep.Stages[stage].Replicas {
			restarted = restarted || strings.HasPrefix(r.Worker, victim+">")
		}
	}
	if killedAt >= 0 && killedAt <= auditItems/2 && !restarted {
		t.Errorf("no replica of a or b restarted after %s: %+v %+v", victim, rep.Stages["a"].Replicas, rep.Stages["b"].Replicas)
	}
}

// sinkIDs reads the lines the audit's sink wrote to file, whole lines only.
func sinkIDs(file string) []string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(string(b), "\n")
	return lines[:len(lines)-1] // the last is empty, or not written whole
}

// auditIDs checks the sink's lines against the ids 0 to auditItems-1:
// those it lacks, those it has more than once, and the lines that are
// not an id of them.
func auditIDs(lines []string) (missing, twice []int, bad []string) {
	seen := make([]int, auditItems)
	for _, l := range lines {
		id, err := strconv.Atoi(l)
		if err != nil || id < 0 || id >= auditItems {
			bad = append(bad, l)
			continue
		}
		seen[id]++
	}
	for id, n := range seen {
		if n == 0 {
			missing = append(missing, id)
		}
		if n > 1 {
			twice = append(twice, id)
		}
	}
	return missing, twice, bad
}

// short lists ids, the first 20 of them.
func short(ids []int) string {
	s := fmt.Sprint(ids[:min(len(ids), 20)])
	if len(ids) > 20 {
		s = strings.TrimSuffix(s, "]") + " ...]"
	}
	return s
}
