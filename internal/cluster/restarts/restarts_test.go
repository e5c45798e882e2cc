package restarts

import (
	"slices"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/finished"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/moves"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
)

// kinds registers the kinds the tests' stages run: a group whose state
// moves (mover), one that cannot go on without a member (ranks), stateless
// ones (stepper, worker) and one that keeps state and cannot move
// (keeper).
func kinds() *nodes.Registry {
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "mover", Ports: ports}, Sync: nodes.Always, Moves: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "ranks", Ports: ports}, Sync: nodes.Always, Moves: true, Whole: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "stepper", Ports: ports}, Sync: nodes.Always, Stateless: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "worker", Ports: ports}, Stateless: true})
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "keeper", Ports: ports}})
	return reg
}

// in is an input port: a stage with one restarts as its kind says, a
// source only where it resumes.
var in = []*graph.Port{{Name: "in"}}

// view is the run's view over stages placed as place says, with a share
// of each name given, none lost, and the groups hosted.
func view(stages []*graph.Stage, place map[string][]string, groups map[string]Group, shares ...string) *View {
	v := &View{Graph: &graph.Graph{Stages: stages}, Registry: kinds(), Lease: wire.DefaultLease,
		Place: place, Shares: map[string]*Share{}, Groups: groups}
	if v.Groups == nil {
		v.Groups = map[string]Group{}
	}
	for _, name := range shares {
		v.Shares[name] = &Share{Name: name, Worker: name}
	}
	return v
}

