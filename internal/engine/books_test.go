package engine

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// losing is a fifo transport that loses the last item it holds when it is
// closed (when lose is set), as a broken transport might; closing also
// opens gate.
type losing struct {
	Transport // the fifo's Send and Recv
	f         *fifo
	lose      bool
	gate      chan struct{}
}

func (l *losing) Close() {
	l.f.mu.Lock()
	if l.lose && len(l.f.items) > 0 {
		l.f.items = l.f.items[:len(l.f.items)-1]
	}
	l.f.mu.Unlock()
	l.f.Close()
	close(l.gate)
}

// gatedSink reads its input to the end once gate is open: every item is
// in the transport by then.
type gatedSink struct{ gate chan struct{} }

func (g gatedSink) Run(ctx context.Context, r nodes.Replica) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		if _, err := r.In("in").Recv(ctx); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// TestBooksLostItem: a run whose transport loses an item on its way ends
// failed, naming the edge and its counts, where it ended ok before (every
// replica returned cleanly and no queue held an item); the same run with
// nothing lost ends ok.
func TestBooksLostItem(t *testing.T) {
	t.Parallel()
	for _, lose := range []bool{false, true} {
		h := newHarness(t)
		gate := make(chan struct{})
		h.reg.Register(nodes.Spec{Kind: graph.Kind{Name: "gated_sink", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}}, New: func(*graph.Config) (nodes.Node, error) { return gatedSink{gate}, nil }})
		g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 20
  }
}
stage "sink" {
  node = "gated_sink"
}
edge "a" {
  from     = src.out
  to       = sink.in
  capacity = 32
}
`)
		tr := func(e *graph.Edge, i int) Transport {
			f := newFIFO(e.Capacity)
			return &losing{Transport: f, f: f, lose: lose, gate: gate}
		}
		rep, err := h.run(g, Options{Transport: tr})
		if !lose {
			if err != nil || rep.Status != report.OK {
				t.Fatalf("nothing lost: status %s, err %v", rep.Status, err)
			}
			continue
		}
		want := `books do not balance: edge "a": 20 produced, 19 consumed (`
		var u *Unbalanced
		if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("one item lost: err %v, want one starting %q", err, want)
		}
		if rep.Status != report.Failed || rep.Error != err.Error() {
			t.Errorf("one item lost: report status %s, error %q", rep.Status, rep.Error)
		}
	}
}

// TestCheckBooks: the check on a report's counts names every edge (or
// stage) whose counts disagree: produced against consumed, against what
// a source emits in all, against what the producing stage sent (each
// edge of a port as the port's first), and consumed against what the
// consuming stage took.
func TestCheckBooks(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 10
  }
}
stage "work" {
  node = "t"
  replicas = 2
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
stage "tap" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}
edge "c" {
  from = work.out
  to   = tap.in
}
`)
	totals := map[string]int64{"src": 10}
	// balanced: work filters 10 down to 6 (3 a replica), sent onto both
	// of its port's edges
	base := func() *report.Report {
		rep := &report.Report{Status: report.OK, Edges: map[string]report.Edge{
			"a": {Produced: 10, Consumed: 10},
			"b": {Produced: 6, Consumed: 6},
			"c": {Produced: 6, Consumed: 6},
		}, Stages: map[string]report.Stage{
			"src":  {Replicas: []report.Replica{{ItemsOut: 10}}},
			"work": {Replicas: []report.Replica{{ItemsIn: 4, ItemsOut: 3}, {ItemsIn: 6, ItemsOut: 3}}},
			"sink": {Replicas: []report.Replica{{ItemsIn: 6}}},
			"tap":  {Replicas: []report.Replica{{ItemsIn: 6}}},
		}}
		return rep
	}
	if err := CheckBooks(g, base(), totals); err != nil {
		t.Fatalf("balanced books: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*report.Report)
		want   []string
	}{
		{"consumed fewer", func(r *report.Report) {
			r.Edges["b"] = report.Edge{Produced: 6, Consumed: 5}
			r.Stages["sink"] = report.Stage{Replicas: []report.Replica{{ItemsIn: 5}}}
		}, []string{`edge "b": 6 produced, 5 consumed`}},
		{"the source's total", func(r *report.Report) {
			r.Edges["a"] = report.Edge{Produced: 9, Consumed: 9}
			r.Stages["src"] = report.Stage{Replicas: []report.Replica{{ItemsOut: 9}}}
			r.Stages["work"].Replicas[1] = report.Replica{ItemsIn: 5, ItemsOut: 3}
		}, []string{`edge "a": 9 produced, stage "src" emits 10 in all`}},
		{"taken", func(r *report.Report) {
			r.Stages["sink"] = report.Stage{Replicas: []report.Replica{{ItemsIn: 5}}}
		}, []string{`edge "b": 6 consumed, stage "sink" took 5`}},
		{"sent, and a fan-out's edges apart", func(r *report.Report) {
			r.Edges["c"] = report.Edge{Produced: 7, Consumed: 7}
			r.Stages["tap"] = report.Stage{Replicas: []report.Replica{{ItemsIn: 7}}}
			r.Stages["work"].Replicas[0] = report.Replica{ItemsIn: 4, ItemsOut: 4}
		}, []string{`edge "c": 7 produced, edge "b" from the same port 6`,
			`edge "b": 6 produced, stage "work" sent 7`, `edge "c": 7 produced, stage "work" sent 7`}},
		{"several at once, in the spec's order", func(r *report.Report) {
			r.Edges["a"] = report.Edge{Produced: 10, Consumed: 9}
			r.Edges["c"] = report.Edge{Produced: 6, Consumed: 4}
			r.Stages["tap"] = report.Stage{Replicas: []report.Replica{{ItemsIn: 4}}}
		}, []string{`edge "a": 10 produced, 9 consumed`, `edge "c": 6 produced, 4 consumed`,
			`edge "a": 9 consumed, stage "work" took 10`}},
	} {
		rep := base()
		tc.change(rep)
		err := CheckBooks(g, rep, totals)
		var u *Unbalanced
		if !errors.As(err, &u) {
			t.Errorf("%s: err %v, want the books unbalanced", tc.name, err)
			continue
		}
		if strings.Join(u.Lines, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s: lines\n%s\nwant\n%s", tc.name, strings.Join(u.Lines, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

// TestBooksThrough: where a stage's kind sends one item on each output for
// each it takes (nodes.Spec.OneForOne), the books carry through it: an item
// it took and settled without sending on unbalances them though every edge
// balances on its own (the audit's loss: a stage took 300, sent 296, each
// edge counting what it carried). A stage not so marked may filter.
func TestBooksThrough(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 300
  }
}
stage "a" {
  node = "t"
  replicas = 2
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "e1" {
  from = src.out
  to   = a.in
}
edge "e2" {
  from = a.out
  to   = sink.in
}
`)
	rep := &report.Report{Status: report.OK, Edges: map[string]report.Edge{
		"e1": {Produced: 300, Consumed: 300},
		"e2": {Produced: 296, Consumed: 296},
	}, Stages: map[string]report.Stage{
		"src":  {Replicas: []report.Replica{{ItemsOut: 300}}},
		"a":    {Replicas: []report.Replica{{ItemsIn: 150, ItemsOut: 146}, {ItemsIn: 150, ItemsOut: 150}}},
		"sink": {Replicas: []report.Replica{{ItemsIn: 296}}},
	}}
	totals := map[string]int64{"src": 300}
	if err := CheckBooks(g, rep, totals); err != nil {
		t.Fatalf("a filtering stage's books: %v", err)
	}
	err := CheckBooksThrough(g, rep, totals, map[string]bool{"a": true})
	var u *Unbalanced
	if !errors.As(err, &u) {
		t.Fatalf("err %v, want the books unbalanced through stage a", err)
	}
	want := `stage "a": its in edges consumed 300, its out edge "e2" produced 296 (it sends one item for each it takes)`
	if strings.Join(u.Lines, "\n") != want {
		t.Errorf("lines\n%s\nwant\n%s", strings.Join(u.Lines, "\n"), want)
	}
}
