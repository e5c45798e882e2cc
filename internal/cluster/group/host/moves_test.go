package host

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
)

// movesGroup is a hosted group of 3 members whose state moves and that
// saves, with one rebalance slot (replica 3) parked, each member on a
// share of its own (w0..w3), as a cluster's rebalance has it.
type movesGroup struct {
	t       *testing.T
	ctx     context.Context
	h       *Host
	members []*group.Member
	states  []*weights
	mu      sync.Mutex
	held    []string
}

func newMovesGroup(t *testing.T) *movesGroup {
	t.Helper()
	conn := clustertest.Connector(t)
	host := conn()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	g := &movesGroup{t: t, ctx: ctx, h: New("train", 4, host.MaxPayload(), true),
		held: make([]string, 4)}
	g.h.Park([]int{3})
	serve(t, host, g.h, "train")
	for i := range 4 {
		share := fmt.Sprintf("w%d", i)
		g.members = append(g.members, &group.Member{NC: conn(), Subject: "dflow.r.r.grp.train", Share: share,
			Held: func(i int) string { g.mu.Lock(); defer g.mu.Unlock(); return g.held[i] }})
		g.states = append(g.states, &weights{w: []float32{0}})
	}
	for i := range 3 {
		if err := g.members[i].Saves(ctx, i); err != nil {
			t.Fatal(err)
		}
		if err := g.members[i].Keep(ctx, i, g.states[i]); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// step runs one step of members ids, each with item "it<k>-<i>" in hand,
// and returns their errors.
func (g *movesGroup) step(k int, ids ...int) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for j, i := range ids {
		wg.Go(func() {
			g.mu.Lock()
			g.held[i] = fmt.Sprintf("it%d-%d", k, i)
			g.mu.Unlock()
			v := nodes.Floats{1}
			if _, err := g.members[i].AllReduce(g.ctx, i, v); err != nil {
				errs[j] = err
				return
			}
			g.states[i].w[0] += v[0]
			g.states[i].step++
		})
	}
	wg.Wait()
	return errs
}

func (g *movesGroup) mustStep(k int, ids ...int) {
	g.t.Helper()
	for _, err := range g.step(k, ids...) {
		if err != nil {
			g.t.Fatal(err)
		}
	}
}

// saveThenMove2 steps members 0, 1 and 2 twice, with a save of the
// first step between (round 1), then lets member 2 leave by a move.
func (g *movesGroup) saveThenMove2() {
	g.t.Helper()
	g.mustStep(0, 0, 1, 2)
	if err := g.members[0].Saved(g.ctx, 0, 1); err != nil {
		g.t.Fatal(err)
	}
	g.mustStep(1, 0, 1, 2)
	g.h.Moved(2)
	if last, err := g.members[2].Leave(g.ctx, 2); err != nil || last {
		g.t.Fatalf("member 2's leave: last %v, err %v", last, err)
	}
}

// joinSlot starts slot 3 by a move: its Keep, whose result comes on the
// channel, waits for the group's state once this returns.
func (g *movesGroup) joinSlot() <-chan error {
	g.t.Helper()
	g.members[3].Joins(3)
	joined := make(chan error, 1)
	go func() { joined <- g.members[3].Keep(g.ctx, 3, g.states[3]) }()
	g.waitJoiner(3)
	return joined
}

// arriveAlone has member i arrive in the next step with item in hand,
// alone, and never hear the answer (its worker is lost): it returns once
// the host has the arrival.
func (g *movesGroup) arriveAlone(i int, item string, v float32) {
	g.t.Helper()
	g.mu.Lock()
	g.held[i] = item
	g.mu.Unlock()
	go g.members[i].AllReduce(g.ctx, i, nodes.Floats{v}) // never answered: lost
	testutil.Eventually(g.t, 10*time.Second, func() bool {
		g.h.mu.Lock()
		defer g.h.mu.Unlock()
		return len(g.h.arrived) == 1
	}, "member %d arriving", i)
}

// waitJoiner waits until member i's join waits for the group's state.
func (g *movesGroup) waitJoiner(i int) {
	g.t.Helper()
	testutil.Eventually(g.t, 10*time.Second, func() bool {
		g.h.mu.Lock()
		defer g.h.mu.Unlock()
		return g.h.joiner[i] != nil
	}, "member %d waiting for the group's state", i)
}

// TestMovedMemberDrops: a member that a move takes away leaves at a step
// boundary; lost after its leave (its worker killed while it waits for
// the final save), what it kept for a save comes back, from a shared
// queue to whichever member takes it, which asks the host whether it was
// trained (Member.Trained): its items are, the one before the save in a
// save already (round 0), the one after it not yet; an item nobody
// trained is not. A slot a move started takes the group's state over,
// handed by a member present at its step boundary, and the steps wait
// for it from then on.
func TestMovedMemberDrops(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.saveThenMove2()
	g.mustStep(2, 0, 1)
	g.h.LeftLost(2, "w2") // its worker lost as it waits for the final save
	for _, c := range []struct {
		id      string
		round   uint32
		trained bool
	}{{"it0-2", 0, true}, {"it1-2", 2, true}, {"it9-9", 0, false}} {
		round, trained, err := g.members[0].Trained(g.ctx, 0, c.id)
		if err != nil || round != c.round || trained != c.trained {
			t.Errorf("item %s: trained %v in round %d (%v); want %v, %d", c.id, trained, round, err, c.trained, c.round)
		}
	}
	g.mustStep(3, 0, 1)
	// A slot the move started joins, taking the group's state over.
	joined := g.joinSlot()
	// Member 0 or 1 hands the state over at its step boundary, and the
	// step waits for the slot from then on.
	stepped := make(chan []error, 1)
	go func() { stepped <- g.step(4, 0, 1) }()
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	if g.states[3].step != 4 || g.states[3].w[0] != 3+3+2+2 {
		t.Fatalf("the slot took step %d weights %v; want the group's as of step 4, weight 10", g.states[3].step, g.states[3].w)
	}
	select {
	case errs := <-stepped:
		t.Fatalf("a step completed without the slot that joined: %v", errs)
	case <-time.After(100 * time.Millisecond):
	}
	g.mustStep(4, 3)
	for _, err := range <-stepped {
		if err != nil {
			t.Fatal(err)
		}
	}
	if g.states[3].w[0] != g.states[0].w[0] || g.states[0].w[0] != 13 {
		t.Errorf("weights: slot %v, member 0 %v; want 13 each", g.states[3].w, g.states[0].w)
	}
}

// TestMovedLostBeforeLeave: a member a move takes away, lost with its
// worker before its leave came (mid-step), leaves then: the step under
// way completes without it, and no member is asked to hand a state over
// for it (it does not restart).
func TestMovedLostBeforeLeave(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	g.h.Moved(2)
	g.arriveAlone(2, "it1-2", 100)
	g.h.LeftLost(2, "w2") // package restarts' loss.member for a member a move took
	done := make(chan []error, 1)
	go func() { done <- g.step(1, 0, 1) }()
	select {
	case errs := <-done:
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the step waits for a member a move took away, lost before its leave")
	}
	if g.states[0].w[0] != 3+2 || g.h.AnyDue() {
		t.Errorf("weights %v, due %v; want 5 (3, then 2: the lost vector adds nothing), none due", g.states[0].w, g.h.due)
	}
}

// TestMovedNotRestored: a group lost whole restores its last save with
// the members it still has, not with a member a move took away after the
// save: that member's share is counted lost (what it trained since comes
// back, to be trained again: it no longer counts as trained), and it is
// not waited for.
func TestMovedNotRestored(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.saveThenMove2()
	g.h.Lose(0, "w0")
	g.h.Lose(1, "w1")
	ev := g.h.Evictions()
	if len(ev) != 1 || ev[0] != (Eviction{Member: 2, Share: "w2", Moved: true}) {
		t.Fatalf("evictions %+v; want member 2's share w2, moved", ev)
	}
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	if g.h.restore[2] || !g.h.left[2] || g.h.members != 2 || !g.h.restore[0] || !g.h.restore[1] {
		t.Errorf("restore %v, left %v, members %d; want members 0 and 1 restoring, 2 left", g.h.restore, g.h.left, g.h.members)
	}
	if round, ok := g.h.trainedRoundLocked("it1-2"); ok {
		t.Errorf("item it1-2, trained by member 2 after the save, still counts as trained (round %d): the restore trains it again", round)
	}
	if _, ok := g.h.trainedRoundLocked("it0-2"); !ok {
		t.Error("item it0-2, trained by member 2 before the save, no longer counts as trained")
	}
}

// TestJoinAfterTheEnd: a slot a move started after every member had
// finished takes nothing and is not waited for; the last member's final
// save is not disturbed.
func TestJoinAfterTheEnd(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	for i := range 3 {
		if _, err := g.members[i].Leave(g.ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	g.members[3].Joins(3)
	if err := g.members[3].Keep(g.ctx, 3, g.states[3]); err != nil {
		t.Fatalf("a slot joining after the end: %v", err)
	}
	g.h.mu.Lock()
	defer g.h.mu.Unlock()
	if g.h.members != 0 || !g.h.left[3] || g.h.due[3] || g.h.lastMember != 2 {
		t.Errorf("members %d, left %v, due %v, last member %d; want 0 present, the slot out, 2 last", g.h.members, g.h.left, g.h.due, g.h.lastMember)
	}
}

// TestDonorLeaves: a member asked for its state at its leave, whose
// donation fails, has left: another member is asked at its next step.
func TestDonorLeaves(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	joined := g.joinSlot()
	// Member 2 is asked at its leave, and has no state to give (its
	// donation fails): it leaves all the same.
	if err := g.members[2].Keep(g.ctx, 2, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := g.members[2].Leave(g.ctx, 2); err != nil {
		t.Fatalf("a leave whose donation failed: %v", err)
	}
	g.h.mu.Lock()
	left, donor := g.h.left[2], g.h.donor[3]
	g.h.mu.Unlock()
	if !left || donor != -1 {
		t.Fatalf("after a leave whose donation failed: left %v, donor %d; want left, no donor", left, donor)
	}
	stepped := make(chan []error, 1)
	go func() { stepped <- g.step(1, 0, 1) }() // member 0 or 1 is asked now
	select {
	case err := <-joined:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slot waits for a state from a member that left")
	}
	g.mustStep(1, 3)
	for _, err := range <-stepped {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestTrainedInHand: an item asked of (Member.Trained) that a member has
// in hand in the step under way is answered once that step completes
// (trained) or the member's arrival is dropped (lost: not trained).
func TestTrainedInHand(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	ask := func(id string) chan bool {
		out := make(chan bool, 1)
		go func() {
			_, trained, err := g.members[3].Trained(g.ctx, 3, id)
			if err != nil {
				t.Error(err)
			}
			out <- trained
		}()
		return out
	}
	waitAsk := func() {
		testutil.Eventually(t, 10*time.Second, func() bool {
			g.h.mu.Lock()
			defer g.h.mu.Unlock()
			return len(g.h.asks) > 0
		}, "the ask waiting")
	}
	// Member 2 arrives with it1-2 and is lost: not trained.
	g.arriveAlone(2, "it1-2", 1)
	lost := ask("it1-2")
	waitAsk()
	g.h.Moved(2)
	g.h.LeftLost(2, "w2") // a member a move took away, lost mid-step: none of it restarts
	if <-lost {
		t.Error("an item in hand of a member lost mid-step: trained, want not")
	}
	// Member 0 arrives with it1-0, and the step completes: trained.
	g.mu.Lock()
	g.held[0] = "it1-0"
	g.mu.Unlock()
	done := make(chan []error, 1)
	go func() { done <- g.step(1, 0) }()
	testutil.Eventually(t, 10*time.Second, func() bool {
		g.h.mu.Lock()
		defer g.h.mu.Unlock()
		return len(g.h.arrived) == 1
	}, "member 0 arriving")
	stepped := ask("it1-0")
	waitAsk()
	g.mustStep(1, 1)
	for _, err := range <-done {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !<-stepped {
		t.Error("an item in hand in a step that completed: not trained, want trained")
	}
}

// TestAskerKeepsForRestore: a member that drops an item another member
// trained after the last save (it came again) keeps it until a save holds
// that round, as if it had trained it: a restore of the group lost whole
// needs its share back (evicted), though it completed no round itself, so
// that the item comes back and is trained again.
func TestAskerKeepsForRestore(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.saveThenMove2()
	g.h.LeftLost(2, "w2")
	// The slot joins, taking the state over at member 0's or 1's step.
	joined := g.joinSlot()
	stepped := make(chan []error, 1)
	go func() { stepped <- g.step(2, 0, 1) }()
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	// It takes member 2's it1-2 again, drops it, and leaves before any
	// step of its own.
	if round, trained, err := g.members[3].Trained(g.ctx, 3, "it1-2"); err != nil || !trained || round != 2 {
		t.Fatalf("it1-2: trained %v in round %d (%v); want round 2", trained, round, err)
	}
	if _, err := g.members[3].Leave(g.ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, err := range <-stepped {
		if err != nil {
			t.Fatal(err)
		}
	}
	g.h.Lose(0, "w0")
	g.h.Lose(1, "w1")
	ev := g.h.Evictions()
	if !slices.ContainsFunc(ev, func(e Eviction) bool { return e.Share == "w3" }) {
		t.Errorf("evictions %+v; want the slot's share w3, which keeps it1-2 (trained after the save) unsettled", ev)
	}
}

// TestLostTrainedOutlivesSaves: what a lost member trained still counts as
// trained after saves that would prune a member's settled items: the lost
// member heard of none of them, so its items come back, to be dropped by
// whichever member takes them.
func TestLostTrainedOutlivesSaves(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	g.h.Lose(2, "w2") // due, for its restart
	for range 2 {     // the save before the last holds round 1 now
		if err := g.members[0].Saved(g.ctx, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, trained, err := g.members[1].Trained(g.ctx, 1, "it0-2"); err != nil || !trained {
		t.Errorf("it0-2, trained by member 2 before it was lost: trained %v (%v); want trained", trained, err)
	}
}
