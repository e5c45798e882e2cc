package engine

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// movingSpec: a source of count items, then stages a (3 replicas of 1ms)
// and b (1 replica of 3ms) of the stateless synthetic_work, sharing a
// budget of 4 replicas, then a sink that records every item.
const movingSpec = `
stage "src" {
  node = "t"
  config {
    role  = "source"
    count = %COUNT%
  }
}
stage "a" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "1ms"
  }
}
stage "b" {
  node = "synthetic_work"
  config {
    service_time = "3ms"
  }
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "in" {
  from = src.out
  to   = a.in
}
edge "mid" {
  from = a.out
  to   = b.in
}
edge "done" {
  from = b.out
  to   = sink.in
}
rebalance {
  stages = ["a", "b"]
}
`

// TestRebalanceMove: a move made while the run goes takes two replicas of
// a, which finish their item in hand and leave, and starts two of b on
// their devices: every item reaches the sink exactly once, the books
// balance, and the report lists the replicas that left and those that
// started, each with its own items.
func TestRebalanceMove(t *testing.T) {
	h := newHarness(t)
	g := h.load(strings.Replace(movingSpec, "%COUNT%", "600", 1))
	var mu sync.Mutex
	var made []bool
	asked := false
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		if asked || s.Stages[1].Replicas[0].ItemsIn < 20 {
			return nil, nil
		}
		asked = true
		return []report.Move{{From: "a", To: "b", Replicas: 2}}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			made = append(made, ok)
		}
	}
	// With a series: its points take the replicas that started as they
	// come.
	// Every snapshot lists as the edge's producers the replicas of b that
	// have started, as b's own figures do: a spare still parked neither
	// holds the edge open nor has finished with it (the status line's
	// "open:" note named every started replica once spares were counted).
	var lastSnap *report.Snapshot
	var producers []string
	observe := func(s *report.Snapshot) {
		lastSnap = s
		for _, e := range s.Edges {
			if e.Name == "done" {
				if n, want := len(e.Queues[0].Producers), len(s.Stage("b").Replicas); n != want && len(producers) < 3 {
					producers = append(producers, fmt.Sprintf("%d producers listed for %d replicas of b started", n, want))
				}
			}
		}
	}
	rep, err := h.run(g, Options{Rebalance: policy, Interval: 20 * time.Millisecond, Observe: observe})
	if len(producers) > 0 {
		t.Errorf("the edge from b, as snapshots list it: %v", producers)
	}
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	h.deliveredOnce("sink", 600)
	checkBalanced(t, rep)
	if last := rep.Series[len(rep.Series)-1]; len(last.Utilization["b"]) != 3 {
		t.Errorf("the series' last point has %d utilizations of b, want 3", len(last.Utilization["b"]))
	}
	// The series gives the stages' sizes (the split), and the snapshots
	// the moves made so far.
	first, last := rep.Series[0].Replicas, rep.Series[len(rep.Series)-1].Replicas
	if first["a"] != 3 || first["b"] != 1 || last["a"] != 1 || last["b"] != 3 || len(first) != 2 {
		t.Errorf("sizes: first point %v, last %v; want a 3, b 1 then a 1, b 3 (the sink's not given)", first, last)
	}
	if lastSnap == nil || len(lastSnap.Moves) != 1 || lastSnap.Moves[0].From != "a" || lastSnap.Moves[0].Replicas != 2 {
		t.Errorf("the last snapshot's moves: %+v, want the one made", lastSnap)
	}
	if len(made) != 1 || !made[0] {
		t.Fatalf("moves made: %v, want one made", made)
	}
	a, b := rep.Stages["a"].Replicas, rep.Stages["b"].Replicas
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("report: %d replicas of a and %d of b, want 3 (two left) and 3 (two started)", len(a), len(b))
	}
	var inA, inB int64
	for _, r := range a {
		inA += r.ItemsIn
	}
	for i, r := range b {
		inB += r.ItemsIn
		if r.Index != i || r.ItemsIn == 0 || r.Device != "cpu" {
			t.Errorf("b replica %d: %+v; want items taken on the device it took over", i, r)
		}
	}
	if inA != 600 || inB != 600 {
		t.Errorf("items in: a %d, b %d; want 600 each", inA, inB)
	}
	life := func(r report.Replica) float64 { return r.BusySeconds + r.IdleSeconds + r.BlockedSeconds }
	if life(a[2]) >= life(a[0]) || life(a[1]) >= life(a[0]) || life(b[1]) >= life(b[0]) {
		t.Errorf("lifetimes: a %.3f %.3f %.3f, b %.3f %.3f %.3f; want a[1], a[2] to leave early and b[1] to start late",
			life(a[0]), life(a[1]), life(a[2]), life(b[0]), life(b[1]), life(b[2]))
	}
}

// TestRebalanceSpare: a budget larger than the split the stages start
// with: a move from the spare (From "") starts replicas at once, without
// one leaving.
func TestRebalanceSpare(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(strings.Replace(movingSpec, "%COUNT%", "600", 1), `stages = ["a", "b"]`, "stages   = [\"a\", \"b\"]\n  replicas = 6", 1)
	g := h.load(src)
	var mu sync.Mutex
	asked, made := false, false
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		if asked || s.Stages[2].Replicas[0].ItemsIn < 10 {
			return nil, nil
		}
		asked = true
		return []report.Move{{From: "", To: "b", Replicas: 2}}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			made = ok
		}
	}
	rep, err := h.run(g, Options{Rebalance: policy})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	h.deliveredOnce("sink", 600)
	checkBalanced(t, rep)
	a, b := rep.Stages["a"].Replicas, rep.Stages["b"].Replicas
	if !made || len(a) != 3 || len(b) != 3 || b[1].ItemsIn == 0 || b[2].ItemsIn == 0 {
		t.Errorf("made %v; %d replicas of a, b %+v", made, len(a), b)
	}
}

