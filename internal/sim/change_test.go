package sim

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/dflow-dev/dflow/internal/engine"
)

// changing is source -> work -> sink with work's cost changing mid-run
// (the %s is the change: change_after = N or change_at = "D").
const changing = `
stage "src" {
  node = "synthetic_source"
  config {
    count = %d
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = %d
  config {
    service_time         = "10ms"
    changed_service_time = "30ms"
    %s
  }
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}`

// TestCostChange: the simulator changes a stage's cost where a run does,
// at the stage's N-th item (over its replicas) or at a time after its
// start.
func TestCostChange(t *testing.T) {
	for _, tc := range []struct {
		change string
		count  int
		want   float64 // seconds
	}{
		{"change_after = 50", 100, 0.5 + 1.5}, // 50 items of 10ms, 50 of 30ms
		{`change_at = "1s"`, 200, 1 + 3},      // the items started before 1s take 10ms
	} {
		rep := simulate(t, load(t, fmt.Sprintf(changing, tc.count, 1, tc.change)), Options{})
		if math.Abs(rep.WallSeconds-tc.want) > 1e-6 {
			t.Errorf("%s: wall %.4fs, want %.1fs", tc.change, rep.WallSeconds, tc.want)
		}
	}
}

// TestCostChangeRun: a real run changes the cost as its simulation does:
// the work replicas' busy time is the simulation's (20 items of 10ms and
// 20 of 30ms: 0.8s), not that of an unchanged cost (0.4s). A loaded
// machine only stretches sleeps, and the synthetic nodes take a late
// wake off the next sleep, so the bound above is loose and the one below
// tight.
func TestCostChangeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real pipeline")
	}
	g := load(t, fmt.Sprintf(changing, 40, 2, "change_after = 20"))
	real, err := engine.Run(context.Background(), g, engine.Options{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	simd := simulate(t, g, Options{})
	var realBusy, simBusy float64
	for _, r := range real.Stages["work"].Replicas {
		realBusy += r.BusySeconds
	}
	for _, r := range simd.Stages["work"].Replicas {
		simBusy += r.BusySeconds
	}
	if math.Abs(simBusy-0.8) > 1e-6 {
		t.Errorf("simulated busy %.4fs, want 0.8s", simBusy)
	}
	if realBusy < 0.95*simBusy || realBusy > 1.5*simBusy {
		t.Errorf("real busy %.3fs against simulated %.3fs: the run did not change its cost as the simulation did", realBusy, simBusy)
	}
}
