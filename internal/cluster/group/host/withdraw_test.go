package host

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/nodes"
)

// blockingState is a member's state whose marshalling, asked for a
// restart, waits until the test lets it go.
type blockingState struct {
	*weights
	asked, release chan struct{}
}

func (s *blockingState) MarshalBinary() ([]byte, error) {
	close(s.asked)
	<-s.release
	return s.weights.MarshalBinary()
}

// TestGaveUpDonating: a member asked at its step for the state of a
// slot that joins, whose context ends as it sends it, withdraws: the
// state will not come from it, and the next member to arrive is asked.
// Before, the host waited for that member's state, the slot for the
// host's, and the step for the slot.
func TestGaveUpDonating(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	joined := g.joinSlot()
	st := &blockingState{weights: g.states[0], asked: make(chan struct{}), release: make(chan struct{})}
	if err := g.members[0].Keep(g.ctx, 0, st); err != nil { // its state now
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(g.ctx)
	defer mcancel()
	res := make(chan error, 1)
	go func() {
		_, err := g.members[0].AllReduce(mctx, 0, nodes.Floats{1})
		res <- err
	}()
	select {
	case <-st.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("member 0, first at its step, was not asked for the slot's state")
	}
	mcancel()
	close(st.release)
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("member 0 gave up donating: %v, want its context's error", err)
	}
	slotJoinsThenSteps(t, g, joined, "gave up sending", 0)
}

// slotJoinsThenSteps is what follows member 0's withdrawn donation (what
// it did, as the failure says: "gave up sending"): members 1 and 2 step,
// the slot's joining (joined, from joinSlot) ends without error, member 0
// and the slot step, and the slot then has step 2 and member donor's
// weights.
func slotJoinsThenSteps(t *testing.T, g *movesGroup, joined <-chan error, withdrew string, donor int) {
	t.Helper()
	stepped := make(chan []error, 1)
	go func() { stepped <- g.step(1, 1, 2) }()
	select {
	case err := <-joined:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the slot waits for a state member 0 %s", withdrew)
	}
	g.mustStep(1, 0, 3)
	for _, err := range <-stepped {
		if err != nil {
			t.Fatal(err)
		}
	}
	if g.states[3].step != 2 || g.states[3].w[0] != g.states[donor].w[0] {
		t.Errorf("the slot: step %d, weights %v; want step 2, member %d's %v", g.states[3].step, g.states[3].w, donor, g.states[donor].w)
	}
}

// failingState is a member's state whose marshalling, asked for a
// restart, fails.
type failingState struct{ *weights }

func (s failingState) MarshalBinary() ([]byte, error) {
	return nil, errors.New("no state to give")
}

// TestFailedDonationWithdraws: a member asked at its step for the state
// of a slot that joins, whose donation fails (an error, not its
// context's end), withdraws as one whose context ended does: the state
// will not come from it, and the next member to arrive is asked. Before,
// only a context's end withdrew: the host waited for that member's state,
// the slot for the host's, and the step for the slot.
func TestFailedDonationWithdraws(t *testing.T) {
	t.Parallel()
	g := newMovesGroup(t)
	g.mustStep(0, 0, 1, 2)
	joined := g.joinSlot()
	if err := g.members[0].Keep(g.ctx, 0, failingState{g.states[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.members[0].AllReduce(g.ctx, 0, nodes.Floats{1}); err == nil || !strings.Contains(err.Error(), "no state to give") {
		t.Fatalf("member 0's step, its donation failing: %v, want the donation's error", err)
	}
	slotJoinsThenSteps(t, g, joined, "failed to send", 1)
}