// loseMember loses replica i of s with share, as Lose does for each
// lost replica of a restartable stage (a share the view does not know
// is one on a worker of its name).
func loseMember(b *Book, v *View, share string, s *graph.Stage, i int) (*Loss, error) {
	sh := v.Shares[share]
	if sh == nil {
		sh = &Share{Name: share, Worker: share}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l := &loss{Loss: &Loss{}, b: b, v: v, in: sh}
	err := l.member(s, i)
	return l.Loss, err
}

// TestLoseStaysOrMoves: of a lost share's replicas, one its worker
// recorded settled stays, marked done in a copy of its last snapshot;
// one its last snapshot has done stays; a restartable one restarts,
// named for the log; one that keeps state, not done, fails the run,
// saying why the share is over (its worker silent, or a group's restore
// that needs it back).
func TestLoseStaysOrMoves(t *testing.T) {
	t.Parallel()
	work := &graph.Stage{Name: "work", Node: "stepper", Replicas: 3, Inputs: in}
	keep := &graph.Stage{Name: "keep", Node: "keeper", Replicas: 1, Inputs: in}
	place := map[string][]string{"work": {"w2", "w2", "w1"}, "keep": {"w2"}}
	last := &report.Snapshot{Stages: []report.StageSnapshot{
		{Name: "work", Replicas: []report.ReplicaSnapshot{{}, {}, {}}},
		{Name: "keep", Replicas: []report.ReplicaSnapshot{{Done: true}}}}}
	v := view([]*graph.Stage{work, keep}, place, nil, "w1", "w2")
	v.Shares["w2"].Lost, v.Shares["w2"].Last = true, last
	var b Book
	l := b.Lose(v, "w2", map[finished.Replica]bool{{Stage: "work", I: 0}: true})
	if l.Err != nil {
		t.Fatal(l.Err)
	}
	stay := []finished.Replica{{Stage: "work", I: 0}, {Stage: "keep", I: 0}}
	if !slices.Equal(l.Stay, stay) || !slices.Equal(l.Move, []finished.Replica{{Stage: "work", I: 1}}) || !slices.Equal(l.Said, []string{"work[1]"}) {
		t.Errorf("stay %v, move %v (said %v); want %v staying, work[1] moving", l.Stay, l.Move, l.Said, stay)
	}
	if !finished.Done(l.Last, "work", 0) || finished.Done(last, "work", 0) {
		t.Errorf("work[0], recorded settled: done in the share's last snapshot %v, in the one before %v; want done in a copy only",
			finished.Done(l.Last, "work", 0), finished.Done(last, "work", 0))
	}
	if want := "worker w2 lost (no word from it for"; !strings.HasPrefix(l.Why, want) {
		t.Errorf("why %q, want %q...", l.Why, want)
	}

	v.Shares["w2"].Last, v.Shares["w2"].Evict = nil, "train"
	l = b.Lose(v, "w2", nil)
	if l.Err == nil || !strings.Contains(l.Err.Error(), `counted lost for stage "train"'s restore of its last save (the worker lives): stage "keep" replica 0 (keeper) keeps state and cannot restart elsewhere`) {
		t.Errorf("a replica that keeps state lost, not done: %v", l.Err)
	}
}

// TestLoseUnknownShare: a share the view lacks fails the run with an
// error naming it, and nothing stays or moves.
func TestLoseUnknownShare(t *testing.T) {
	t.Parallel()
	work := &graph.Stage{Name: "work", Node: "stepper", Replicas: 1, Inputs: in}
	v := view([]*graph.Stage{work}, map[string][]string{"work": {"w1"}}, nil, "w1")
	var b Book
	l := b.Lose(v, "w9", nil)
	if l.Err == nil || !strings.Contains(l.Err.Error(), "share w9") || len(l.Stay)+len(l.Move) > 0 {
		t.Errorf("lose a share not in the view: err %v, stay %v, move %v; want an error naming w9 and nothing decided", l.Err, l.Stay, l.Move)
	}
}

// TestLeastLoaded: a restart goes to the live worker running the fewest
// replicas (its restarts' shares counted on it), never one counted gone
// or silent past the lease.
func TestLeastLoaded(t *testing.T) {
	t.Parallel()
	work := &graph.Stage{Name: "work", Node: "worker", Replicas: 4, Inputs: in}
	v := view([]*graph.Stage{work}, map[string][]string{"work": {"w1", "w3-r1", "w3", "w2"}}, nil, "w1", "w2", "w3")
	v.Shares["w3-r1"] = &Share{Name: "w3-r1", Worker: "w3"}
	v.Workers, v.Live = []string{"w1", "w2", "w3"}, map[string]bool{"w1": true, "w3": true}
	if got := v.LeastLoaded(); got != "w1" {
		t.Errorf("least loaded %q, want w1 (w3 runs two, w2 is silent)", got)
	}
	if got := v.LeastLoaded("w1"); got != "w3" {
		t.Errorf("least loaded but w1: %q, want w3", got)
	}
	if got := v.LeastLoaded("w1", "w3"); got != "" {
		t.Errorf("least loaded but w1 and w3: %q, want none (w2 is silent)", got)
	}
}

// TestLoseMember: what a lost member of a group whose state moves makes
// of it: with members left on other workers, the restart goes ahead;
// with every replica on the lost worker (no group across workers), or
// the last members lost, the run fails naming the stage; a stage that
// moves no state restarts either way.
func TestLoseMember(t *testing.T) {
	t.Parallel()
	mover := &graph.Stage{Name: "train", Node: "mover", Replicas: 2}
	stepper := &graph.Stage{Name: "work", Node: "stepper", Replicas: 2}
	v := view([]*graph.Stage{mover, stepper}, map[string][]string{}, nil)
	var b Book
	if _, err := loseMember(&b, v, "w1", mover, 0); err == nil || !strings.Contains(err.Error(), `stage "train" (mover) had every replica of its group there (2)`) {
		t.Errorf("every replica lost, no group across workers: %v", err)
	}
	if _, err := loseMember(&b, v, "w1", stepper, 0); err != nil {
		t.Errorf("a stage that moves no state: %v", err)
	}
	v.Groups["train"] = host.New("train", 2, 1<<20, true)
	if _, err := loseMember(&b, v, "w1", mover, 0); err != nil {
		t.Errorf("a member left on w2: %v", err)
	}
	if _, err := loseMember(&b, v, "w2", mover, 1); err == nil || !strings.Contains(err.Error(), `replica 1 keeps state, and no member of its group is left to take it from`) {
		t.Errorf("the last member lost: %v", err)
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
	setup := func(kind, beside string) (*View, *host.Host) {
		train := &graph.Stage{Name: "train", Node: kind, Replicas: 3, Inputs: in}
		side := &graph.Stage{Name: "side", Node: beside, Replicas: 1, Inputs: in}
		h := host.New("train", 3, 1<<20, true)
		h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
			LastRound: []uint32{3, 3, 3}, Share: []string{"w1", "w2", "w3"}})
		v := view([]*graph.Stage{train, side}, map[string][]string{"train": {"w1", "w2", "w3"}, "side": {"w2"}},
			map[string]Group{"train": h}, "w1", "w2", "w3")
		v.Shares["w1"].Lost = true
		return v, h
	}

	var b Book
	v, h := setup("ranks", "worker")
	l, err := loseMember(&b, v, "w1", v.Graph.Stages[0], 0)
	if err != nil {
		t.Fatalf("a member of a whole group lost: %v", err)
	}
	if !v.Shares["w2"].Lost || !v.Shares["w3"].Lost || !slices.Equal(l.Evicted, []string{"w2", "w3"}) {
		t.Errorf("the other members' shares: w2 lost %v, w3 lost %v, evicted %v; want both counted lost, to restart", v.Shares["w2"].Lost, v.Shares["w3"].Lost, l.Evicted)
	}
	for i := range 3 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if got := strings.Join(l.Log, "\n"); !strings.Contains(got, `stage "train" lost member 0 with worker w1, and its group cannot go on without it: the share w2, on worker w2, restarts too`) {
		t.Errorf("the log says %q, want the restart of w2 said", got)
	}

	b = Book{}
	v, _ = setup("ranks", "keeper")
	_, err = loseMember(&b, v, "w1", v.Graph.Stages[0], 0)
	if err == nil || !strings.Contains(err.Error(), `stage "train" (ranks) lost member 0 with worker w1, and its group cannot go on without it`) ||
		!strings.Contains(err.Error(), `stage "side" replica 0 (keeper)`) {
		t.Errorf("a member beside a replica that cannot move: %v", err)
	}

	b = Book{}
	v, h = setup("mover", "worker")
	if _, err := loseMember(&b, v, "w1", v.Graph.Stages[0], 0); err != nil {
		t.Fatalf("a member of a group that goes on: %v", err)
	}
	if v.Shares["w2"].Lost || v.Shares["w3"].Lost || h.Restoring(1) {
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
	s := &graph.Stage{Name: "train", Node: "mover", Replicas: 3}
	h := host.New("train", 3, 1<<20, true)
	v := view([]*graph.Stage{s}, map[string][]string{}, map[string]Group{"train": h})
	v.Moves = moves.New(map[string]int{"train": 3}, nil)
	var b Book
	v.Moves.Leave("train", 2)
	h.Moved(2)
	if _, err := loseMember(&b, v, "w3", s, 2); err != nil {
		t.Fatal(err)
	}
	if h.AnyDue() || !v.Moves.Leaving("train", 2) {
		t.Errorf("a member a move took away, lost mid-step: due %v, still left by the move %v; want not due, left", h.AnyDue(), v.Moves.Leaving("train", 2))
	}
	// Members 0 and 1 finished; member 1's worker is lost after the move
	// took it away, and it had left last.
	v.Moves.Leave("train", 1)
	h.Moved(1)
	h.LeftLost(0, "w1")
	h.LeftLost(1, "w2-before") // its leave, as the last member
	if _, err := loseMember(&b, v, "w2", s, 1); err != nil {
		t.Fatal(err)
	}
	if v.Moves.Leaving("train", 1) {
		t.Error("the last member to leave, which holds the group's state, is still counted as taken away: its restart would not run it")
	}
	// A member a move took away that is the last present, lost before its
	// leave: its loss is any member's (here the group saves nothing, so
	// the run fails, naming it), not a leave that drops the state.
	h = host.New("train", 3, 1<<20, true)
	v.Groups["train"] = h
	v.Moves.Back("train", 1)
	v.Moves.Leave("train", 2)
	h.Moved(2)
	h.LeftLost(0, "w1")
	h.LeftLost(1, "w2")
	_, err := loseMember(&b, v, "w3", s, 2)
	if err == nil || !strings.Contains(err.Error(), "replica 2 keeps state, and no member of its group is left to take it from") || v.Moves.Leaving("train", 2) {
		t.Errorf("the last member present, which a move took away, lost: %v (still taken away: %v)", err, v.Moves.Leaving("train", 2))
	}
}

// TestLoseWholeTwoOnLostWorker: a group that restarts whole (Whole, a
// torch process group) of 4 members on two workers, two each (two GPUs a
// host). The worker holding members 0 and 1 is lost: Lose loses each of
// its members in turn, as it does here. The group restores its last
// save, every member restarts; the run does not fail.
func TestLoseWholeTwoOnLostWorker(t *testing.T) {
	t.Parallel()
	train := &graph.Stage{Name: "train", Node: "ranks", Replicas: 4, Inputs: in}
	h := host.New("train", 4, 1<<20, true)
	h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
		LastRound: []uint32{3, 3, 3, 3}, Share: []string{"w1", "w1", "w2", "w2"}})
	v := view([]*graph.Stage{train}, map[string][]string{"train": {"w1", "w1", "w2", "w2"}}, map[string]Group{"train": h}, "w1", "w2")
	v.Shares["w1"].Lost = true
	var b Book
	for i := range 2 { // Lose's loop over the lost share's replicas
		if _, err := loseMember(&b, v, "w1", train, i); err != nil {
			t.Fatalf("member %d, lost with worker w1 beside member %d: %v", i, 1-i, err)
		}
	}
	if !v.Shares["w2"].Lost {
		t.Error("the share w2, running members 2 and 3, was not counted lost: the group does not restart whole")
	}
	for i := range 4 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if _, attempt := b.Job(); attempt["train"] != 1 {
		t.Errorf("the group's attempt is %d, want 1", attempt["train"])
	}
}

