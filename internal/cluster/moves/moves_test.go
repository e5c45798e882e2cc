package moves

import (
	"slices"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
)

// spec: a source, then a (3 replicas) and b (1) sharing a budget, then a
// sink.
const spec = `
stage "src" {
  node = "synthetic_source"
  config {
    count = 10
  }
}
stage "a" {
  node     = "synthetic_work"
  replicas = 3
}
stage "b" {
  node = "synthetic_work"
}
stage "sink" {
  node = "sink"
}
edge "in" {
  from = src.out
  to   = a.in
}
edge "mid" {
  from = a.out
  to   = b.in
}
edge "out" {
  from = b.out
  to   = sink.in
}
rebalance {
  stages = ["a", "b"]
}
`

// setup is the spec placed a on w1, w1, w2 and b on w2 with its slots
// after each stage's own replicas, as the coordinator places them: the
// book, the graph with the slots, where each replica runs, and a
// snapshot with every replica running and every slot parked.
func setup(t *testing.T) (*Book, *graph.Graph, map[string][]string, *report.Snapshot) {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: nodes.Default}).Load("moves.hcl", []byte(spec))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	place := map[string][]string{"src": {"w1"}, "a": {"w1", "w1", "w2"}, "b": {"w2"}, "sink": {"w2"}}
	sl := Slots([]string{"a", "b"}, place, []string{"w1", "w2"})
	b := New(map[string]int{"a": 3, "b": 1}, sl)
	g, err := wire.WithSlots(g, b.Parked())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		place[name] = append(place[name], sl[name]...)
	}
	s := &report.Snapshot{}
	for _, st := range g.Stages {
		ss := report.StageSnapshot{Name: st.Name}
		for i := range st.Replicas {
			ss.Replicas = append(ss.Replicas, report.ReplicaSnapshot{Worker: place[st.Name][i], Parked: i >= st.Replicas-b.parked[st.Name]})
		}
		s.Stages = append(s.Stages, ss)
	}
	for _, e := range g.Edges {
		es := report.EdgeSnapshot{Name: e.Name, From: e.From.Stage.Name, To: e.To.Stage.Name}
		for _, q := range e.Queues {
			es.Queues = append(es.Queues, report.QueueSnapshot{Producers: q.Producers, Consumers: q.Consumers, Open: q.Producers})
		}
		s.Edges = append(s.Edges, es)
	}
	return b, g, place, s
}

// TestSlotsFollowDevices: each rebalanced stage gets, on each worker, as
// many spare slots as the rebalanced replicas placed there, so that any
// device may go to any of the stages.
func TestSlotsFollowDevices(t *testing.T) {
	place := map[string][]string{"a": {"w1", "w1", "w2"}, "b": {"w2"}, "c": {"w3"}}
	got := Slots([]string{"a", "b"}, place, []string{"w1", "w2", "w3"})
	want := []string{"w1", "w1", "w2", "w2"}
	if !slices.Equal(got["a"], want) || !slices.Equal(got["b"], want) || got["c"] != nil {
		t.Errorf("slots %v, want a and b each on %v and none for c (not rebalanced, and w3 has no rebalanced replica)", got, want)
	}
	b := New(map[string]int{"a": 3, "b": 1}, got)
	if !slices.Equal(b.SlotsOf("a"), []int{3, 4, 5, 6}) || !slices.Equal(b.SlotsOf("b"), []int{1, 2, 3, 4}) || b.SlotsOf("c") != nil {
		t.Errorf("slot indices a %v b %v c %v: want the replicas after each stage's own", b.SlotsOf("a"), b.SlotsOf("b"), b.SlotsOf("c"))
	}
}

