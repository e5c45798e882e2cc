package cluster

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/report"
)

// TestDeadlockAcrossWorkers: the engine's deadlock wiring (the source
// rotates over five targets' queues, target 2 alone feeds drafter 2, the
// drafters step together) deadlocks over two and three workers as in
// one process, with the replicas of the cycle on different workers, and fails as in process: the cycle named,
// each replica with its worker, and the fix. Before the detector across
// workers the run hung (every replica blocked, no engine seeing it).
func TestDeadlockAcrossWorkers(t *testing.T) {
	t.Parallel()
	spec := writeSpec(t, "deadlock.hcl", plugintest.DeadlockSpec("synthetic_work"))
	for _, workers := range []int{2, 3} {
		t.Run(strings.Repeat("w", workers), func(t *testing.T) {
			t.Parallel() // a cluster each
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
			for _, st := range c.Snapshot().Stages {
				for i, r := range st.Replicas {
					if !strings.HasPrefix(r.Worker, "w") {
						t.Errorf("snapshot: %s[%d] names worker %q", st.Name, i, r.Worker)
					}
				}
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

// TestNoDeadlockWhileSlow: a synchronized stage whose step takes seconds,
// which every other replica waits on (the source on a full queue, the
// sink on an empty one), over two workers, is no deadlock: the group's
// members are working, not waiting.
func TestNoDeadlockWhileSlow(t *testing.T) {
	t.Parallel()
	spec := writeSpec(t, "slow.hcl", `
stage "src" {
  node = "synthetic_source"
  config {
    count = 4
  }
}
stage "step" {
  node     = "synthetic_work"
  replicas = 2
  config {
    service_time = "4s"
    sync         = true
  }
}
stage "done" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = step.in
  policy   = "round_robin"
  capacity = 1
}
edge "b" {
  from = step.out
  to   = done.in
}
`)
	tc := startCluster(t, 2)
	rep, c, err := tc.run(t, spec, 2)
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v (placement %s)", rep.Status, err, c.Placement())
	}
	if e := rep.Edges["b"]; e.Produced != 4 || e.Consumed != 4 {
		t.Errorf("edge b: produced %d, consumed %d, want 4", e.Produced, e.Consumed)
	}
}

// oneKey deadlocks whatever the source does: mid sends every item to
// step[0]'s queue (one key), step[1] starves, and the two step together,
// so mid waits for room on a full queue for ever; a drain, which stops
// only the source, cannot complete.
const oneKey = `
stage "src" {
  node = "synthetic_source"
  config {
    count = 100000
    keys  = 1
  }
}
stage "mid" {
  node = "synthetic_work"
}
stage "step" {
  node     = "synthetic_work"
  replicas = 2
  config {
    sync = true
  }
}
edge "a" {
  from     = src.out
  to       = mid.in
  capacity = 2
}
edge "b" {
  from     = mid.out
  to       = step.in
  policy   = "key_hash"
  capacity = 2
}
`

// TestDeadlockStopsDrainAcrossWorkers: a drain of a run deadlocked
// across workers, begun once the replicas wait, cannot complete; it ends
// on its own as an abort that says so, as in process.
func TestDeadlockStopsDrainAcrossWorkers(t *testing.T) {
	t.Parallel()
	spec := writeSpec(t, "onekey.hcl", oneKey)
	tc := startCluster(t, 2)
	drain := make(chan struct{})
	var once sync.Once
	rep, c, err := tc.runWith(t, spec, 2, func(o *CoordOptions) {
		o.Drain = drain
		// across the workers: left to itself, the chain src -> mid ->
		// step would sit on one worker, and its engine sees the deadlock
		o.Pin = map[string][]string{"src": {"w1"}, "mid": {"w2"}, "step": {"w1", "w2"}}
		o.Timings.DeadlockConfirm = 6 * time.Second
		// The deadlock has formed once mid has waited for room on b,
		// taking nothing more, for a second; the coordinator confirms it
		// after 6 s here, so that the drain comes first even when a loaded
		// machine delays the snapshots (at the default 2 s it once
		// confirmed first, and the run failed undrained). Not before: a drain begun while
		// the cycle is still forming completes. Seen under load: a drain
		// at mid's first wait (for input), and one at a wait for room
		// after 4 items in, which was transient (across workers, room
		// opens as step[0]'s worker fetches its queue, though its replica
		// waits at the group's step): mid sent all 7, ended, step[1]'s
		// input ended with it and the run completed.
		var mu sync.Mutex
		var in int64
		var since time.Time
		o.Observe = func(s *report.Snapshot) {
			st := s.Stage("mid")
			if st == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			r := st.Replicas[0]
			if r.ItemsIn != in || !slices.ContainsFunc(r.Waits, func(w report.Wait) bool { return w.Kind == "send" }) {
				in, since = r.ItemsIn, time.Now()
				return
			}
			if time.Since(since) >= time.Second {
				once.Do(func() { close(drain) })
			}
		}
	})
	var d *engine.Deadlock
	if !errors.As(err, &d) || !d.Draining {
		t.Fatalf("err = %v, want a drain's *engine.Deadlock (placement %s); status %s %q, edges %+v", err, c.Placement(), rep.Status, rep.Error, rep.Edges)
	}
	t.Log(err)
	if rep.Status != report.Aborted || !strings.HasPrefix(rep.Error, "drain cannot complete: deadlock") {
		t.Errorf("status %s, error %q", rep.Status, rep.Error)
	}
}
