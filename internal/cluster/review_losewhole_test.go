package cluster

import (
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// TestReviewLoseWholeTwoOnLostWorker: a group that restarts whole (Whole,
// a torch process group) of 4 members on two workers, two each (two GPUs
// a host). The worker holding members 0 and 1 is lost: recover calls
// loseMember for each of its members in turn, as it does here. The group
// restores its last save, every member restarts; the run does not fail.
func TestReviewLoseWholeTwoOnLostWorker(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "ranks", Ports: ports}, Sync: nodes.Always, Moves: true, Whole: true})
	in := []*graph.Port{{Name: "in"}}
	train := &graph.Stage{Name: "train", Node: "ranks", Replicas: 4, Inputs: in}
	h := host.New("train", 4, 1<<20, true)
	h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
		LastRound: []uint32{3, 3, 3, 3}, Share: []string{"w1", "w1", "w2", "w2"}})
	ins := map[string]*instance{"w1": {name: "w1", worker: "w1"}, "w2": {name: "w2", worker: "w2"}}
	var log syncLog
	c := &Coordinator{o: CoordOptions{Registry: reg, Log: &log, Timings: wire.Timings{}.WithDefaults()},
		g:      &graph.Graph{Stages: []*graph.Stage{train}},
		place:  map[string][]string{"train": {"w1", "w1", "w2", "w2"}},
		groups: map[string]*host.Host{"train": h}, instances: ins}
	ins["w1"].lost = true
	for i := range 2 { // recover's loop over the lost share's replicas
		if err := c.loseMember(ins["w1"], train, i); err != nil {
			t.Fatalf("member %d, lost with worker w1 beside member %d: %v", i, 1-i, err)
		}
	}
	if !ins["w2"].lost {
		t.Error("the share w2, running members 2 and 3, was not counted lost: the group does not restart whole")
	}
	for i := range 4 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if c.attempts["train"] != 1 {
		t.Errorf("the group's attempt is %d, want 1", c.attempts["train"])
	}
}

// TestReviewLoseWholeDuringRestore: a group that restarts whole (Whole) of
// 3 members, one a worker, lost whole once (worker w1): every member
// restores. Member 1's restart has joined (its opJoin answered: it
// restores no longer, its torch process is about to start) while member
// 0's restart has not yet, when member 1's new worker is lost too. The
// group is lost whole again: every member restores its last save, in a
// new attempt; the run does not fail.
func TestReviewLoseWholeDuringRestore(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "ranks", Ports: ports}, Sync: nodes.Always, Moves: true, Whole: true})
	train := &graph.Stage{Name: "train", Node: "ranks", Replicas: 3, Inputs: []*graph.Port{{Name: "in"}}}
	h := host.New("train", 3, 1<<20, true)
	h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
		LastRound: []uint32{3, 3, 3}, Share: []string{"w1", "w2", "w3"}})
	ins := map[string]*instance{}
	for _, w := range []string{"w1", "w2", "w3", "w2-r1"} {
		ins[w] = &instance{name: w, worker: w}
	}
	var log syncLog
	c := &Coordinator{o: CoordOptions{Registry: reg, Log: &log, Timings: wire.Timings{}.WithDefaults()},
		g:      &graph.Graph{Stages: []*graph.Stage{train}},
		place:  map[string][]string{"train": {"w1", "w2", "w3"}},
		groups: map[string]*host.Host{"train": h}, instances: ins}
	ins["w1"].lost = true
	if err := c.loseMember(ins["w1"], train, 0); err != nil {
		t.Fatal(err)
	}
	// member 1 restarted on w2-r1 and joined: its opJoin answered
	c.place["train"][1] = "w2-r1"
	join := &nats.Msg{Data: []byte{4, 1, 0, 0, 0}, Header: nats.Header{}} // opJoin, replica 1
	join.Header.Set("Dflow-Share", "w2-r1")
	h.Handle(join)
	if h.Restoring(1) {
		t.Fatal("member 1's join did not take its restore")
	}
	ins["w2-r1"].lost = true
	if err := c.loseMember(ins["w2-r1"], train, 1); err != nil {
		t.Fatalf("member 1 lost again during the group's restore: %v", err)
	}
	for i := range 3 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if c.attempts["train"] != 2 {
		t.Errorf("the group's attempt is %d, want 2 (a new MASTER_PORT: member 1's rank may have met the others' store)", c.attempts["train"])
	}
}