// TestLoseWholeDuringRestore: a group that restarts whole (Whole) of 3
// members, one a worker, lost whole once (worker w1): every member
// restores. Member 1's restart has joined (its OpJoin answered: it
// restores no longer, its torch process is about to start) while member
// 0's restart has not yet, when member 1's new worker is lost too. The
// group is lost whole again: every member restores its last save, in a
// new attempt; the run does not fail.
func TestLoseWholeDuringRestore(t *testing.T) {
	t.Parallel()
	train := &graph.Stage{Name: "train", Node: "ranks", Replicas: 3, Inputs: in}
	h := host.New("train", 3, 1<<20, true)
	h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 4, Round: 3,
		LastRound: []uint32{3, 3, 3}, Share: []string{"w1", "w2", "w3"}})
	v := view([]*graph.Stage{train}, map[string][]string{"train": {"w1", "w2", "w3"}}, map[string]Group{"train": h},
		"w1", "w2", "w3", "w2-r1")
	v.Shares["w1"].Lost = true
	var b Book
	if _, err := loseMember(&b, v, "w1", train, 0); err != nil {
		t.Fatal(err)
	}
	// member 1 restarted on w2-r1 and joined: its OpJoin answered
	v.Place["train"][1] = "w2-r1"
	join := &nats.Msg{Data: []byte{group.OpJoin, 1, 0, 0, 0}, Header: nats.Header{}} // replica 1
	join.Header.Set(group.HdrShare, "w2-r1")
	h.Handle(join)
	if h.Restoring(1) {
		t.Fatal("member 1's join did not take its restore")
	}
	v.Shares["w2-r1"].Lost = true
	if _, err := loseMember(&b, v, "w2-r1", train, 1); err != nil {
		t.Fatalf("member 1 lost again during the group's restore: %v", err)
	}
	for i := range 3 {
		if !h.Restoring(i) {
			t.Errorf("member %d does not restore the group's last save", i)
		}
	}
	if _, attempt := b.Job(); attempt["train"] != 2 {
		t.Errorf("the group's attempt is %d, want 2 (a new MASTER_PORT: member 1's rank may have met the others' store)", attempt["train"])
	}
}