// TestPickKeepsOne: a move takes the highest replica of its stage that
// runs on a worker where another of that stage keeps running, and starts
// a parked slot of the other stage on that worker; a worker's last
// replica of a stage is never taken (its share's side of the stage's
// input holds what it fetched for it), nor one a move of the same plan
// took, and the log is told why once.
func TestPickKeepsOne(t *testing.T) {
	b, _, place, s := setup(t)
	ms := []report.Move{{From: "a", To: "b", Replicas: 2}}
	plan, why := b.Plan(s, ms, place)
	if len(plan) != 1 || plan[0] != (Unit{Move: 0, From: "a", To: "b", Leave: 1, Start: 1, Inst: "w1"}) {
		t.Fatalf("plan %+v: want a[1] (w1's second) to leave and b's slot 1 (on w1) to start", plan)
	}
	if len(why) != 1 || !strings.Contains(why[0], "1 of the 2 replicas a -> b") {
		t.Errorf("why %q: want it to say 1 of 2 could move", why)
	}
	if _, again := b.Plan(s, ms, place); len(again) != 0 {
		t.Errorf("the same reason said twice: %q", again)
	}
	b.Made(plan[0])
	ms[0].Replicas = 1
	if !b.Record(ms, 2.5) {
		t.Error("a move made not recorded")
	}
	// a[1] left: a[0] is now w1's last replica of a, and w2's a[2] too.
	if more, _ := b.Plan(s, []report.Move{{From: "a", To: "b", Replicas: 1}}, place); len(more) != 0 {
		t.Errorf("a second move took a worker's last replica: %+v", more)
	}
	if plan, why := b.Plan(s, []report.Move{{To: "b", Replicas: 1}}, place); len(plan) != 0 || len(why) != 1 || !strings.Contains(why[0], "no device") {
		t.Errorf("a move from the spare budget: plan %+v why %q; want none, saying it has no device", plan, why)
	}
	started, released, left := b.Job()
	if !slices.Equal(started["b"], []int{1}) || len(released) != 0 || !slices.Equal(left["a"], []int{1}) {
		t.Errorf("a restart is told started %v released %v left %v; want b's slot 1 started and a[1] left", started, released, left)
	}
	if !b.Leaving("a", 1) || b.Said("a", 1) != "a[1] (which a move took away: not run again)" || b.Said("b", 2) != "" || b.Said("b", 1) != "b[1]" {
		t.Errorf("restart lines: %q %q %q", b.Said("a", 1), b.Said("b", 2), b.Said("b", 1))
	}
	b.Back("a", 1) // it held its group's state when lost: it restarts
	if b.Leaving("a", 1) {
		t.Error("a replica brought back is still counted as taken away")
	}
}

// TestVisibleOrder: a user sees each rebalanced stage's own replicas,
// then the slots in the order moves started them (a started slot not yet
// running shows as a fresh replica), never the slots no move started,
// nor those among an edge's producers; and the moves made.
func TestVisibleOrder(t *testing.T) {
	b, g, _, s := setup(t)
	// Slot 4 of b (on w2) starts first, then slot 1 (on w1).
	b.Made(Unit{From: "a", To: "b", Leave: 2, Start: 4, Inst: "w2"})
	b.Made(Unit{From: "a", To: "b", Leave: 1, Start: 1, Inst: "w1"})
	b.Record([]report.Move{{From: "a", To: "b", Replicas: 2}}, 1)
	s.Stage("b").Replicas[1].Parked = false
	s.Stage("b").Replicas[1].ItemsIn = 7
	v := b.Visible(s, g)
	st := v.Stage("b")
	if len(st.Replicas) != 3 || !st.Rebalanced || st.Replicas[1].Parked || st.Replicas[1].Worker != "w2" || st.Replicas[2].ItemsIn != 7 {
		t.Errorf("b as seen: %+v; want its own, then slot 4 (not yet running: fresh, on w2), then slot 1", st.Replicas)
	}
	if len(v.Stage("a").Replicas) != 3 {
		t.Errorf("a shows %d replicas: want its own 3 (no slot of a started)", len(v.Stage("a").Replicas))
	}
	for _, e := range v.Edges {
		if e.Name == "mid" && !slices.Equal(e.Queues[0].Producers, []int{0, 1, 2}) {
			t.Errorf("edge mid's producers as seen: %v; want a's own, not its parked slots", e.Queues[0].Producers)
		}
	}
	if len(v.Moves) != 1 || v.Moves[0].T != 1 || len(s.Moves) != 0 {
		t.Errorf("moves as seen %+v (the snapshot given changed: %v)", v.Moves, s.Moves)
	}
}

