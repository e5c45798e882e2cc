package figures

import (
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// TestQueueDepthAsLastRead: a queue's depth in the cluster's snapshot is
// the reading of the share, among those running one of its ends, that the
// coordinator had last. The source's share, done early, read the queue
// full; its consumer's share, done at the end, read it empty: the run's
// last status line shows it empty (the largest reading showed it full at
// 100%). A share that runs neither end has no say.
func TestQueueDepthAsLastRead(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 1) // src -a-> work -b-> sink
	r := &Run{Registry: nodes.Default, Graph: g,
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w2"}}}
	snap := func(depthA, depthB int) *report.Snapshot {
		s := &report.Snapshot{}
		for _, e := range g.Edges {
			d := depthA
			if e.Name == "b" {
				d = depthB
			}
			s.Edges = append(s.Edges, report.EdgeSnapshot{Name: e.Name, Queues: []report.QueueSnapshot{{Depth: d}}})
		}
		for _, st := range g.Stages {
			s.Stages = append(s.Stages, report.StageSnapshot{Name: st.Name, Replicas: make([]report.ReplicaSnapshot, st.Replicas)})
		}
		return s
	}
	t0 := time.Now()
	r.Shares = []*Share{
		{Name: "w1", Worker: "w1", Last: snap(8, 0), LastAt: t0},
		{Name: "w2", Worker: "w2", Last: snap(0, 0), LastAt: t0.Add(time.Second)},
		{Name: "w3", Worker: "w3", Last: snap(5, 5), LastAt: t0.Add(2 * time.Second)},
	}
	depth := func() (int, int) {
		s := Snapshot(r, time.Now())
		return s.Edges[0].Queues[0].Depth, s.Edges[1].Queues[0].Depth // a, b
	}
	if a, b := depth(); a != 0 || b != 0 {
		t.Errorf("at the end: depths a=%d b=%d, want 0 0 (as w2 read them last)", a, b)
	}
	// mid-run: the consumer's share had the queue half full, read after
	// the producer's share read it full
	r.Shares[1].Last = snap(4, 1)
	if a, b := depth(); a != 4 || b != 1 {
		t.Errorf("mid-run: depths a=%d b=%d, want 4 1", a, b)
	}
	// every share done: a remote queue as its stream has it then
	r.End.Depth = map[[2]int]int{{0, 0}: 0}
	if a, b := depth(); a != 0 || b != 1 {
		t.Errorf("every share done: depths a=%d b=%d, want 0 (the stream's) 1", a, b)
	}
}

// TestSettleLost: a lost share's replicas of a restartable stage are
// counted so that the stage adds up to what its edges' streams say: an
// item the lost share took and had not settled was done again by the
// share that took over (counted twice by the shares' own figures), and one
// it settled after its last snapshot is in no snapshot. The difference
// goes to the lost share's part, never below nothing.
func TestSettleLost(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 2)
	edges := map[string]report.Edge{"a": {Produced: 20, Consumed: 20}, "b": {Produced: 20, Consumed: 20}}
	for _, tc := range []struct {
		name         string
		live, lost   [2]int64 // replica 0 was lost once and restarted; replica 1 never was
		want0, want1 int64
	}{
		{"done twice", [2]int64{6, 8}, [2]int64{10, 0}, 12, 8},     // 4 of the lost share's 10 were done again
		{"settled late", [2]int64{6, 8}, [2]int64{3, 0}, 12, 8},    // 3 of its 6 settled after its last snapshot
		{"all done again", [2]int64{12, 8}, [2]int64{5, 0}, 12, 8}, // none of its 5 settled: nothing left to it
	} {
		reps := []report.Replica{
			{ItemsIn: tc.live[0] + tc.lost[0], ItemsOut: tc.live[0] + tc.lost[0]},
			{ItemsIn: tc.live[1] + tc.lost[1], ItemsOut: tc.live[1] + tc.lost[1]},
		}
		settleLost(g, g.Stage("work"), reps, tc.lost[:], tc.lost[:], edges)
		if reps[0].ItemsIn != tc.want0 || reps[1].ItemsIn != tc.want1 || reps[0].ItemsOut != tc.want0 || reps[1].ItemsOut != tc.want1 {
			t.Errorf("%s: replicas took %d and %d, sent %d and %d; want %d and %d each way",
				tc.name, reps[0].ItemsIn, reps[1].ItemsIn, reps[0].ItemsOut, reps[1].ItemsOut, tc.want0, tc.want1)
		}
	}
}

// TestSettleLostTogether: a replica's taking and sending are settled
// together. Both replicas of work were lost once and restarted; replica
// 1's last snapshot there had taken an item it had not sent yet, which its
// restart did again: the stage took one item too many, and that one is
// replica 1's, not replica 0's, whose lost part is larger (given to the
// largest, replica 0 took 11 and sent 12). An item taken and sent twice
// comes off both counts of one replica.
func TestSettleLostTogether(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 2)
	edges := map[string]report.Edge{"a": {Produced: 20, Consumed: 20}, "b": {Produced: 20, Consumed: 20}}
	for _, tc := range []struct {
		name            string
		lostIn, lostOut [2]int64
		liveIn, liveOut [2]int64
		wantIn, wantOut [2]int64
	}{
		{"in hand at the last snapshot", [2]int64{7, 4}, [2]int64{7, 3}, [2]int64{5, 5}, [2]int64{5, 5}, [2]int64{12, 8}, [2]int64{12, 8}},
		{"done twice", [2]int64{7, 4}, [2]int64{7, 4}, [2]int64{5, 5}, [2]int64{5, 5}, [2]int64{11, 9}, [2]int64{11, 9}},
		// one too many taken on one replica, sent on the other: nothing
		// lost in common, so each count's surplus comes off on its own
		{"nothing in common", [2]int64{2, 0}, [2]int64{0, 2}, [2]int64{10, 10}, [2]int64{10, 10}, [2]int64{10, 10}, [2]int64{10, 10}},
		// 3 taken and sent too many, 1 of them in common
		{"partly in common", [2]int64{3, 0}, [2]int64{1, 2}, [2]int64{10, 10}, [2]int64{10, 10}, [2]int64{10, 10}, [2]int64{10, 10}},
	} {
		reps := make([]report.Replica, 2)
		for i := range reps {
			reps[i] = report.Replica{ItemsIn: tc.liveIn[i] + tc.lostIn[i], ItemsOut: tc.liveOut[i] + tc.lostOut[i]}
		}
		settleLost(g, g.Stage("work"), reps, tc.lostIn[:], tc.lostOut[:], edges)
		for i, r := range reps {
			if r.ItemsIn != tc.wantIn[i] || r.ItemsOut != tc.wantOut[i] {
				t.Errorf("%s: replica %d took %d and sent %d, want %d and %d", tc.name, i, r.ItemsIn, r.ItemsOut, tc.wantIn[i], tc.wantOut[i])
			}
		}
	}
}
