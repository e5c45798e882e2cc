package cluster

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/moves"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// TestLoseMember: what the coordinator makes of a lost member of a group
// whose state moves: with members left on other workers, the restart goes
// ahead; with every replica on the lost worker (no group across workers),
// or the last members lost, the run fails naming the stage; a stage that
// moves no state restarts either way.
func TestLoseMember(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "mover", Ports: ports}, Sync: nodes.Always, Moves: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "stepper", Ports: ports}, Sync: nodes.Always, Stateless: true})
	mover := &graph.Stage{Name: "train", Node: "mover", Replicas: 2}
	stepper := &graph.Stage{Name: "work", Node: "stepper", Replicas: 2}
	c := &Coordinator{o: CoordOptions{Registry: reg}, groups: map[string]*host.Host{}}
	w1, w2 := &instance{name: "w1", worker: "w1"}, &instance{name: "w2", worker: "w2"}
	if err := c.loseMember(w1, mover, 0); err == nil || !strings.Contains(err.Error(), `stage "train" (mover) had every replica of its group there (2)`) {
		t.Errorf("every replica lost, no group across workers: %v", err)
	}
	if err := c.loseMember(w1, stepper, 0); err != nil {
		t.Errorf("a stage that moves no state: %v", err)
	}
	c.groups["train"] = host.New("train", 2, 1<<20, true)
	if err := c.loseMember(w1, mover, 0); err != nil {
		t.Errorf("a member left on w2: %v", err)
	}
	if err := c.loseMember(w2, mover, 1); err == nil || !strings.Contains(err.Error(), `replica 1 keeps state, and no member of its group is left to take it from`) {
		t.Errorf("the last member lost: %v", err)
	}
}

// TestRestartPassesOverGoneWorker: a worker lost at the same time as
// another, not yet silent for a lease, may be picked for the first one's
// restart; nobody answers the request to it (its connection is gone), and
// the restart goes to the next live worker instead of failing the run.
func TestRestartPassesOverGoneWorker(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "stepper", Ports: ports}, Stateless: true, Resumes: true}) // restartable, wired or not
	g := &graph.Graph{Stages: []*graph.Stage{{Name: "src", Node: "stepper", Replicas: 1}, {Name: "work", Node: "stepper", Replicas: 3}}}
	conn := connector(t)
	nc := conn()
	var log strings.Builder // written by recover, in this goroutine
	js, _ := wire.NewJS(nc) // no end bucket: what finished cannot be read, so all restart
	c := &Coordinator{o: CoordOptions{Registry: reg, Conn: nc, Log: &log, Timings: wire.Timings{Lease: time.Minute}}, g: g, js: js,
		run: "r1", workers: []string{"w1", "w2", "w3"}, groups: map[string]*host.Host{},
		place:     map[string][]string{"src": {"w1"}, "work": {"w1", "w2", "w3"}},
		instances: map[string]*instance{"w1": {name: "w1", worker: "w1"}, "w2": {name: "w2", worker: "w2"}, "w3": {name: "w3", worker: "w3"}},
		seen:      map[string]time.Time{"w1": time.Now(), "w3": time.Now()}}
	// w1 answers; w3, the least loaded, has gone: nobody listens for it
	started := make(chan string, 1)
	w1 := conn()
	sub, err := w1.Subscribe(wire.SubjRun("w1"), func(m *nats.Msg) {
		var j wire.Job
		json.Unmarshal(m.Data, &j)
		started <- j.Instance
		m.Respond([]byte("{}"))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// the server has w1's subscription before the coordinator asks (a
	// Subscribe returns before, and the request then met "no
	// responders": w1 too counted gone)
	if err := w1.Flush(); err != nil {
		t.Fatal(err)
	}
	c.instances["w2"].lost = true
	if err := c.recover(c.instances["w2"]); err != nil {
		t.Fatalf("recover: %v\n%s", err, log.String())
	}
	if inst := <-started; c.place["work"][1] != inst || !strings.HasPrefix(inst, "w1-") {
		t.Errorf("work[1] placed on %q, w1 started %q; want a restart on w1", c.place["work"][1], inst)
	}
	for name := range c.instances {
		if strings.HasPrefix(name, "w3-") {
			t.Errorf("the restart that never started is still an instance: %s", name)
		}
	}
	if out := log.String(); !strings.Contains(out, "restarting work[1] on w3") || !strings.Contains(out, "worker w3 did not answer (gone too): restarting work[1] elsewhere") {
		t.Errorf("log:\n%s", out)
	}
}

// connector starts a server for the test and returns a way to connect
// to it, each connection closed at the test's end.
func connector(t *testing.T) func() *nats.Conn {
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return func() *nats.Conn {
		nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// TestLoseWhole: a group that cannot go on without a member (Spec.Whole,
// a plugin's group kind that restores: a torch process group cannot
// shrink) loses every member with one: the shares that run the others
// are counted lost too (they restart), and the group restores its last
// save, each member told its step. A share that cannot restart whole (it
// also runs a replica that keeps state and cannot move) fails the run,
// naming the stage, the member and the share. Without Whole the members
// left go on, as any group's do.
func TestLoseWhole(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "ranks", Ports: ports}, Sync: nodes.Always, Moves: true, Whole: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "mover", Ports: ports}, Sync: nodes.Always, Moves: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "worker", Ports: ports}, Stateless: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "keeper", Ports: ports}})
	setup := func(kind, beside string) (*Coordinator, *host.Host, map[string]*instance) {
		in := []*graph.Port{{Name: "in"}}
		train := &graph.Stage{Name: "train", Node: kind, Replicas: 3, Inputs: in}
		side := &graph.Stage{Name: "side", Node: beside, Replicas: 1, Inputs: in}
		h := host.New("train", 3, 1<<20, true)
		h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
			LastRound: []uint32{3, 3, 3}, Share: []string{"w1", "w2", "w3"}})
		ins := map[string]*instance{}
		for _, w := range []string{"w1", "w2", "w3"} {
			ins[w] = &instance{name: w, worker: w}
		}
		var log syncLog
		c := &Coordinator{o: CoordOptions{Registry: reg, Log: &log, Timings: wire.Timings{}.WithDefaults()},
			g:      &graph.Graph{Stages: []*graph.Stage{train, side}},
			place:  map[string][]string{"train": {"w1", "w2", "w3"}, "side": {"w2"}},
			groups: map[string]*host.Host{"train": h}, instances: ins}
		return c, h, ins
	}

	c, h, ins := setup("ranks", "worker")
	ins["w1"].lost = true
	if err := c.loseMember(ins["w1"], c.g.Stages[0], 0); err != nil {
		t.Fatalf("a member of a whole group lost: %v", err)
	}
	if !ins["w2"].lost || !ins["w3"].lost || len(c.evicted) != 2 {
		t.Errorf("the other members' shares: w2 lost %v, w3 lost %v, %d evicted; want both counted lost, to restart", ins["w2"].lost, ins["w3"].lost, len(c.evicted))
	}
	for i := range 3 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if got := c.o.Log.(*syncLog).String(); !strings.Contains(got, `stage "train" lost member 0 with worker w1, and its group cannot go on without it: the share w2, on worker w2, restarts too`) {
		t.Errorf("the log says %q, want the restart of w2 said", got)
	}

	c, _, ins = setup("ranks", "keeper")
	ins["w1"].lost = true
	err := c.loseMember(ins["w1"], c.g.Stages[0], 0)
	if err == nil || !strings.Contains(err.Error(), `stage "train" (ranks) lost member 0 with worker w1, and its group cannot go on without it`) ||
		!strings.Contains(err.Error(), `stage "side" replica 0 (keeper)`) {
		t.Errorf("a member beside a replica that cannot move: %v", err)
	}

	c, h, ins = setup("mover", "worker")
	ins["w1"].lost = true
	if err := c.loseMember(ins["w1"], c.g.Stages[0], 0); err != nil {
		t.Fatalf("a member of a group that goes on: %v", err)
	}
	if ins["w2"].lost || ins["w3"].lost || h.Restoring(1) {
		t.Error("a group that is not whole stopped its other members")
	}
}

