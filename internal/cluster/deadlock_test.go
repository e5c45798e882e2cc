package cluster

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/report"
)

// seedDeadlock is the engine's deadlock test's wiring (engine's
// deadlock_test.go): the source rotates over the five targets' queues,
// targets 0 and 3 feed drafter 0's queue, target 2 alone feeds drafter
// 2's, and the drafters step together. Once drafter 0's queue is full,
// target 0 blocks, then the source, so target 2 starves, drafter 2 with
// it, and the group step holds drafters 0 and 1: nothing can move.
const seedDeadlock = `
stage "reader" {
  node = "synthetic_source"
  config {
    count = 100000
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = 5
  config {
    service_time = "100us"
  }
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "100us"
    sync         = true
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "round_robin"
  capacity = 4
}
edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin"
  capacity = 4
}
edge "trained" {
  from = drafter.out
  to   = done.in
}
`

// TestDeadlockAcrossWorkers: the wiring that deadlocks in one process
// deadlocks over two and three workers too, with the replicas of the
// cycle on different workers, and fails as in process: the cycle named,
// each replica with its worker, and the fix. Before the detector across
// workers the run hung (every replica blocked, no engine seeing it).
func TestDeadlockAcrossWorkers(t *testing.T) {
	spec := writeSpec(t, "deadlock.hcl", seedDeadlock)
	for _, workers := range []int{2, 3} {
		t.Run(strings.Repeat("w", workers), func(t *testing.T) {
			tc := startCluster(t, workers)
			rep, c, err := tc.run(t, spec, workers)
			var d *engine.Deadlock
			if !errors.As(err, &d) {
				t.Fatalf("err = %v, want a *engine.Deadlock", err)
			}
			if rep.Status != report.Failed || !strings.Contains(rep.Error, "deadlock") {
				t.Errorf("status %s, error %q", rep.Status, rep.Error)
			}
			msg := err.Error()
			t.Log(c.Placement() + "\n" + msg)
			for _, re := range []string{
				`drafter\[2\] on w\d waits for input on hs\[2\] \(empty\), fed by target\[2\]`,
				`target\[2\] on w\d waits for input on tokens\[2\] \(empty\), fed by reader\[0\]`,
				`reader\[0\] on w\d waits to send on tokens\[[0134]\] \(full, 4 of 4\), read by target\[[0134]\]`,
				`waits at stage drafter's group step for drafter\[2\] \(2 of 3 there\)`,
				`--set edge.hs.policy=shared`,
			} {
				if !regexp.MustCompile(re).MatchString(msg) {
					t.Errorf("error does not match %s", re)
				}
			}
			first := strings.Fields(d.Cycle[0])[0]
			if last := d.Cycle[len(d.Cycle)-1]; !strings.HasSuffix(last, " by "+first) && !strings.Contains(last, "for "+first) {
				t.Errorf("cycle does not close on %s: %q", first, d.Cycle)
			}
			on := map[string]bool{}
			for _, line := range d.Cycle {
				if m := regexp.MustCompile(` on (w\d) `).FindStringSubmatch(line); m != nil {
					on[m[1]] = true
				}
			}
			if len(on) < 2 {
				t.Errorf("the cycle's replicas sit on %v: want several workers (placement %s)", on, c.Placement())
			}
			for name, q := range rep.Edges {
				for i, rq := range q.Queues {
					if rq.MaxDepth > int64(q.Capacity) {
						t.Errorf("edge %s queue %d: max depth %d over its capacity %d", name, i, rq.MaxDepth, q.Capacity)
					}
				}
			}
		})
	}
}