// TestEvictForRestore: a saving group lost whole, its member 2 having
// finished since the save on a share still counted live, restores with
// that member back: its share is counted lost for it (evicted), when it
// can restart whole. Where it also runs a replica that keeps state and
// cannot restart (and has not finished), or has ended, or is not known,
// the run fails, naming the restore and that replica, not a worker lost
// (its worker lives), and the share is not counted lost.
func TestEvictForRestore(t *testing.T) {
	t.Parallel()
	keepDone := &report.Snapshot{Stages: []report.StageSnapshot{{Name: "keep", Replicas: []report.ReplicaSnapshot{{Done: true}}}}}
	for _, tc := range []struct {
		name  string
		keep  string // where the keep stage runs
		share string // member 2's
		done  bool   // w1 has ended
		last  *report.Snapshot
		err   string // "": w1 evicted
	}{
		{name: "restartable beside it", keep: "w3", share: "w1"},
		{name: "stateful beside it", keep: "w1", share: "w1",
			err: `stage "tally" lost every member of its group, and its restore of its last save needs back member 2, which had finished since, on the share w1 on worker w1, which also runs stage "keep" replica 0 (keeper): that replica keeps state and cannot restart elsewhere, and the share restarts whole`},
		{name: "stateful beside it, finished", keep: "w1", share: "w1", last: keepDone},
		{name: "share ended", keep: "w3", share: "w1", done: true,
			err: `needs back member 2, which had finished since, on the share w1 on worker w1, which has ended, so that the member cannot restart`},
		{name: "share unknown", keep: "w3", share: "w9",
			err: `needs back member 2, which had finished since, on the share w9, which the coordinator does not know`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// rounds 1 and 2 saved, member 2 finished after round 3, then
			// members 0 and 1 lost with w2
			h := host.New("tally", 3, 1<<20, true)
			h.SetState(host.State{Saves: true, Durable: 2, SaveStep: 2, Round: 3,
				LastRound: []uint32{3, 3, 3}, Share: []string{"w2", "w2", tc.share}, Left: []int{2}})
			tally := &graph.Stage{Name: "tally", Node: "mover", Replicas: 3, Inputs: in}
			keep := &graph.Stage{Name: "keep", Node: "keeper", Replicas: 1, Inputs: in}
			v := view([]*graph.Stage{{Name: "src", Node: "worker", Replicas: 1}, tally, keep},
				map[string][]string{"src": {"w3"}, "tally": {"w2", "w2", tc.share}, "keep": {tc.keep}},
				map[string]Group{"tally": h}, "w1", "w2", "w3")
			v.Shares["w2"].Lost = true
			w1 := v.Shares["w1"]
			w1.Done, w1.Last = tc.done, tc.last
			var b Book
			l0, err := loseMember(&b, v, "w2", tally, 0)
			if err != nil {
				t.Fatalf("member 0 lost: %v", err)
			}
			l1, err := loseMember(&b, v, "w2", tally, 1)
			if !h.Restoring(2) {
				t.Fatalf("the group lost whole: member 2 does not restore")
			}
			evicted := append(l0.Evicted, l1.Evicted...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "no word from it") {
					t.Fatalf("the group's restore: %v, want an error saying\n%s", err, tc.err)
				}
				if w1.Lost || len(evicted) > 0 {
					t.Errorf("the share w1 was counted lost (%v), evicted %v", w1.Lost, evicted)
				}
				return
			}
			if err != nil {
				t.Fatalf("the group's restore: %v", err)
			}
			if !w1.Lost || w1.Evict != "tally" || !slices.Equal(evicted, []string{"w1"}) {
				t.Fatalf("the share w1: lost %v, evicted for %q, evicted %v; want it counted lost for the tally's restore", w1.Lost, w1.Evict, evicted)
			}
			if want := `dflow: stage "tally" restores its last save: the share w1, on worker w1, ran member 2, which had finished since and restarts too`; !slices.Contains(l1.Log, want) {
				t.Errorf("the log:\n%s\nwant\n%s", strings.Join(l1.Log, "\n"), want)
			}
		})
	}
}