// TestLoseMovedMember: a member a move took away, lost with its worker,
// leaves its group (whether its leave had come or not): no member is
// asked for a state for it, and its restart does not run it (it stays
// among the replicas that left). But one that left its group last, and
// so holds the group's state for the final save, restarts: it is no
// longer counted as taken away.
func TestLoseMovedMember(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "mover", Ports: ports}, Sync: nodes.Always, Moves: true})
	s := &graph.Stage{Name: "train", Node: "mover", Replicas: 3}
	h := host.New("train", 3, 1<<20, true)
	c := &Coordinator{o: CoordOptions{Registry: reg}, groups: map[string]*host.Host{"train": h},
		moves: moves.New(map[string]int{"train": 3}, nil)}
	c.moves.Leave("train", 2)
	h.Moved(2)
	if err := c.loseMember(&instance{name: "w3", worker: "w3"}, s, 2); err != nil {
		t.Fatal(err)
	}
	if h.AnyDue() || !c.moves.Leaving("train", 2) {
		t.Errorf("a member a move took away, lost mid-step: due %v, still left by the move %v; want not due, left", h.AnyDue(), c.moves.Leaving("train", 2))
	}
	// Members 0 and 1 finished; member 1's worker is lost after the move
	// took it away, and it had left last.
	c.moves.Leave("train", 1)
	h.Moved(1)
	h.LeftLost(0, "w1")
	h.LeftLost(1, "w2-before") // its leave, as the last member
	if err := c.loseMember(&instance{name: "w2", worker: "w2"}, s, 1); err != nil {
		t.Fatal(err)
	}
	if c.moves.Leaving("train", 1) {
		t.Error("the last member to leave, which holds the group's state, is still counted as taken away: its restart would not run it")
	}
	// A member a move took away that is the last present, lost before its
	// leave: its loss is any member's (here the group saves nothing, so
	// the run fails, naming it), not a leave that drops the state.
	h = host.New("train", 3, 1<<20, true)
	c.groups["train"] = h
	c.moves.Back("train", 1)
	c.moves.Leave("train", 2)
	h.Moved(2)
	h.LeftLost(0, "w1")
	h.LeftLost(1, "w2")
	err := c.loseMember(&instance{name: "w3", worker: "w3"}, s, 2)
	if err == nil || !strings.Contains(err.Error(), "replica 2 keeps state, and no member of its group is left to take it from") || c.moves.Leaving("train", 2) {
		t.Errorf("the last member present, which a move took away, lost: %v (still taken away: %v)", err, c.moves.Leaving("train", 2))
	}
}
