package ranks

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
// member sits on one worker, whose loss takes them all; its local rank
// counts the members its share runs, which meet at the one port their
// share picked.
func TestRankPlaceAttempt(t *testing.T) {
	t.Parallel()
	s := &graph.Stage{Name: "train", Replicas: 2}
	if got := keyRank0(s, 0, "w1"); got != "rank0.train.w1" {
		t.Errorf("first attempt: key %q, want rank0.train.w1", got)
	}
	if a, b := keyRank0(s, 2, "w1"), keyRank0(s, 2, "w3-r1"); a != b || a != "rank0.train.a2" {
		t.Errorf("attempt 2: keys %q and %q, want rank0.train.a2 for both", a, b)
	}

	_, nc := clustertest.Server(t)
	js, _ := wire.NewJS(nc)
	g := clustertest.Chain(t, 2)
	work := g.Stage("work")
	ctx := context.Background()
	for _, c := range []struct {
		place []string
		wait  bool
	}{{[]string{"w1", "w2"}, true}, {[]string{"w1", "w1"}, false}} {
		job := &wire.Job{Run: "ranks-" + c.place[1], Remote: map[string][]bool{"a": {true}, "b": {true}},
			Place:   map[string][]string{"src": {"w1"}, "work": c.place, "sink": {"w1"}},
			Timings: wire.Timings{Lease: 2 * time.Second, AckWait: time.Second}}
		ends := clustertest.SetupRun(t, js, job, g)
		pl := &Placer{Job: job, Instance: "w1", Ends: ends, Addr: func() string { return "127.0.0.1:1,10.0.0.1:1" },
			Whole: func(*graph.Stage) bool { return true }}
		p, err := pl.Place(ctx, work, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := 5 * time.Second; c.wait && p.PeerLoss != want || !c.wait && p.PeerLoss != 0 {
			t.Errorf("members on %v: PeerLoss %v, want %v", c.place, p.PeerLoss, map[bool]time.Duration{true: want}[c.wait])
		}
		if p.MasterPort == 0 || p.MasterAddr != "127.0.0.1" {
			t.Errorf("members on %v: rank 0 at %q:%d, want 127.0.0.1 (the data plane's first address) and a port", c.place, p.MasterAddr, p.MasterPort)
		}
		if c.wait {
			if p.LocalRank != 0 || p.LocalWorldSize != 1 {
				t.Errorf("members on %v: rank 0 is local rank %d of %d, want 0 of 1", c.place, p.LocalRank, p.LocalWorldSize)
			}
			continue
		}
		p1, err := pl.Place(ctx, work, 1)
		if err != nil {
			t.Fatal(err)
		}
		if p1.LocalRank != 1 || p1.LocalWorldSize != 2 || p1.MasterPort != p.MasterPort {
			t.Errorf("members on %v: rank 1 is local rank %d of %d, rank 0 at port %d; want 1 of 2, port %d",
				c.place, p1.LocalRank, p1.LocalWorldSize, p1.MasterPort, p.MasterPort)
		}
	}
}
