package group_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// hostedGroup is a hosted group whose state does not move, each member
// on a connection of its own, as members on several workers are; per is
// how many values a part of a vector carries (and the most an answer
// does).
type hostedGroup struct {
	t       *testing.T
	ctx     context.Context
	h       *host.Host
	members []*group.Member
	conn    func() *nats.Conn
	subject string
	per     int
}

func newHostedGroup(t *testing.T, n int) *hostedGroup {
	t.Helper()
	conn := clustertest.Connector(t)
	nc := conn()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	g := &hostedGroup{t: t, ctx: ctx, h: host.New("train", n, nc.MaxPayload(), false), conn: conn,
		subject: "dflow.r.r.grp.train", per: group.PartValues(nc.MaxPayload())}
	sub, err := nc.Subscribe(g.subject, g.h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	nc.Flush()
	for range n {
		g.members = append(g.members, &group.Member{NC: conn(), Subject: g.subject})
	}
	return g
}

// inRound reports whether member i has arrived in the round under way.
func (g *hostedGroup) inRound(i int) bool {
	_, _, _, in := g.h.WaitingFor(i)
	return in
}

// answer is a member's all-reduce's: its contributors, sum and error.
type answer struct {
	n   int
	sum float32
	err error
}

// reduce starts member i's all-reduce of vec and returns its answer,
// once the member waits in the round or has its answer already.
func (g *hostedGroup) reduce(i int, vec float32) chan answer {
	g.t.Helper()
	res := make(chan answer, 1)
	go func() {
		v := nodes.Floats{vec}
		n, err := g.members[i].AllReduce(g.ctx, i, v)
		res <- answer{n, v[0], err}
	}()
	testutil.Eventually(g.t, 10*time.Second, func() bool { return g.inRound(i) || len(res) > 0 }, "member %d's all-reduce", i)
	return res
}

// giveUp has member i arrive with vec, then its context end while it
// waits, the round not done.
func (g *hostedGroup) giveUp(i int, vec float32) {
	g.t.Helper()
	mctx, mcancel := context.WithCancel(g.ctx)
	defer mcancel()
	res := make(chan error, 1)
	go func() {
		_, err := g.members[i].AllReduce(mctx, i, nodes.Floats{vec})
		res <- err
	}()
	testutil.Eventually(g.t, 10*time.Second, func() bool { return g.inRound(i) }, "member %d in the round", i)
	mcancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		g.t.Fatalf("member %d gave up: %v, want its context's error", i, err)
	}
}

// notYet fails the test where res has an answer: a round completed that
// should wait.
func notYet(t *testing.T, res chan answer, what string) {
	t.Helper()
	select {
	case a := <-res:
		t.Fatalf("%s: the round completed (%d members, sum %v, %v) with an arrival whose member gave up", what, a.n, a.sum, a.err)
	default:
	}
}

func want(t *testing.T, res chan answer, n int, sum float32) {
	t.Helper()
	if a := <-res; a.err != nil || a.n != n || a.sum != sum {
		t.Errorf("got %d members, sum %v, %v; want %d, %v", a.n, a.sum, a.err, n, sum)
	}
}

// TestGroupGaveUpWithdraws: a member whose collective ends on its
// context, the round not done, is out of that round across workers as in
// one process: the round does not complete with its arrival (nor its
// vector), and waits for it to come again or leave. Before, its arrival
// stayed at the host: the other member of a pair, arriving next,
// completed a step the one that gave up never took, left first, and the
// one that gave up, last to leave, saved the model a step behind the
// run's.
func TestGroupGaveUpWithdraws(t *testing.T) {
	t.Parallel()
	t.Run("the last to leave holds the last step", func(t *testing.T) {
		// A run's abort: member 1 gives up in step 4 (its step stays 3);
		// member 0 arrives; each, its step ended either way, leaves, and
		// the last saves its step.
		g := newHostedGroup(t, 2)
		steps := []int{3, 3}
		g.giveUp(1, 2)
		res := g.reduce(0, 1)
		saved := make(chan int, 2)
		done := make(chan struct{})
		go func() {
			defer close(done)
			a := <-res
			if a.err == nil {
				steps[0]++
				if a.n != 1 || a.sum != 1 {
					t.Errorf("member 0's step: %d members, sum %v; want 1, 1 (member 1 gave up)", a.n, a.sum)
				}
			}
			if last, _ := g.members[0].Leave(g.ctx, 0); last {
				saved <- steps[0]
			}
		}()
		testutil.Eventually(t, 10*time.Second, func() bool {
			select {
			case <-done:
				return true
			default:
				return g.inRound(0)
			}
		}, "member 0 waiting or done")
		if last, _ := g.members[1].Leave(g.ctx, 1); last {
			saved <- steps[1]
		}
		<-done
		select {
		case s := <-saved:
			if top := max(steps[0], steps[1]); s != top {
				t.Errorf("the last to leave saved step %d; the members' steps %v", s, steps)
			}
		default:
			t.Error("no member was told it was the last to leave")
		}
	})
	t.Run("the sum leaves its vector out", func(t *testing.T) {
		g := newHostedGroup(t, 3)
		r0 := g.reduce(0, 1)
		g.giveUp(1, 10)
		r2 := g.reduce(2, 100)
		notYet(t, r2, "member 1 present, not waiting")
		r1 := g.reduce(1, 1000) // it comes again
		want(t, r0, 3, 1101)
		want(t, r1, 3, 1101)
		want(t, r2, 3, 1101)
		r0 = g.reduce(0, 1)
		g.giveUp(1, 10)
		r2 = g.reduce(2, 100)
		notYet(t, r2, "member 1 gave up again")
		if _, err := g.members[1].Leave(g.ctx, 1); err != nil { // it goes
			t.Fatal(err)
		}
		want(t, r0, 2, 101)
		want(t, r2, 2, 101)
	})
	t.Run("a barrier waits for it again", func(t *testing.T) {
		g := newHostedGroup(t, 2)
		mctx, mcancel := context.WithCancel(g.ctx)
		res := make(chan error, 1)
		go func() { res <- g.members[1].Barrier(mctx, 1) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return g.inRound(1) }, "member 1 at the barrier")
		mcancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("member 1 gave up: %v", err)
		}
		b0 := make(chan error, 1)
		go func() { b0 <- g.members[0].Barrier(g.ctx, 0) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return g.inRound(0) || len(b0) > 0 }, "member 0 at the barrier")
		if len(b0) > 0 {
			t.Fatalf("member 0 passed a barrier member 1 had given up: %v", <-b0)
		}
		if err := g.members[1].Barrier(g.ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := <-b0; err != nil {
			t.Fatal(err)
		}
	})
}

