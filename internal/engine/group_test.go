package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
)

func members(n int) []*member {
	g := newGroup(n)
	ms := make([]*member, n)
	for i := range ms {
		ms[i] = &member{g: g, r: &replica{index: i}}
	}
	return ms
}

// TestGroupUnevenEnds: member i takes part in steps[i] all-reduces and
// then leaves. In step s exactly the members with steps[i] > s contribute,
// whatever the order in which the others leave; nothing hangs.
func TestGroupUnevenEnds(t *testing.T) {
	t.Parallel()
	for _, steps := range [][]int{
		{0, 1, 3}, {3, 1, 0}, {1, 3, 0}, {2, 2, 5}, {5, 2, 2}, {4, 4, 4}, {0, 0, 0}, {1, 0, 6, 2, 6},
	} {
		t.Run(fmt.Sprint(steps), func(t *testing.T) {
			ms := members(len(steps))
			var wg sync.WaitGroup
			errs := make(chan error, len(steps))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i, m := range ms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer m.Leave()
					for s := 0; s < steps[i]; s++ {
						buf := []float32{1, float32(i)}
						n, err := m.AllReduceSum(ctx, buf)
						if err != nil {
							errs <- err
							return
						}
						want := 0
						for _, k := range steps {
							if k > s {
								want++
							}
						}
						if n != want || buf[0] != float32(want) {
							errs <- fmt.Errorf("member %d step %d: n=%d sum=%v, want %d", i, s, n, buf[0], want)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestGroupBarrierAndLeave(t *testing.T) {
	t.Parallel()
	ms := members(2)
	ctx := context.Background()
	done := make(chan error)
	go func() { done <- ms[0].Barrier(ctx) }()
	// Member 1 leaves instead of arriving: member 0's barrier completes.
	ms[1].Leave()
	ms[1].Leave() // idempotent
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := ms[1].Barrier(ctx); !errors.Is(err, errLeft) {
		t.Errorf("barrier after leave: %v", err)
	}
	if err := ms[0].Barrier(ctx); err != nil {
		t.Errorf("alone in the group, a barrier passes at once: %v", err)
	}
}

func TestGroupMismatch(t *testing.T) {
	t.Parallel()
	ms := members(2)
	ctx := context.Background()
	done := make(chan error)
	go func() { _, err := ms[0].AllReduceSum(ctx, make([]float32, 3)); done <- err }()
	_, err1 := ms[1].AllReduceSum(ctx, make([]float32, 4))
	if err0 := <-done; err0 == nil || err1 == nil {
		t.Errorf("length mismatch: errors %v, %v", err0, err1)
	}
}

func TestGroupCancel(t *testing.T) {
	t.Parallel()
	ms := members(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ms[0].Barrier(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled barrier: %v", err)
	}
}

// TestGroupCompletedStandsOnCancel: a member that arrives last at an
// all-reduce with its context already ended completes the round, and the
// round stands for it as for the others: it gets the sum, every time (left
// to a select's chance, it got the context's error half the time, having
// given its vector to a step the others took).
func TestGroupCompletedStandsOnCancel(t *testing.T) {
	t.Parallel()
	ms := members(2)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 100 {
		first := make(chan error, 1)
		go func() {
			_, err := ms[0].AllReduceSum(context.Background(), []float32{1})
			first <- err
		}()
		testutil.Eventually(t, 10*time.Second, func() bool {
			ms[0].g.mu.Lock()
			defer ms[0].g.mu.Unlock()
			return ms[0].g.round != nil && ms[0].g.round.arrived == 1
		}, "member 0 at round %d", i)
		buf := []float32{2}
		if n, err := ms[1].AllReduceSum(ended, buf); err != nil || n != 2 || buf[0] != 3 {
			t.Fatalf("round %d: the last to arrive, its context ended, got %v %d %v; want the sum of 2", i, buf, n, err)
		}
		if err := <-first; err != nil {
			t.Fatalf("round %d: member 0: %v", i, err)
		}
	}
}

// devVec stands for a device buffer: a vector the group reaches only
// through its Sum, never as a host slice.
type devVec struct{ vals []float32 }

func (v *devVec) Len() int          { return len(v.vals) }
func (v *devVec) NewSum() nodes.Sum { return &devSum{acc: make([]float32, len(v.vals))} }
func (v *devVec) Scale(f float32) {
	for i := range v.vals {
		v.vals[i] *= f
	}
}

type devSum struct{ acc []float32 }

func (s *devSum) Add(x nodes.Reducible) error {
	d, ok := x.(*devVec)
	if !ok {
		return fmt.Errorf("not on this device: %T", x)
	}
	for i, v := range d.vals {
		s.acc[i] += v
	}
	return nil
}

func (s *devSum) Store(x nodes.Reducible) error {
	copy(x.(*devVec).vals, s.acc)
	return nil
}

// TestGroupReducible: AllReduce sums vectors the group cannot read
// through their own Sum, with AllReduceSum's uneven ends; a host vector
// and another kind in one step fail both members.
func TestGroupReducible(t *testing.T) {
	t.Parallel()
	steps := []int{1, 3, 2}
	ms := members(len(steps))
	var wg sync.WaitGroup
	errs := make(chan error, len(steps))
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer m.Leave()
			for s := 0; s < steps[i]; s++ {
				v := &devVec{vals: []float32{1, float32(i)}}
				n, err := m.AllReduce(context.Background(), v)
				want := 0
				for _, k := range steps {
					if k > s {
						want++
					}
				}
				if err != nil || n != want || v.vals[0] != float32(want) {
					errs <- fmt.Errorf("member %d step %d: n=%d sum=%v err=%v, want %d", i, s, n, v.vals, err, want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	ms = members(2)
	done := make(chan error)
	go func() {
		_, err := ms[0].AllReduce(context.Background(), &devVec{vals: make([]float32, 2)})
		done <- err
	}()
	_, err1 := ms[1].AllReduceSum(context.Background(), make([]float32, 2))
	if err0 := <-done; err0 == nil || err1 == nil {
		t.Errorf("a device vector and a host one in one step: errors %v, %v", err0, err1)
	}
}

// TestGroupGaveUpWithdraws: a member whose wait in a collective ends on
// its context, the round not done, is out of that round: the round does
// not complete with its arrival (nor its vector), and waits for it to
// come again or leave. Before, its arrival stayed: the other member of a
// pair, arriving next, completed a step the one that gave up never took,
// left first, and the one that gave up, last to leave, saved the model a
// step behind the run's (TestSavesOnAbort in nodes/lm, once).
func TestGroupGaveUpWithdraws(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// giveUp has member i arrive with vec, then its context end while it
	// waits, the round not done.
	giveUp := func(t *testing.T, m *member, vec float32) {
		t.Helper()
		mctx, mcancel := context.WithCancel(ctx)
		res := make(chan error, 1)
		go func() {
			_, err := m.AllReduceSum(mctx, []float32{vec})
			res <- err
		}()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(m.g, m.r.index) }, "member %d in the round", m.r.index)
		mcancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("member %d gave up: %v, want its context's error", m.r.index, err)
		}
	}
	// reduce starts member m's all-reduce of vec and returns its answer,
	// once m is waiting in the round or has its answer already.
	type answer struct {
		n   int
		sum float32
		err error
	}
	reduce := func(t *testing.T, m *member, vec float32) chan answer {
		t.Helper()
		res := make(chan answer, 1)
		go func() {
			buf := []float32{vec}
			n, err := m.AllReduceSum(ctx, buf)
			res <- answer{n, buf[0], err}
		}()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(m.g, m.r.index) || len(res) > 0 }, "member %d's all-reduce", m.r.index)
		return res
	}
	notYet := func(t *testing.T, res chan answer, what string) {
		t.Helper()
		select {
		case a := <-res:
			t.Fatalf("%s: the round completed (%d members, sum %v, %v) with an arrival whose member gave up", what, a.n, a.sum, a.err)
		default:
		}
	}
	want := func(t *testing.T, res chan answer, n int, sum float32) {
		t.Helper()
		if a := <-res; a.err != nil || a.n != n || a.sum != sum {
			t.Errorf("got %d members, sum %v, %v; want %d, %v", a.n, a.sum, a.err, n, sum)
		}
	}

	t.Run("the last to leave holds the last step", func(t *testing.T) {
		// lm_train's abort: member 1 gives up in step 4 (its step stays
		// 3); member 0 arrives; each, its step ended either way, leaves
		// (Finish), and the last saves its step.
		ms := members(2)
		steps := []int{3, 3}
		giveUp(t, ms[1], 2)
		res := reduce(t, ms[0], 1)
		var saved atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			if a := <-res; a.err == nil {
				steps[0]++
			}
			if last, _ := ms[0].Finish(ctx); last {
				saved.Store(int64(steps[0]))
			}
		}()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(ms[0].g, 0) || isClosed(done) }, "member 0 waiting or done")
		if last, _ := ms[1].Finish(ctx); last {
			saved.Store(int64(steps[1]))
		}
		<-done
		if top := max(steps[0], steps[1]); saved.Load() != int64(top) {
			t.Errorf("the last to leave saved step %d; the members' steps %v", saved.Load(), steps)
		}
	})
	t.Run("a leave after giving up completes nothing early", func(t *testing.T) {
		ms := members(3)
		giveUp(t, ms[1], 10)
		ms[1].Leave()
		res := reduce(t, ms[0], 1)
		notYet(t, res, "member 2 not arrived")
		ms[2].Leave()
		want(t, res, 1, 1)
	})
	t.Run("the sum leaves its vector out", func(t *testing.T) {
		ms := members(3)
		r0 := reduce(t, ms[0], 1)
		giveUp(t, ms[1], 10)
		r2 := reduce(t, ms[2], 100)
		notYet(t, r2, "member 1 present, not waiting")
		r1 := reduce(t, ms[1], 1000) // it comes again
		want(t, r0, 3, 1101)
		want(t, r1, 3, 1101)
		want(t, r2, 3, 1101)
		r0 = reduce(t, ms[0], 1)
		giveUp(t, ms[1], 10)
		r2 = reduce(t, ms[2], 100)
		notYet(t, r2, "member 1 gave up again")
		ms[1].Leave() // it goes
		want(t, r0, 2, 101)
		want(t, r2, 2, 101)
	})
	t.Run("a barrier waits for it again", func(t *testing.T) {
		ms := members(2)
		mctx, mcancel := context.WithCancel(ctx)
		res := make(chan error, 1)
		go func() { res <- ms[1].Barrier(mctx) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(ms[1].g, 1) }, "member 1 at the barrier")
		mcancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			t.Fatalf("member 1 gave up: %v", err)
		}
		b0 := make(chan error, 1)
		go func() { b0 <- ms[0].Barrier(ctx) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(ms[0].g, 0) || len(b0) > 0 }, "member 0 at the barrier")
		if len(b0) > 0 {
			t.Fatalf("member 0 passed a barrier member 1 had given up: %v", <-b0)
		}
		if err := ms[1].Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-b0; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a member that leaves while it waits is out", func(t *testing.T) {
		ms := members(2)
		res := reduce(t, ms[0], 1)
		ms[0].Leave() // from another goroutine than its wait's
		if a := <-res; !errors.Is(a.err, errLeft) {
			t.Errorf("member 0 left while it waited: got %d members, sum %v, %v; want %v", a.n, a.sum, a.err, errLeft)
		}
		if n, err := ms[1].AllReduceSum(ctx, []float32{2}); err != nil || n != 1 {
			t.Errorf("member 1 alone: %d, %v", n, err)
		}
	})
}
