package share

import (
	"context"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
)

// TestRankPlaceAttempt: the ranks of a group's first attempt meet at the
// rank 0 that its share records under its own name; those of a later
// attempt (the group lost whole and started again: Job.Attempt) meet at
// the attempt's, whatever share their jobs name for rank 0, so a member
// sent its job before rank 0's share was placed does not meet the old
// one. A rank of a group that restarts whole waits for a lost peer's
// restart (PeerLoss) where its group spans workers, and not where every
// member sits on one worker, whose loss takes them all.
func TestRankPlaceAttempt(t *testing.T) {
	t.Parallel()
	s := &graph.Stage{Name: "train", Replicas: 2}
	if got := keyRank0(s, 0, "w1"); got != "rank0.train.w1" {
		t.Errorf("first attempt: key %q, want rank0.train.w1", got)
	}
	if a, b := keyRank0(s, 2, "w1"), keyRank0(s, 2, "w3-r1"); a != b || a != "rank0.train.a2" {
		t.Errorf("attempt 2: keys %q and %q, want rank0.train.a2 for both", a, b)
	}

	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := clustertest.Chain(t, 2)
	work := g.Stage("work")
	for _, c := range []struct {
		place []string
		wait  bool
	}{{[]string{"w1", "w2"}, true}, {[]string{"w1", "w1"}, false}} {
		job := &wire.Job{Run: "ranks-" + c.place[1], Remote: map[string][]bool{"a": {true}, "b": {true}},
			Place:   map[string][]string{"src": {"w1"}, "work": c.place, "sink": {"w1"}},
			Timings: wire.Timings{Lease: 2 * time.Second, AckWait: time.Second}}
		setUp(t, js, job, g)
		l := shareOf(t, nc, js, job, g, "w1")
		l.whole = func(*graph.Stage) bool { return true }
		p, err := l.rankPlace(context.Background(), work, groupReplica{i: 0})
		if err != nil {
			t.Fatal(err)
		}
		if want := 5 * time.Second; c.wait && p.PeerLoss != want || !c.wait && p.PeerLoss != 0 {
			t.Errorf("members on %v: PeerLoss %v, want %v", c.place, p.PeerLoss, map[bool]time.Duration{true: want}[c.wait])
		}
		if p.MasterPort == 0 || p.MasterAddr == "" {
			t.Errorf("members on %v: rank 0 at %q:%d, want an address and a port", c.place, p.MasterAddr, p.MasterPort)
		}
	}
}