// TestReleaseOnceInputsEnd: a stage's slots are let go once every
// replica feeding its input is done, as the share that runs it says (a
// done that its share has not said is not enough); every live share
// running one of its slots is asked until it has said so; once the run
// is over, every stage's are.
func TestReleaseOnceInputsEnd(t *testing.T) {
	b, g, place, s := setup(t)
	v := View{Place: place, Said: map[string]bool{"w1": false, "w2": true}, Live: map[string]bool{"w1": true, "w2": true}}
	s.Stage("src").Replicas[0].Done = true
	if asks := b.Release(s, g, v, false); len(asks) != 0 {
		t.Errorf("released on a done its share (w1) has not said: %v", asks)
	}
	v.Said["w1"] = true
	asks := b.Release(s, g, v, false)
	if len(asks) != 2 || !slices.Equal(asks["w1"], []string{"a"}) || !slices.Equal(asks["w2"], []string{"a"}) {
		t.Fatalf("asks %v: want a's slots let go on w1 and w2, b's kept (a still runs)", asks)
	}
	b.Told("a", "w1")
	v.Live["w2"] = false // lost: its restart is told by its job
	if asks := b.Release(s, g, v, false); len(asks) != 0 {
		t.Errorf("asked again %v: w1 said it did, w2 is lost", asks)
	}
	if _, released, _ := b.Job(); !slices.Equal(released, []string{"a"}) {
		t.Errorf("a restart is told released %v, want [a]", released)
	}
	v.Live["w2"] = true
	asks = b.Release(s, g, v, true)
	if !slices.Equal(asks["w1"], []string{"b"}) || !slices.Equal(asks["w2"], []string{"a", "b"}) {
		t.Errorf("at the run's end: asks %v; want b's everywhere, and a's where not yet said", asks)
	}
}

// TestReportLeavesOutSlots: the run's report shows a rebalanced stage's
// own replicas and the slots that ran (items through them, or a
// lifetime), as one process does; a slot that never ran (no move started
// it, or it was let go before it started) is left out of the stage's
// replicas and of its edges' producers and consumers.
func TestReportLeavesOutSlots(t *testing.T) {
	b := New(map[string]int{"b": 2}, map[string][]string{"b": {"w1", "w2", "w2"}}) // slots 2, 3, 4
	rep := &report.Report{
		Stages: map[string]report.Stage{"b": {Replicas: []report.Replica{
			{Index: 0}, {Index: 1}, {Index: 2, ItemsIn: 5}, {Index: 3}, {Index: 4, BusySeconds: 0.5}}}},
		Edges: map[string]report.Edge{
			"in":  {From: "a", To: "b", Queues: []report.Queue{{Producers: []int{0}, Consumers: []int{0, 1, 2, 3, 4}}}},
			"out": {From: "b", To: "c", Queues: []report.Queue{{Producers: []int{0, 1, 2, 3, 4}, Consumers: []int{0}}}},
		}}
	b.Report(rep)
	var got []int
	for _, r := range rep.Stages["b"].Replicas {
		got = append(got, r.Index)
	}
	if want := []int{0, 1, 2, 4}; !slices.Equal(got, want) {
		t.Errorf("b's replicas in the report: %v, want %v (its own, and the slots that ran)", got, want)
	}
	if q := rep.Edges["in"].Queues[0]; !slices.Equal(q.Consumers, []int{0, 1, 2, 4}) || !slices.Equal(q.Producers, []int{0}) {
		t.Errorf("edge in: producers %v, consumers %v; want a's 0, b's 0, 1, 2 and 4", q.Producers, q.Consumers)
	}
	if q := rep.Edges["out"].Queues[0]; !slices.Equal(q.Producers, []int{0, 1, 2, 4}) || !slices.Equal(q.Consumers, []int{0}) {
		t.Errorf("edge out: producers %v, consumers %v; want b's 0, 1, 2 and 4, c's 0", q.Producers, q.Consumers)
	}
}
