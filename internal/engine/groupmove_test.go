package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/zclconf/go-cty/cty"
)

// ctr is a group's training state, for the tests: the steps taken, the
// batches they took (the members that took part, summed) and what the
// steps reduced, summed, as a model's weights would hold it.
type ctr struct {
	step, batches int
	sum           float64
	marshals      *atomic.Int32 // counts MarshalBinary calls, if set
}

func (c *ctr) MarshalBinary() ([]byte, error) {
	if c.marshals != nil {
		c.marshals.Add(1)
	}
	return fmt.Appendf(nil, "%d %d %g", c.step, c.batches, c.sum), nil
}

func (c *ctr) UnmarshalBinary(b []byte) error {
	_, err := fmt.Sscanf(string(b), "%d %d %g", &c.step, &c.batches, &c.sum)
	return err
}

// movingMembers is a group whose state moves, of slots members, the
// first n present and the others parked (as a rebalance parks them).
func movingMembers(n, slots int) (*group, []*member) {
	g := newGroup(slots)
	for i := n; i < slots; i++ {
		g.left[i] = true
	}
	g.members = n
	g.carryState()
	ms := make([]*member, slots)
	for i := range ms {
		ms[i] = &member{g: g, r: &replica{index: i}}
	}
	return g, ms
}

// trainStep is one step of member m holding c, on a batch worth x: an
// all-reduce of [1, x, c.step], which fails unless every member that took
// part is at c's step (one that joined with another state would not be).
func trainStep(ctx context.Context, m *member, c *ctr, x float32) error {
	v := []float32{1, x, float32(c.step)}
	n, err := m.AllReduceSum(ctx, v)
	if err != nil {
		return err
	}
	if v[2] != float32(n*c.step) {
		return fmt.Errorf("member %d at step %d: the %d members' steps add up to %v, not %d: one is at another step", m.r.index, c.step, n, v[2], n*c.step)
	}
	c.step++
	c.batches += n
	c.sum += float64(v[1])
	return nil
}

// inRound reports whether member i has arrived in g's round in progress.
func inRound(g *group, i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.round != nil && g.round.in[i]
}

// TestGroupJoinTakesState: a member that joins a group whose state moves
// takes the state over at a step boundary, whichever member gives it (one
// waiting in the round it joins, asked; the next to arrive; the last to
// leave), and its first step is the group's next; a member that leaves at
// a step boundary leaves the others' state as it was.
func TestGroupJoinTakesState(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	at := func(step int) ctr { return ctr{step: step, batches: 2 * step, sum: float64(10 * step)} }

	t.Run("asked in the round it joins", func(t *testing.T) {
		g, ms := movingMembers(2, 3)
		c := []ctr{at(3), at(3), {}}
		for i := range 2 {
			if err := ms[i].Keep(ctx, &c[i]); err != nil {
				t.Fatal(err)
			}
		}
		errs := make(chan error, 3)
		go func() { errs <- trainStep(ctx, ms[0], &c[0], 1) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return inRound(g, 0) }, "member 0 in the round")
		if !g.join(2) {
			t.Fatal("join refused with two members present")
		}
		// Member 1 has not arrived: only member 0, waiting in the round,
		// can give the state.
		if err := ms[2].Keep(ctx, &c[2]); err != nil {
			t.Fatal(err)
		}
		if c[2] != at(3) {
			t.Fatalf("the member that joined took %+v over, want %+v", c[2], at(3))
		}
		go func() { errs <- trainStep(ctx, ms[2], &c[2], 4) }()
		go func() { errs <- trainStep(ctx, ms[1], &c[1], 2) }()
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		want := ctr{step: 4, batches: 6 + 3, sum: 30 + 7}
		for i := range c {
			if c[i] != want {
				t.Errorf("member %d after the step: %+v, want %+v", i, c[i], want)
			}
		}
	})

	t.Run("given by the next to arrive", func(t *testing.T) {
		g, ms := movingMembers(2, 3)
		c := []ctr{at(5), at(5), {}}
		for i := range 2 {
			if err := ms[i].Keep(ctx, &c[i]); err != nil {
				t.Fatal(err)
			}
		}
		if !g.join(2) {
			t.Fatal("join refused")
		}
		kept := make(chan error, 1)
		go func() { kept <- ms[2].Keep(ctx, &c[2]) }()
		errs := make(chan error, 3)
		go func() { errs <- trainStep(ctx, ms[1], &c[1], 2) }()
		if err := <-kept; err != nil || c[2] != at(5) {
			t.Fatalf("the member that joined: %v, took %+v over, want %+v", err, c[2], at(5))
		}
		go func() { errs <- trainStep(ctx, ms[0], &c[0], 1) }()
		go func() { errs <- trainStep(ctx, ms[2], &c[2], 4) }()
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if want := (ctr{step: 6, batches: 13, sum: 57}); c[0] != want || c[1] != want || c[2] != want {
			t.Errorf("after the step: %+v, want each %+v", c, want)
		}
	})

	t.Run("given by the last to leave", func(t *testing.T) {
		g, ms := movingMembers(2, 3)
		c := []ctr{at(2), at(2), {}}
		for i := range 2 {
			if err := ms[i].Keep(ctx, &c[i]); err != nil {
				t.Fatal(err)
			}
		}
		if !g.join(2) {
			t.Fatal("join refused")
		}
		for i := range 2 {
			if last, err := ms[i].Finish(ctx); err != nil || last {
				t.Fatalf("member %d leaves: last %v, %v; want not last (one joined)", i, last, err)
			}
		}
		if err := ms[2].Keep(ctx, &c[2]); err != nil || c[2] != at(2) {
			t.Fatalf("the member that joined: %v, took %+v over, want %+v", err, c[2], at(2))
		}
		if err := trainStep(ctx, ms[2], &c[2], 1); err != nil {
			t.Fatal(err)
		}
		if last, _ := ms[2].Finish(ctx); !last || c[2] != (ctr{step: 3, batches: 5, sum: 21}) {
			t.Errorf("alone: last %v, state %+v", last, c[2])
		}
		if g.join(1) {
			t.Error("a group whose members have all left took a member")
		}
	})

	t.Run("leave at a step boundary", func(t *testing.T) {
		_, ms := movingMembers(3, 3)
		c := []ctr{{}, {}, {}}
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				if err := ms[i].Keep(ctx, &c[i]); err != nil {
					errs <- err
					return
				}
				steps := 4
				if i == 2 {
					steps = 1 // a move takes it after its first step
				}
				for range steps {
					if err := trainStep(ctx, ms[i], &c[i], float32(i+1)); err != nil {
						errs <- err
						return
					}
				}
				_, err := ms[i].Finish(ctx)
				errs <- err
			}()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		want := ctr{step: 4, batches: 3 + 3*2, sum: 6 + 3*3}
		if c[0] != want || c[1] != want || c[2] != (ctr{step: 1, batches: 3, sum: 6}) {
			t.Errorf("states %+v; want members 0 and 1 at %+v", c, want)
		}
	})

	t.Run("no state to give", func(t *testing.T) {
		g, ms := movingMembers(1, 3)
		if !g.join(1) {
			t.Fatal("join refused")
		}
		if _, err := ms[1].AllReduceSum(ctx, []float32{1}); !errors.Is(err, errNoState) {
			t.Errorf("a collective before taking the state over: %v", err)
		}
		ms[0].Leave() // it kept no state
		if err := ms[1].Keep(ctx, &ctr{}); err == nil {
			t.Error("took a state over with no member to give one")
		}
	})
}

