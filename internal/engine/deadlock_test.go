package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// seedDeadlock is the seed's shape wired to deadlock: the source rotates
// over the five targets' queues, targets 0 and 3 feed drafter 0's queue,
// target 2 alone feeds drafter 2's, and the drafters step together. Once
// drafter 0's queue is full, target 0 blocks, then the source on target
// 0's queue, so target 2 starves, drafter 2 with it, and the group step
// holds drafters 0 and 1: nothing can move.
const seedDeadlock = `
stage "reader" {
  node = "synthetic_source"
  config {
    count = 100000
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = 5
  config {
    service_time = "100us"
  }
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "100us"
    sync         = true
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "round_robin"
  capacity = 4
}
edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin"
  capacity = 4
}
edge "trained" {
  from = drafter.out
  to   = done.in
}
`

// TestDeadlockNamed: a run that can never finish fails on its own (the
// harness fails a run that hangs) with the cycle of waits named, the fix,
// and exact counts. Before the detector this run hung until the test's
// deadline.
func TestDeadlockNamed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rep, err := h.run(h.load(seedDeadlock), Options{})
	var d *Deadlock
	if !errors.As(err, &d) {
		t.Fatalf("err = %v, want a *Deadlock", err)
	}
	if rep.Status != report.Failed || !strings.Contains(rep.Error, "deadlock") {
		t.Errorf("status %s, error %q", rep.Status, rep.Error)
	}
	msg := err.Error()
	t.Log(msg)
	// Which of targets 0, 1, 3 and 4 blocks the reader first is timing.
	for _, re := range []string{
		`\n    reader\[0\] waits to send on tokens\[([0134])\] \(full, 4 of 4\), read by target\[([0134])\]\n    target\[([0134])\] waits to send on hs\[[01]\] \(full, 4 of 4\), read by drafter\[[01]\]\n    drafter\[[01]\] waits`,
	} {
		if !regexp.MustCompile(re).MatchString(msg) {
			t.Errorf("error does not match %s", re)
		}
	}
	for _, want := range []string{
		"waits at stage drafter's group step for drafter[2] (2 of 3 there)",
		"drafter[2] waits for input on hs[2] (empty), fed by target[2]",
		"target[2] waits for input on tokens[2] (empty), fed by reader[0]",
		`--set edge.hs.policy=shared`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q", want)
		}
	}
	// The cycle closes: the last line waits on the first line's replica.
	first := strings.Fields(d.Cycle[0])[0]
	if last := d.Cycle[len(d.Cycle)-1]; !strings.HasSuffix(last, " by "+first) && !strings.Contains(last, "for "+first) {
		t.Errorf("cycle does not close on %s: %q", first, d.Cycle)
	}
	// Exact counts: every edge's produced and consumed add up to the
	// replicas' own counts.
	for _, name := range []string{"tokens", "hs"} {
		e := rep.Edges[name]
		from, to := map[string]string{"tokens": "reader", "hs": "target"}[name], map[string]string{"tokens": "target", "hs": "drafter"}[name]
		var out, in int64
		for _, r := range rep.Stages[from].Replicas {
			out += r.ItemsOut
		}
		for _, r := range rep.Stages[to].Replicas {
			in += r.ItemsIn
		}
		if e.Produced != out || e.Consumed != in {
			t.Errorf("edge %s: produced %d consumed %d, replicas sent %d and got %d", name, e.Produced, e.Consumed, out, in)
		}
		if e.Produced == 0 {
			t.Errorf("edge %s: nothing moved before the deadlock", name)
		}
	}
}

// TestDeadlockStopsDrain: a drain of a deadlocked run cannot complete; it
// ends on its own as an abort that says so. Before, the drain waited for
// ever.
func TestDeadlockStopsDrain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drain := make(chan struct{})
	g := h.load(seedDeadlock)
	// Confirm slowly, so that the drain starts after the deadlock forms
	// and before it is declared.
	p, err := New(g, Options{Registry: h.reg, Drain: drain, Interval: 20 * time.Millisecond, DeadlockConfirm: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var rep *report.Report
	go func() {
		defer close(done)
		rep, err = p.Execute(context.Background())
	}()
	testutil.Eventually(t, 20*time.Second, func() bool { return p.r.stuckWaits() != nil }, "the deadlock to form")
	close(drain)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the drain never ended")
	}
	var d *Deadlock
	if !errors.As(err, &d) || !d.Draining {
		t.Fatalf("err = %v, want a drain's *Deadlock", err)
	}
	if rep.Status != report.Aborted || !strings.HasPrefix(rep.Error, "drain cannot complete: deadlock") {
		t.Errorf("status %s, error %q", rep.Status, rep.Error)
	}
}

// TestNoDeadlockWhileBusy: a replica working on one long item while every
// other one waits for it is no deadlock, however long the item takes.
func TestNoDeadlockWhileBusy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 3
  }
}
stage "slow" {
  node = "synthetic_work"
  config {
    service_time = "400ms"
  }
}
stage "done" {
  node = "sink"
}
edge "a" {
  from     = src.out
  to       = slow.in
  capacity = 1
}
edge "b" {
  from = slow.out
  to   = done.in
}
`)
	p, err := New(g, Options{Registry: h.reg, DeadlockConfirm: 100 * time.Millisecond}) // well under one item
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
}

// TestNoDeadlockOnOwnContext: a replica waiting with a context of its own
// may be released by it, so waits that depend on it are not judged. Here
// "c" fills its queue to "b" on y and waits for room, while "b" waits on
// x, which only "c" feeds: a cycle, but b's wait has a deadline of its
// own, after which b reads y and everything ends.
func TestNoDeadlockOnOwnContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	two := func(name string, dir graph.Direction) []graph.PortSpec {
		return []graph.PortSpec{{Name: "x", Dir: dir, Type: "n"}, {Name: "y", Dir: dir, Type: "n"}}
	}
	h.reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "c", Ports: func(*graph.Config) []graph.PortSpec { return two("c", graph.Out) }},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for i := range 3 {
					if err := r.Out("y").Send(ctx, i); err != nil {
						return err
					}
				}
				return nil
			}), nil
		},
	})
	h.reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "b", Ports: func(*graph.Config) []graph.PortSpec { return two("b", graph.In) }},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				defer cancel()
				if _, err := r.In("x").Recv(wctx); !errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("recv x: %v", err)
				}
				for _, port := range []string{"y", "x"} {
					for {
						if _, err := r.In(port).Recv(ctx); err == io.EOF {
							break
						} else if err != nil {
							return err
						}
					}
				}
				return nil
			}), nil
		},
	})
	g := h.load(`
stage "c" {
  node = "c"
}
stage "b" {
  node = "b"
}
edge "x" {
  from = c.x
  to   = b.x
}
edge "y" {
  from     = c.y
  to       = b.y
  capacity = 1
}
`)
	p, err := New(g, Options{Registry: h.reg, DeadlockConfirm: 50 * time.Millisecond}) // well under b's deadline
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
}
