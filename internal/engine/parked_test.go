package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// TestMoveAcross: an engine's part of a run across hosts that moves
// replicas (parked.go), in one engine. Its graph has a spare slot of each
// rebalanced stage (a[3], b[1]), parked; a's is let go before the run
// starts (made as it starts, not a crash); a move asked while the run
// goes takes a[2] off and starts b[1] once a[2] has returned; the run
// ends once every slot has started or been let go, every item once. A
// spare slot for a stage not in the graph is an error.
func TestMoveAcross(t *testing.T) {
	h := newHarness(t)
	g, diags := h.load(strings.Replace(movingSpec, "%COUNT%", "600", 1)).With(graph.SetReplicas("a", 4), graph.SetReplicas("b", 2))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if _, err := New(g, Options{Registry: h.reg, Parked: map[string]int{"nope": 1}}); err == nil || !strings.Contains(err.Error(), `stage "nope", which is not in the graph`) {
		t.Errorf("a slot of an unknown stage: %v", err)
	}
	p, err := New(g, Options{Registry: h.reg, Parked: map[string]int{"a": 1, "b": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Release("a"); n != 0 {
		t.Errorf("released %d before the run started, want 0 then (at its start)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type result struct {
		rep *report.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := p.Execute(ctx)
		done <- result{rep, err}
	}()
	poll := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
		}
	}
	poll("b taking items", func() bool {
		b := p.Snapshot().Stage("b")
		return b != nil && b.Replicas[0].ItemsIn >= 20
	})
	if err := p.Move("a", 2, "b", 1); err != nil {
		t.Fatalf("move: %v", err)
	}
	if err := p.Move("a", 2, "b", 1); err == nil {
		t.Error("the same move twice: no error")
	}
	poll("b[1] started", func() bool { return !p.Snapshot().Stage("b").Replicas[1].Parked })
	if n := p.Release("b"); n != 0 {
		t.Errorf("released %d of b, whose only slot started", n)
	}
	r := <-done
	if r.err != nil || r.rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", r.err, r.rep.Status)
	}
	h.deliveredOnce("sink", 600)
	checkBalanced(t, r.rep)
	a, b := r.rep.Stages["a"].Replicas, r.rep.Stages["b"].Replicas
	if len(a) != 4 || len(b) != 2 || b[1].ItemsIn == 0 || a[3].ItemsIn != 0 || a[2].ItemsIn >= a[0].ItemsIn {
		t.Errorf("report: a %+v\nb %+v\nwant a[2] to leave early, b[1] to take items, a[3] never to start", a, b)
	}
}

// TestLeftHere: Options.Left names the replicas a move took away on every
// worker; an engine takes only its own out of their queues at its start.
// One in another engine (a[1] here) was never counted among this
// engine's consumers: taken out too, the queue's last consumer here
// would seem gone while one still reads it.
func TestLeftHere(t *testing.T) {
	h := newHarness(t)
	g, diags := h.load(strings.Replace(movingSpec, "%COUNT%", "10", 1)).With(graph.SetReplicas("a", 4), graph.SetReplicas("b", 2))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := New(g, Options{Registry: h.reg, Parked: map[string]int{"a": 1, "b": 1}, Left: map[string][]int{"a": {1, 2}},
		Here:      func(s *graph.Stage, i int) bool { return s.Name != "a" || i != 1 },
		Transport: func(e *graph.Edge, i int) Transport { return newFIFO(e.Capacity) }})
	if err != nil {
		t.Fatal(err)
	}
	a := p.r.stage("a").replicas
	if a[1].gone || !a[2].gone {
		t.Errorf("a[1] (in another engine) gone %v, a[2] (here) gone %v; want false, true", a[1].gone, a[2].gone)
	}
}
