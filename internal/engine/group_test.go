package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
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
	ms := members(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ms[0].Barrier(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled barrier: %v", err)
	}
}