// TestGroupMovesTrainOnce: members join and leave a group whose state
// moves while it trains on a shared stream of batches, as a rebalance's
// moves make them (a member leaves between two steps; one joins and takes
// the state over): every batch is trained exactly once, the member that
// finishes last holds all of them, every step finds its members at one
// step, the state is marshalled once for each handover, and nothing
// hangs.
func TestGroupMovesTrainOnce(t *testing.T) {
	t.Parallel()
	const batches, slots = 400, 8
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g, ms := movingMembers(2, slots)
			items := make(chan float32, 4)
			var (
				wg       sync.WaitGroup
				marshals atomic.Int32
				mu       sync.Mutex
				final    []ctr
				failed   []error
				retire   = make([]atomic.Bool, slots)
			)
			run := func(i int) {
				defer wg.Done()
				m, c := ms[i], &ctr{marshals: &marshals}
				err := func() error {
					if err := m.Keep(ctx, c); err != nil {
						return err
					}
					for !retire[i].Load() {
						x, ok := <-items
						if !ok {
							break
						}
						if err := trainStep(ctx, m, c, x); err != nil {
							return err
						}
					}
					return nil
				}()
				last, _ := m.Finish(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, fmt.Errorf("member %d: %w", i, err))
					cancel() // the others stop too
				}
				if last {
					final = append(final, *c)
				}
			}
			for i := range 2 {
				wg.Add(1)
				go run(i)
			}
			// The batches, and moves among them: every so many batches a
			// member joins, and from the third on a present one is asked
			// to leave, as a move does.
			joined, j := 0, 2
			for k := 1; k <= batches; k++ {
				select {
				case items <- float32(k % 97):
				case <-ctx.Done():
				}
				if j < slots && k == j*batches/(slots+2) {
					if j%2 == round%2 && j > 2 {
						retire[j-2].Store(true)
					}
					if g.join(j) {
						joined++
						wg.Add(1)
						go run(j)
					}
					j++
				}
			}
			close(items)
			wg.Wait()
			if len(failed) > 0 || ctx.Err() != nil {
				t.Fatal(ctx.Err(), failed)
			}
			if len(final) != 1 {
				t.Fatalf("%d members finished last, want 1", len(final))
			}
			var sum float64
			for k := 1; k <= batches; k++ {
				sum += float64(k % 97)
			}
			if f := final[0]; f.batches != batches || f.sum != sum {
				t.Errorf("the last member holds %d batches summing to %g, want %d summing to %g (every batch once)", f.batches, f.sum, batches, sum)
			}
			if joined != slots-2 || int(marshals.Load()) > joined {
				t.Errorf("%d joined, the state marshalled %d times; want %d joined, one marshal at most for each", joined, marshals.Load(), slots-2)
			}
		})
	}
}

