package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// globalFIFO is one queue shared by several engines: each engine's Close
// means "my producers are done"; the queue ends once every engine that
// holds a producer has closed (the producer count is global).
type globalFIFO struct {
	*fifo
	mu   sync.Mutex
	left int
}

func (g *globalFIFO) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left--; g.left == 0 {
		g.fifo.Close()
	}
}

// sharedGroup is a RemoteGroup over the in-process group, used by several
// engines at once.
type sharedGroup struct{ g *group }

func (s sharedGroup) Barrier(ctx context.Context, i int) error {
	rd, _, err := s.g.arrive(i, nil, false)
	if err != nil {
		return err
	}
	select {
	case <-rd.done:
		return rd.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s sharedGroup) AllReduce(ctx context.Context, i int, x nodes.Reducible) (int, error) {
	rd, _, err := s.g.arrive(i, x, true)
	if err != nil {
		return 0, err
	}
	select {
	case <-rd.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return rd.n, rd.sum.Store(x)
}

func (s sharedGroup) Leave(_ context.Context, i int) (bool, error) { return s.g.leave(i), nil }

func (s sharedGroup) Keep(context.Context, int, nodes.State) error { return nil }
func (s sharedGroup) Saves(context.Context, int) error             { return nil }
func (s sharedGroup) Saved(context.Context, int, int) error        { return nil }

// TestPlacementAcrossEngines: a graph split over three engines (edges b
// and c under each policy; a stays shared, as round_robin from 2 sources
// into 5 feeding a synchronized stage can deadlock, docs/runtime.md), replica i
// of every stage in engine i mod 3, its queues shared, a synchronized stage's
// group shared: every item reaches the sink once, produced == consumed over
// the engines, and every run ends.
func TestPlacementAcrossEngines(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"round_robin", "shared"} {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t)
			g := h.load(`
stage "src" {
  node = "t"
  replicas = 2
  config {
    role  = "source"
    count = 300
  }
}
stage "work" {
  node = "t"
  replicas = 5
}
stage "sync" {
  node = "synthetic_work"
  replicas = 3
  config { sync = true }
}
stage "sink" {
  node = "t"
  replicas = 2
  config { role = "sink" }
}
edge "a" {
  from = src.out
  to = work.in
  policy = "shared"
  capacity = 4
}
edge "b" {
  from = work.out
  to = sync.in
  policy = "` + policy + `"
  capacity = 8
}
edge "c" {
  from = sync.out
  to = sink.in
  policy = "` + policy + `"
}`)
			const engines = 3
			here := func(e int) PlaceFor {
				return func(s *graph.Stage, i int) bool { return i%engines == e }
			}
			queues := map[*graph.Edge][]*globalFIFO{}
			for _, e := range g.Edges {
				for _, q := range e.Queues {
					holders := map[int]bool{}
					for _, p := range q.Producers {
						holders[p%engines] = true
					}
					queues[e] = append(queues[e], &globalFIFO{fifo: newFIFO(e.Capacity), left: len(holders)})
				}
			}
			groups := map[string]sharedGroup{}
			for _, s := range g.Stages {
				groups[s.Name] = sharedGroup{newGroup(s.Replicas)}
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			produced, consumed := map[string]int64{}, map[string]int64{}
			for e := range engines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rep, err := h.run(g, Options{
						Here:      here(e),
						Transport: func(ge *graph.Edge, i int) Transport { return queues[ge][i] },
						Group:     func(s *graph.Stage) RemoteGroup { return groups[s.Name] },
					})
					if err != nil {
						t.Errorf("engine %d: %v", e, err)
					}
					mu.Lock()
					defer mu.Unlock()
					for name, ed := range rep.Edges {
						produced[name] += ed.Produced
						consumed[name] += ed.Consumed
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the engines did not finish")
			}
			h.deliveredOnce("sink", 300)
			for name := range produced {
				if produced[name] != 300 || consumed[name] != 300 {
					t.Errorf("edge %s: produced %d, consumed %d over the engines, want 300", name, produced[name], consumed[name])
				}
			}
		})
	}
}
