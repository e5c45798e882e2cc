package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// compareRows decodes `dflow compare --json`'s output.
func compareRows(t *testing.T, stdout string) comparison {
	t.Helper()
	var cmp comparison
	if err := json.Unmarshal([]byte(stdout), &cmp); err != nil {
		t.Fatalf("compare --json: %v\n%s", err, stdout)
	}
	return cmp
}

// TestCompareRebalanceSim: compare --rebalance --sim puts specs/moving.hcl's
// static split (5+3), the simulator's best static split of 8 (4+4) and
// the split that moves in one table; the live one moves targets to the
// drafters, ends at a split the budget holds, and beats both static ones.
// --edge with --rebalance is a usage error.
func TestCompareRebalanceSim(t *testing.T) {
	code, stdout, stderr := dflow(t, "compare", "../../specs/moving.hcl", "--rebalance", "--sim")
	if code != exitOK {
		t.Fatalf("code %d\n%s%s", code, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 5 || !strings.Contains(lines[0], "static split against rebalance of target+drafter (simulated)") ||
		!strings.HasPrefix(lines[2], "static 5+3 ") || !strings.HasPrefix(lines[3], "best static 4+4 ") ||
		!strings.HasPrefix(lines[4], "rebalance 5+3 ") || !strings.Contains(lines[4], "target -> drafter") {
		t.Errorf("table:\n%s", stdout)
	}
	png := filepath.Join(t.TempDir(), "c.png")
	code, stdout, stderr = dflow(t, "compare", "../../specs/moving.hcl", "--rebalance", "--sim", "--json", "--plot", png)
	if code != exitOK {
		t.Fatalf("--json: code %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(png); err != nil {
		t.Errorf("--plot: %v", err)
	}
	cmp := compareRows(t, stdout)
	if len(cmp.Rows) != 3 || cmp.Edge != "" || strings.Join(cmp.Rebalance, ",") != "target,drafter" || !cmp.Simulated {
		t.Fatalf("comparison %+v", cmp)
	}
	static, best, live := cmp.Rows[0], cmp.Rows[1], cmp.Rows[2]
	if static.Variant != "static" || best.Variant != "best static" || live.Variant != "rebalance" || static.Moves != nil || best.Moves != nil {
		t.Errorf("rows %+v", cmp.Rows)
	}
	if len(live.Moves) == 0 || live.Moves[0].From != "target" || live.Split != "5+3" || live.EndSplit == "5+3" {
		t.Errorf("live row: split %s -> %s, moves %+v", live.Split, live.EndSplit, live.Moves)
	}
	if live.Throughput <= best.Throughput || best.Throughput <= static.Throughput || live.Speedup <= 1 {
		t.Errorf("items/s: static %.1f, best static %.1f, rebalance %.1f (speedup %.2f); want the rebalance first", static.Throughput, best.Throughput, live.Throughput, live.Speedup)
	}
	if code, _, stderr := dflow(t, "compare", "../../specs/moving.hcl", "--rebalance", "--edge", "hs"); code != exitUsage ||
		!strings.Contains(stderr, "give one of them") {
		t.Errorf("--edge with --rebalance: code %d\n%s", code, stderr)
	}
	if code, _, stderr := dflow(t, "compare", "../../specs/moving.hcl"); code != exitUsage ||
		!strings.Contains(stderr, "want one spec and --edge NAME or --rebalance") {
		t.Errorf("neither --edge nor --rebalance: code %d\n%s", code, stderr)
	}
}

// TestCompareRebalanceRun: compare --rebalance runs each split for real:
// the seed's shape from its worst split (1 target, 7 drafters, every edge
// shared, the spec without a rebalance block) beside the best static
// split and the run that moves, which moves drafters to the targets and
// carries well over the starting split's rate.
func TestCompareRebalanceRun(t *testing.T) {
	code, stdout, stderr := dflow(t, "compare", "../../specs/seed.hcl", "--rebalance", "--json",
		"--set", "edge.hs.policy=shared", "--set", "stage.target.replicas=1", "--set", "stage.drafter.replicas=7",
		"--set", "stage.target.config.service_time=10ms", "--set", "stage.drafter.config.service_time=5ms", "--var", "items=300")
	if code != exitOK {
		t.Fatalf("code %d\n%s%s", code, stdout, stderr)
	}
	cmp := compareRows(t, stdout)
	if len(cmp.Rows) != 3 || cmp.Simulated || cmp.Rows[0].Split != "1+7" || cmp.Rows[1].Variant != "best static" {
		t.Fatalf("comparison %+v\n%s", cmp, stderr)
	}
	live := cmp.Rows[2]
	if live.Status != "ok" || len(live.Moves) == 0 || live.Moves[0].From != "drafter" || live.Moves[0].To != "target" {
		t.Errorf("live row %+v\n%s", live, stderr)
	}
	// 100 items/s at 1+7, about 4x that after the move: a loaded machine
	// stretches the sleeps, not the ratio.
	if live.Throughput < 1.5*cmp.Rows[0].Throughput {
		t.Errorf("items/s: static %.1f, rebalance %.1f; want 1.5x or more", cmp.Rows[0].Throughput, live.Throughput)
	}
	if !strings.Contains(stderr, "dflow: running ../../specs/seed.hcl, rebalance 1+7") || !strings.Contains(stderr, "moved ") {
		t.Errorf("stderr:\n%s", stderr)
	}
}