// arriveUnheard sends member i's all-reduce of vec with arrival id, as
// its Member does, and reads no answer: the round's answer, once the
// others arrive, crosses the end of the member's context.
func (g *hostedGroup) arriveUnheard(i int, id string, vec []float32) {
	g.t.Helper()
	nc := g.conn()
	for off := 0; off < len(vec); off += g.per {
		req, _ := group.ReducePart(i, vec, off, g.per)
		msg := &nats.Msg{Subject: g.subject, Reply: nc.NewInbox(), Data: req, Header: nats.Header{}}
		msg.Header.Set(group.HdrArrival, id)
		if err := nc.PublishMsg(msg); err != nil {
			g.t.Fatal(err)
		}
	}
	testutil.Eventually(g.t, 10*time.Second, func() bool { return g.inRound(i) }, "member %d in the round", i)
}

// filled is a vector of n values v.
func filled(n int, v float32) nodes.Floats {
	f := make(nodes.Floats, n)
	for i := range f {
		f[i] = v
	}
	return f
}

// TestGaveUpAfterTheRound: a member whose context ends after the round it
// arrived in completed, its answer not read yet, counts that round as
// the others do: its withdraw is answered the round's sum (fetched in
// parts where it is larger than an answer), never that of an arrival
// that never came; and one whose leave took its arrival out first is
// answered nothing to withdraw.
func TestGaveUpAfterTheRound(t *testing.T) {
	t.Parallel()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	t.Run("the round counts for it", func(t *testing.T) {
		g := newHostedGroup(t, 2)
		for _, n := range []int{1, g.per + 3} {
			id := fmt.Sprintf("a%d", n)
			g.arriveUnheard(1, id, filled(n, 2))
			v0 := filled(n, 1)
			if k, err := g.members[0].AllReduce(g.ctx, 0, v0); err != nil || k != 2 || v0[0] != 3 || v0[n-1] != 3 {
				t.Fatalf("%d values: member 0's step: %d members, sum %v...%v, %v; want 2, 3", n, k, v0[0], v0[n-1], err)
			}
			v1 := filled(n, 2)
			if k, err := g.members[1].ReduceAs(gone, 1, v1, id); err != nil || k != 2 || v1[0] != 3 || v1[n-1] != 3 {
				t.Errorf("%d values: member 1, its context ended after its round completed: %d members, sum %v...%v, %v; want the round's, 2, 3", n, k, v1[0], v1[n-1], err)
			}
			// An arrival that never came (the context ended before it was
			// sent) is in no round: not the one before.
			if k, err := g.members[1].ReduceAs(gone, 1, filled(n, 2), "never"); !errors.Is(err, context.Canceled) {
				t.Errorf("%d values: member 1's arrival that never came: %d members, %v; want its context's error", n, k, err)
			}
		}
	})
	t.Run("after its leave", func(t *testing.T) {
		g := newHostedGroup(t, 3)
		g.arriveUnheard(2, "b", []float32{100})
		if _, err := g.members[2].Leave(g.ctx, 2); err != nil {
			t.Fatal(err)
		}
		r0 := g.reduce(0, 1)
		r1 := g.reduce(1, 10)
		want(t, r0, 2, 11)
		want(t, r1, 2, 11)
		if k, err := g.members[2].ReduceAs(gone, 2, nodes.Floats{100}, "b"); !errors.Is(err, context.Canceled) {
			t.Errorf("member 2's withdraw after its leave: %d members, %v; want its context's error", k, err)
		}
		r0 = g.reduce(0, 1)
		r1 = g.reduce(1, 10)
		want(t, r0, 2, 11)
		want(t, r1, 2, 11)
	})
}
