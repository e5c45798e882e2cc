package figures

import (
	"errors"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// booksShare is one share's figures for TestBooks: work's replicas'
// items in and out, and, for a share not lost, what its engine counted of
// the source and the edges.
type booksShare struct {
	name         string
	lost         bool
	srcOut       int64
	workIn       [2]int64
	workOut      [2]int64
	sinkIn       int64
	aOut, aIn    int64 // edge a produced, consumed
	bOut, bIn    int64
	ranWorkIndex []int // a lost share's work replicas
}

// TestBooks: the coordinator's merged report of a run that would end ok
// fails where its books do not balance, naming the edge and the counts;
// a run whose shares and streams agree ends ok, lost share or not. src
// emits 6000 in all on edge a to work (2 replicas, restartable), which
// sends on edge b to sink.
func TestBooks(t *testing.T) {
	t.Parallel()
	g, err := clustertest.Loader(nodes.Default)(&wire.Job{Filename: "books.hcl", Src: []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 6000
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 2
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
}
`)})
	if err != nil {
		t.Fatal(err)
	}
	w1 := booksShare{name: "w1", srcOut: 6000, aOut: 6000}
	w2 := func(in1, out1 int64) booksShare { // work and sink, work's replica 1 as given
		return booksShare{name: "w2", workIn: [2]int64{3000, in1}, workOut: [2]int64{3000, out1}, sinkIn: 3000 + out1,
			aIn: 3000 + in1, bOut: 3000 + out1, bIn: 3000 + out1}
	}
	sinkTook := func(sh booksShare, n int64) booksShare { sh.sinkIn, sh.bIn = n, n; return sh }
	stream := func(a, b int64) map[string]Stream {
		return map[string]Stream{"a": {Stored: a}, "b": {Stored: b}}
	}
	for _, tc := range []struct {
		name    string
		shares  []booksShare
		streams map[string]Stream // nil: edges in process, counted by the engines
		want    []string          // the unbalanced lines; none: ok
	}{
		{"balanced in process", []booksShare{w1, w2(3000, 3000)}, nil, nil},
		{"balanced on streams", []booksShare{w1, w2(3000, 3000)}, stream(6000, 6000), nil},
		// the engines: 6 items sent on a, never received
		{"lost in process", []booksShare{w1, w2(2994, 2994)}, nil,
			[]string{`edge "a": 6000 produced, 5994 consumed`}},
		// the stream stored and acked 6000, work's engine took 5994
		{"acked, never taken", []booksShare{w1, w2(2994, 2994)}, stream(6000, 5994),
			[]string{`edge "a": 6000 consumed, stage "work" took 5994`,
				`stage "work": its in edges consumed 6000, its out edge "b" produced 5994 (it sends one item for each it takes)`}},
		// the audit's loss: work took every item and settled it, 6 never
		// sent on, every edge balanced on its own; work sends one for
		// each it takes (synthetic_work), so the books carry through it
		{"taken and settled, never sent on", []booksShare{w1, func() booksShare {
			sh := w2(3000, 2994)
			sh.sinkIn, sh.bIn, sh.bOut = 5994, 5994, 5994
			return sh
		}()}, stream(6000, 5994),
			[]string{`stage "work": its in edges consumed 6000, its out edge "b" produced 5994 (it sends one item for each it takes)`}},
		// the source sent 6000, the stream holds 5994
		{"never stored", []booksShare{w1, w2(2994, 2994)}, stream(5994, 5994),
			[]string{`edge "a": 5994 produced, stage "src" emits 6000 in all`, `edge "a": 5994 produced, stage "src" sent 6000`}},
		// work's replica 1 lost after its last snapshot had 100 in and
		// out, 6 of them settled; its restart took again the 94 it had
		// not settled: the lost part is settled to what the streams say
		{"a lost share settled", []booksShare{w1, sinkTook(w2(2994, 2994), 6000),
			{name: "w3", lost: true, workIn: [2]int64{0, 100}, workOut: [2]int64{0, 100}, ranWorkIndex: []int{1}}},
			stream(6000, 6000), nil},
		// the live shares alone took 6050 of a stream of 6000: no
		// correction of the lost part (50) makes that up
		{"more than the stream, lost share or not", []booksShare{w1, sinkTook(w2(3050, 3050), 6000),
			{name: "w3", lost: true, workIn: [2]int64{0, 50}, workOut: [2]int64{0, 50}, ranWorkIndex: []int{1}}},
			stream(6000, 6000),
			[]string{`edge "b": 6000 produced, stage "work" sent 6050`, `edge "a": 6000 consumed, stage "work" took 6050`}},
	} {
		r := booksRun(g, tc.shares)
		r.End.Streams = tc.streams
		rep, err := Report(r, "", nil)
		if len(tc.want) == 0 {
			if err != nil || rep.Status != report.OK {
				t.Errorf("%s: status %s, err %v, want ok", tc.name, rep.Status, err)
			}
			continue
		}
		var u *engine.Unbalanced
		if !errors.As(err, &u) || rep.Status != report.Failed || rep.Error != err.Error() {
			t.Errorf("%s: status %s, err %v, want failed with the books", tc.name, rep.Status, err)
			continue
		}
		if got := strings.Join(u.Lines, "\n"); got != strings.Join(tc.want, "\n") {
			t.Errorf("%s: lines\n%s\nwant\n%s", tc.name, got, strings.Join(tc.want, "\n"))
		}
	}
	// a run that failed, or was cut short, is not judged by its books
	rep, err := Report(booksRun(g, []booksShare{w1, w2(2994, 2994)}), report.Aborted, nil)
	if err != nil || rep.Status != report.Aborted {
		t.Errorf("aborted: status %s, err %v", rep.Status, err)
	}
}

// booksRun is g's run as the coordinator knows it with every share's last
// figures: src on w1, work and sink on w2 (work's replicas restarted there
// from a lost share where one is given).
func booksRun(g *graph.Graph, shares []booksShare) *Run {
	r := &Run{Registry: nodes.Default, Graph: g,
		Place:  map[string][]string{"src": {"w1"}, "work": {"w2", "w2"}, "sink": {"w2"}},
		Remote: map[string][]bool{"a": {true}, "b": {true}}}
	for _, sh := range shares {
		reps := func(n []int64, in bool) []report.Replica {
			var out []report.Replica
			for i, v := range n {
				r := report.Replica{Index: i, ItemsOut: v}
				if in {
					r = report.Replica{Index: i, ItemsIn: v}
				}
				out = append(out, r)
			}
			return out
		}
		work := make([]report.Replica, 2)
		for i := range work {
			work[i] = report.Replica{Index: i, ItemsIn: sh.workIn[i], ItemsOut: sh.workOut[i]}
		}
		rep := &report.Report{Status: report.OK, Stages: map[string]report.Stage{
			"src":  {Node: "synthetic_source", Replicas: reps([]int64{sh.srcOut}, false)},
			"work": {Node: "synthetic_work", Replicas: work},
			"sink": {Node: "sink", Replicas: reps([]int64{sh.sinkIn}, true)},
		}, Edges: map[string]report.Edge{"a": {Produced: sh.aOut, Consumed: sh.aIn}, "b": {Produced: sh.bOut, Consumed: sh.bIn}}}
		snap := &report.Snapshot{Stages: []report.StageSnapshot{
			{Name: "src", Source: true, Total: 6000, Replicas: []report.ReplicaSnapshot{{ItemsOut: sh.srcOut}}},
			{Name: "work", Replicas: []report.ReplicaSnapshot{{ItemsIn: sh.workIn[0], ItemsOut: sh.workOut[0]}, {ItemsIn: sh.workIn[1], ItemsOut: sh.workOut[1]}}},
			{Name: "sink", Replicas: []report.ReplicaSnapshot{{ItemsIn: sh.sinkIn}}},
		}, Edges: []report.EdgeSnapshot{{Name: "a", Produced: sh.aOut, Consumed: sh.aIn}, {Name: "b", Produced: sh.bOut, Consumed: sh.bIn}}}
		in := &Share{Name: sh.name, Worker: sh.name, Last: snap}
		if sh.lost {
			in.Lost, in.Ran = true, map[string][]int{"work": sh.ranWorkIndex}
		} else {
			in.Report = rep
		}
		r.Shares = append(r.Shares, in) // by name, as given
	}
	return r
}
