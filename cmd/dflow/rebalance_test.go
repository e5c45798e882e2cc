package main

import (
	"strings"
	"testing"
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
	if code != exitOK || !strings.Contains(stderr, "dflow: rebalance: target and drafter share 8 replicas (now 5+3); looks every 10s") {
		t.Errorf("shared: code %d\n%s", code, stderr)
	}
}