// TestFirstNoteBeforeASave: a local group's first note, sent before its
// first save (step -1), is a group with nothing to restore: it starts
// again, everything it trained on comes back. Taken for a save of step 0
// (the zero note it replaced read as one), the restart of a group lost
// before its first save's note failed to restore it ("restores its save
// of step 0, but the checkpoint holds step 4"). A restored group's first
// note, from its new share, still keeps the save it restored.
func TestFirstNoteBeforeASave(t *testing.T) {
	t.Parallel()
	var b Book
	b.Note(wire.SavesNote{Share: "w2", Stage: "drafter", Saves: true, Step: -1})
	if r, ok := b.restoreFor("drafter"); !ok || r.Step != -1 {
		t.Errorf("before any save: restore %+v (%v), want step -1", r, ok)
	}
	if step, ok := b.LastSave("drafter"); ok {
		t.Errorf("before any save: LastSave %d", step)
	}
	b.Note(wire.SavesNote{Share: "w2", Stage: "drafter", Saves: true, Step: 4, Skip: [][]string{{"a"}}})
	b.Note(wire.SavesNote{Share: "w3-r1", Stage: "drafter", Saves: true, Step: -1})
	if r, ok := b.restoreFor("drafter"); !ok || r.Step != 4 || !slices.Equal(r.Skip[0], []string{"a"}) {
		t.Errorf("restored, before its first save: restore %+v (%v), want step 4 skipping a", r, ok)
	}
	if step, ok := b.LastSave("drafter"); !ok || step != 4 {
		t.Errorf("restored: LastSave %d (%v), want 4", step, ok)
	}
}
