package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/report"
)

// TestSeedDeadlock: the seed with the reader's edge round_robin can never
// finish. validate warns at the edge to change; run fails naming the
// cycle, instead of hanging for ever, and its report says
// failed with the counts as they stood.
func TestSeedDeadlock(t *testing.T) {
	t.Parallel()
	set := "edge.tokens.policy=round_robin"
	code, stdout, stderr := dflow(t, "validate", "../../specs/seed.hcl", "--set", set)
	if code != exitOK || !strings.Contains(stdout, "1 of 1 spec valid") {
		t.Fatalf("validate: code %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"seed.hcl:60:14: warning: the wiring can deadlock",
		"drafter[2] waits for input on hs[2] (empty)",
		"drafter[0] waits at stage drafter's group step (2 of 3 there)",
		"--set edge.hs.policy=shared",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("validate's warning lacks %q:\n%s", want, stderr)
		}
	}
	// The shipped wirings draw no warning.
	if _, _, stderr := dflow(t, "validate", "../../specs/seed.hcl", "../../specs/fan.hcl"); strings.Contains(stderr, "deadlock") {
		t.Errorf("the shipped specs warn:\n%s", stderr)
	}

	out := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr = dflow(t, "run", "../../specs/seed.hcl", "--set", set, "--report", out, "--interval", "0")
	if code != exitFailed {
		t.Errorf("run: code %d", code)
	}
	for _, want := range []string{
		"dflow run: ../../specs/seed.hcl: deadlock: no replica can move",
		"drafter[2] waits for input on hs[2] (empty), fed by target[2]",
		"target[2] waits for input on tokens[2] (empty), fed by reader[0]",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("run's error lacks %q:\n%s", want, stderr)
		}
	}
	rep := readReport(t, out)
	if rep.Status != report.Failed || !strings.HasPrefix(rep.Error, "deadlock: ") {
		t.Errorf("report: status %s, error %q", rep.Status, rep.Error)
	}
	// The counts as they stood once the run was torn down: the books
	// balance, and the drafters, stuck at their group step, never passed
	// all 300 on. (The reader's own count may reach 300: the teardown
	// releases a producer blocked on a full queue by taking items out of
	// it, so its blocked send completes, wake.go; a deadlock formed as it
	// sent its last item ends with all 300 sent.)
	var sent, sunk int64
	for _, r := range rep.Stages["reader"].Replicas {
		sent += r.ItemsOut
	}
	for _, r := range rep.Stages["done"].Replicas {
		sunk += r.ItemsIn
	}
	if e := rep.Edges["tokens"]; e.Produced != sent || sent == 0 || sunk >= 300 {
		t.Errorf("tokens produced %d, the reader sent %d, the sink took %d of 300\nstderr:\n%s", e.Produced, sent, sunk, stderr)
	}
}