// TestRebalanceMoveGroup: the replicas of a stateless kind that step
// together move too: the one that leaves leaves the group after its last
// step, the one that starts joins it, and no step hangs; every item
// reaches the sink exactly once.
func TestRebalanceMoveGroup(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(movingSpec, "%COUNT%", "600", 1)
	g := h.load(strings.Replace(strings.Replace(src, `service_time = "3ms"`, "service_time = \"3ms\"\n    sync = true", 1),
		`service_time = "1ms"`, "service_time = \"1ms\"\n    sync = true", 1))
	var mu sync.Mutex
	n, made := 0, 0
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n%5 != 0 {
			return nil, nil
		}
		m := report.Move{From: "a", To: "b", Replicas: 1}
		if n%10 == 0 {
			m = report.Move{From: "b", To: "a", Replicas: 1}
		}
		return []report.Move{m}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			if ok {
				made++
			}
		}
	}
	rep, err := h.run(g, Options{Rebalance: policy})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	h.deliveredOnce("sink", 600)
	checkBalanced(t, rep)
	if made < 2 {
		t.Errorf("%d moves made, want several", made)
	}
}

// TestRebalanceMovesBackAndForth: moves every tick, one way then the
// other, until the parked replicas run out: every item still reaches the
// sink exactly once, and a move the engine cannot make (the last replica
// of a stage, more parked replicas than there are) is refused.
func TestRebalanceMovesBackAndForth(t *testing.T) {
	h := newHarness(t)
	g := h.load(strings.Replace(movingSpec, "%COUNT%", "1500", 1))
	var mu sync.Mutex
	made, refused, n := 0, 0, 0
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		n++
		m := report.Move{From: "a", To: "b", Replicas: 1}
		switch {
		case n%2 == 0:
			m = report.Move{From: "b", To: "a", Replicas: 1}
		case n == 5:
			m.Replicas = 3 // a keeps one: it has at most 3 to give, never all
		}
		return []report.Move{m}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			if ok {
				made++
			} else {
				refused++
			}
		}
	}
	rep, err := h.run(g, Options{Rebalance: policy})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	h.deliveredOnce("sink", 1500)
	checkBalanced(t, rep)
	if made < 4 || refused == 0 {
		t.Errorf("%d moves made, %d refused; want several made, and some refused", made, refused)
	}
	t.Logf("%d moves made, %d refused; a has %d replicas in the report, b %d", made, refused, len(rep.Stages["a"].Replicas), len(rep.Stages["b"].Replicas))
}

// TestRebalanceMovable: a stage whose kind keeps state without handing it
// over, or whose group restarts whole, does not move during a run: New
// and Movable say which and why, at the stage's node; a group kind whose
// state moves does.
func TestRebalanceMovable(t *testing.T) {
	h := newHarness(t)
	src := strings.Replace(movingSpec, "%COUNT%", "10", 1)
	g := h.load(strings.Replace(src, "stage \"b\" {\n  node = \"synthetic_work\"\n  config {\n    service_time = \"3ms\"\n  }", "stage \"b\" {\n  node = \"t\"", 1))
	if _, err := New(g, Options{Registry: h.reg, Rebalance: func(*report.Snapshot) ([]report.Move, func(bool)) { return nil, nil }}); err == nil ||
		!strings.Contains(err.Error(), `rebalance: test.hcl:17:10: stage "b": its replicas keep state between items (node kind t)`) {
		t.Errorf("a kind that keeps state: %v", err)
	}
	if err := Movable(h.load(src), h.reg); err != nil {
		t.Errorf("stateless stages: %v", err)
	}
	// A group kind whose state moves moves; one that restarts whole (a
	// torch process group's fixed world size) does not.
	for _, whole := range []bool{false, true} {
		name := map[bool]string{false: "moves", true: "whole"}[whole]
		ports := func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, Type: "id"}}
		}
		h.reg.Register(nodes.Spec{Kind: graph.Kind{Name: name, Ports: ports}, Sync: nodes.Always, Moves: true, Whole: whole,
			New: func(*graph.Config) (nodes.Node, error) { return nil, fmt.Errorf("not run") }})
		err := Movable(h.load(strings.Replace(src, "stage \"b\" {\n  node = \"synthetic_work\"\n  config {\n    service_time = \"3ms\"\n  }",
			"stage \"b\" {\n  node = \""+name+"\"", 1)), h.reg)
		if whole != (err != nil) || whole && !strings.Contains(err.Error(), `test.hcl:17:10: stage "b": its group restarts whole (node kind whole`) {
			t.Errorf("a group kind, whole %v: %v", whole, err)
		}
	}
	// Without a policy nothing is parked: the run is as it was.
	rep, err := h.run(h.load(src), Options{})
	if err != nil || len(rep.Stages["b"].Replicas) != 1 {
		t.Errorf("no policy: %v, %d replicas of b", err, len(rep.Stages["b"].Replicas))
	}
}
