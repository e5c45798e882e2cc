package python

import (
	"fmt"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/report"
)

// TestTimes: the Python SDK measures where its node's time goes (Times):
// a stats replica that works 5 ms on each item (its sleep, outside recv
// and send) into a fast sink is busy most of its life, and its service
// time's median is at least its 5 ms. With DFLOW_PLUGIN_TIMES=off (no
// Times, as a plugin built before them) it runs as before, measured at
// dflow's ports: items of microseconds, its feeder's, fed every 20 ms.
func TestTimes(t *testing.T) {
	const n, work = 60, 5 * time.Millisecond
	run := func(t *testing.T, pace string) report.Replica {
		f := newFixture(t)
		rep, err := f.run(t, fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count        = %d
    service_time = %q
  }
}
stage "s" {
  node = "py/stats"
  config {
    sleep = %g
  }
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = s.in
}
edge "b" {
  from = s.out
  to   = sink.in
}`, n, pace, work.Seconds()))
		if err != nil {
			t.Fatalf("%v\n%s", err, f.stderr.String())
		}
		r := rep.Stages["s"].Replicas[0]
		if r.ItemsIn != n || r.ItemsOut != n {
			t.Fatalf("replica took %d items and sent %d, want %d", r.ItemsIn, r.ItemsOut, n)
		}
		sh := r.Shares()
		t.Logf("busy %.2fs idle %.2fs blocked %.2fs (busy %.0f%%, idle %.0f%%, blocked %.0f%%), service p50 %v mean %v p99 %v",
			r.BusySeconds, r.IdleSeconds, r.BlockedSeconds, 100*sh.Busy, 100*sh.Idle, 100*sh.Blocked,
			dur(r.ServiceSeconds.P50), dur(r.ServiceSeconds.Mean), dur(r.ServiceSeconds.P99))
		return r
	}
	// The median's bucket is about 4% wide: its middle may lie below 5 ms.
	minP50 := work * 95 / 100
	t.Run("fast", func(t *testing.T) {
		r := run(t, "0s")
		if sh := r.Shares(); sh.Busy < 0.5 || sh.Blocked > 0.25 {
			t.Errorf("busy %.0f%%, blocked %.0f%%: want mostly busy", 100*sh.Busy, 100*sh.Blocked)
		}
		if p50 := dur(r.ServiceSeconds.P50); p50 < minP50 {
			t.Errorf("service p50 %v, want at least %v", p50, minP50)
		}
	})
	t.Run("untimed", func(t *testing.T) {
		t.Setenv("DFLOW_PLUGIN_TIMES", "off")
		r := run(t, "20ms")
		if p50 := dur(r.ServiceSeconds.P50); p50 >= work/2 {
			t.Errorf("service p50 %v: want dflow's side's figure (the plugin said no Times)", p50)
		}
	})
}

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
