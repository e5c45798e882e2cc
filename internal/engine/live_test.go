package engine

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/report"
)

// TestMarkAdvance: whatever raw figures a replica's reads give (waits
// running ahead of the lifetime and falling back, a lifetime that steps
// back with the wall clock), what the mark returns never decreases, and it
// adds up to the lifetime whenever the lifetime is not behind an earlier
// one.
func TestMarkAdvance(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 200 {
		var m mark
		var prev times
		life := time.Duration(0)
		for step := range 500 {
			switch rng.IntN(10) {
			case 0: // the wall clock steps back a little
				life -= time.Duration(rng.IntN(int(time.Millisecond)))
			default:
				life += time.Duration(rng.IntN(int(20 * time.Millisecond)))
			}
			life = max(life, 0)
			// raw waits: anything up to the lifetime, in any direction
			idle := time.Duration(rng.Float64() * float64(life))
			blocked := time.Duration(rng.Float64() * float64(life-idle))
			tm := times{life: life, idle: idle, blocked: blocked, busy: life - idle - blocked}
			m.advance(&tm)
			if tm.busy < prev.busy || tm.idle < prev.idle || tm.blocked < prev.blocked {
				t.Fatalf("run %d step %d: %+v after %+v: a figure went down", run, step, tm, prev)
			}
			sum := tm.busy + tm.idle + tm.blocked
			if prevSum := prev.busy + prev.idle + prev.blocked; life >= prevSum && sum != life {
				t.Fatalf("run %d step %d: busy+idle+blocked = %v, lifetime %v", run, step, sum, life)
			}
			prev = tm
		}
	}
}

// TestSnapshotsMonotonic takes snapshots as fast as it can while replicas
// wait and work, on the coarse clock and the exact one: no replica's busy,
// idle or blocked time ever goes down from one snapshot to the next, and
// the three add up to no more than the time since the start.
func TestSnapshotsMonotonic(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Fast items (coarse-timed waits) into a stage whose items take up to
	// 40µs, with room for a few: replicas wait for input, for room, and
	// work, all the time.
	g := h.load(`
stage "src" {
  node   = "t"
  config {
    role  = "source"
    count = 8000
  }
}
stage "work" {
  node     = "t"
  replicas = 3
  config {
    jitter_us = 40
  }
}
stage "sink" {
  node   = "t"
  config {
    role      = "sink"
    jitter_us = 15
  }
}
edge "a" {
  from     = src.out
  to       = work.in
  capacity = 2
}
edge "b" {
  from     = work.out
  to       = sink.in
  policy   = "shared"
  capacity = 2
}
`)
	p, err := New(g, Options{Registry: h.reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Execute(ctx)
		done <- err
	}()
	var prev *report.Snapshot
	n := 0
	for finished := false; !finished; n++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished = true
		default:
		}
		s := p.Snapshot()
		// Replicas are read after s.Time, before now; lifetimes are on the
		// wall clock, time.Since on the monotonic one: a little slack.
		upTo := s.Elapsed + time.Since(s.Time) + 100*time.Microsecond
		if len(s.Stages) == 0 {
			continue // not started yet
		}
		for i, st := range s.Stages {
			for j, r := range st.Replicas {
				if sum := r.Busy + r.Idle + r.Blocked; sum > upTo {
					t.Fatalf("snapshot %d: %s[%d] busy+idle+blocked %v > elapsed %v", n, st.Name, j, sum, upTo)
				}
				if prev == nil || len(prev.Stages) == 0 {
					continue
				}
				p := prev.Stages[i].Replicas[j]
				if r.Busy < p.Busy || r.Idle < p.Idle || r.Blocked < p.Blocked {
					t.Fatalf("snapshot %d: %s[%d] went down: busy %v -> %v, idle %v -> %v, blocked %v -> %v",
						n, st.Name, j, p.Busy, r.Busy, p.Idle, r.Idle, p.Blocked, r.Blocked)
				}
			}
		}
		prev = s
	}
	if n < 100 {
		t.Fatalf("only %d snapshots during the run", n)
	}
	t.Logf("%d snapshots", n)
}