// trainKind is a group kind whose state moves, for the tests: each
// replica trains on the items it takes in lockstep steps (trainStep,
// the item's id the batch's worth), its state a ctr it gives its group
// (Keep); the member that finishes last reports the state, and every
// replica where its first step began.
var trainKind = graph.Kind{
	Name: "tr",
	Config: []graph.Field{
		{Name: "step_us", Type: graph.Int, Default: cty.NumberIntVal(0)},
	},
	Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
	},
}

type trainNode struct {
	cfg *graph.Config
	got *received
	mu  sync.Mutex
	// final is the state the last member held; began, by replica, the
	// step its first step was (after it took the state over) and took,
	// the items it trained
	final       *ctr
	began, took map[int]int
}

func (n *trainNode) Run(ctx context.Context, r nodes.Replica) error {
	if r.Index() >= r.Replicas() {
		return fmt.Errorf("replica %d of %d", r.Index(), r.Replicas())
	}
	g, in := r.Group(), r.In("in")
	defer g.Leave()
	c := &ctr{}
	if err := g.Keep(ctx, c); err != nil {
		return err
	}
	m, ok := g.(*member)
	if !ok {
		return fmt.Errorf("group %T", g)
	}
	began, took := c.step, 0
	for {
		item, err := in.Recv(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		time.Sleep(time.Duration(n.cfg.Int("step_us")) * time.Microsecond) // the step's work
		id := idOf(item)
		if err := trainStep(ctx, m, c, float32(id)); err != nil {
			return err
		}
		n.got.add(r.Stage(), id)
		took++
	}
	last, err := g.Finish(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.began[r.Index()], n.took[r.Index()] = began, took
	if last {
		n.final = c
	}
	return err
}

// TestRebalanceMovesTrainingGroup: moves take members from a group whose
// state moves and give it new ones, back and forth, while it trains: a
// member leaves at a step boundary, one that joins takes the group's
// state over (its first step is the group's next, not the first), every
// item is trained exactly once (the last member's state counts each
// once), the steps never find members at different steps, and the run
// ends ok without hanging.
func TestRebalanceMovesTrainingGroup(t *testing.T) {
	h := newHarness(t)
	tn := &trainNode{got: h.got, began: map[int]int{}, took: map[int]int{}}
	h.reg.Register(nodes.Spec{Kind: trainKind, Sync: nodes.Always, Moves: true,
		New: func(cfg *graph.Config) (nodes.Node, error) { tn.cfg = cfg; return tn, nil }})
	const count = 900
	src := strings.Replace(movingSpec, "%COUNT%", fmt.Sprint(count), 1)
	src = strings.Replace(src, "stage \"b\" {\n  node = \"synthetic_work\"\n  config {\n    service_time = \"3ms\"\n  }",
		"stage \"b\" {\n  node     = \"tr\"\n  replicas = 3\n  config {\n    step_us = 1000\n  }", 1)
	src = src[:strings.Index(src, "stage \"sink\"")] + src[strings.Index(src, "edge \"in\""):]
	src = strings.Replace(src, "edge \"done\" {\n  from = b.out\n  to   = sink.in\n}\n", "", 1)
	g := h.load(src)
	var mu sync.Mutex
	n, made := 0, map[string]int{}
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n%4 != 0 {
			return nil, nil
		}
		m := report.Move{From: "a", To: "b", Replicas: 1 + n%3}
		if n%8 == 0 {
			m = report.Move{From: "b", To: "a", Replicas: 1}
		}
		return []report.Move{m}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			if ok {
				made[m.To]++
			}
		}
	}
	rep, err := h.run(g, Options{Rebalance: policy, Interval: 10 * time.Millisecond})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	h.deliveredOnce("b", count)
	checkBalanced(t, rep)
	var sum float64
	for id := range h.got.counts["b"] {
		sum += float64(id)
	}
	tn.mu.Lock()
	defer tn.mu.Unlock()
	if tn.final == nil || tn.final.batches != count || tn.final.sum != sum {
		t.Errorf("the last member's state: %+v; want %d batches summing to %g (every item once)", tn.final, count, sum)
	}
	joined := 0
	for i, b := range tn.began {
		if i >= 3 && tn.took[i] > 0 {
			joined++
			if b == 0 {
				t.Errorf("replica %d joined and trained %d items from step 0: it did not take the group's state over", i, tn.took[i])
			}
		}
	}
	if made["b"] == 0 || made["a"] == 0 || joined == 0 || len(rep.Stages["b"].Replicas) <= 3 {
		t.Errorf("moves made %v, %d members joined and trained, b has %d replicas in the report; want moves both ways and members that joined", made, joined, len(rep.Stages["b"].Replicas))
	}
	t.Logf("moves made %v; b's replicas: began at step %v, trained %v", made, tn.began, tn.took)
}
