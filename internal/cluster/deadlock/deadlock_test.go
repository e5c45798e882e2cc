package deadlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// oneKey: mid sends every item to step[0]'s queue of b (one key), and
// step's two replicas step together, step[1] starving.
const oneKey = `
stage "src" {
  node = "synthetic_source"
  config {
    count = 9
    keys  = 1
  }
}
stage "mid" {
  node = "synthetic_work"
}
stage "step" {
  node     = "synthetic_work"
  replicas = 2
  config {
    sync = true
  }
}
edge "a" {
  from = src.out
  to   = mid.in
}
edge "b" {
  from     = mid.out
  to       = step.in
  policy   = "key_hash"
  capacity = 2
}
`

// host is a group across workers as the coordinator hosts it: member 0
// has arrived at its step, member 1 has not.
type host struct{ arrived bool }

func (h host) WaitingFor(i int) (on []int, arrived, members int, in bool) {
	if i != 0 || !h.arrived {
		return nil, 0, 0, false
	}
	return []int{1}, 1, 2, true
}

func (host) Round() uint32 { return 7 }

// stuckView is the run of oneKey stuck across two workers: src done, mid
// on w1 waiting for room on b's full queue 0, step[0] on w2 arrived at
// the group's step, step[1] on w2 waiting for input on b's empty queue 1.
func stuckView(g *graph.Graph) *View {
	remote := func(q int) []report.QueueRef { return []report.QueueRef{{Edge: "b", Queue: q, Remote: true}} }
	return &View{Graph: g,
		Replicas: map[Replica]Seen{
			{"src", 0}:  {ReplicaSnapshot: report.ReplicaSnapshot{Done: true, ItemsOut: 9}, Worker: "w1"},
			{"mid", 0}:  {ReplicaSnapshot: report.ReplicaSnapshot{ItemsIn: 9, ItemsOut: 8, Waits: []report.Wait{{Kind: "send", Queues: remote(0)}}}, Worker: "w1"},
			{"step", 0}: {ReplicaSnapshot: report.ReplicaSnapshot{ItemsIn: 6, Waits: []report.Wait{{Kind: "group"}}}, Worker: "w2"},
			{"step", 1}: {ReplicaSnapshot: report.ReplicaSnapshot{Waits: []report.Wait{{Kind: "recv", Queues: remote(1)}}}, Worker: "w2"},
		},
		Groups: map[string]Group{"step": host{arrived: true}},
		Queued: func(_ context.Context, ei, q int) (int, error) {
			if ei != 1 {
				return 0, errors.New("no such stream")
			}
			return []int{2, 0}[q], nil // b's queue 0 full, queue 1 empty
		}}
}

// TestJudge: a run stuck across workers is judged deadlocked on the third
// look of the same state once the confirmation time has passed, naming
// the cycle with each replica's worker; anything that moves starts the
// count again, and a replica that may move (working, unseen, lost before
// it finished, restarting after a loss, a stream that has an item or
// cannot be read, a member not arrived) is no deadlock, however often it
// is looked at.
func TestJudge(t *testing.T) {
	t.Parallel()
	g, err := clustertest.Loader(nodes.Default)(&wire.Job{Filename: "onekey.hcl", Src: []byte(oneKey)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	var w Watch
	v := stuckView(g)
	for look := 1; look <= 2; look++ {
		if d := w.Judge(ctx, v, false); d != nil {
			t.Fatalf("look %d: %v, want no verdict before the third look", look, d)
		}
	}
	d := w.Judge(ctx, v, true)
	if d == nil {
		t.Fatal("third look of the same stuck state: no deadlock")
	}
	if !d.Draining {
		t.Error("a drain's deadlock does not say so")
	}
	msg := strings.Join(d.Cycle, "\n")
	for _, want := range []string{
		"mid[0] on w1 waits to send on b[0] (full, 2 of 2), read by step[0]",
		"step[0] on w2 waits at stage step's group step for step[1] (1 of 2 there)",
		"step[1] on w2 waits for input on b[1] (empty), fed by mid[0]",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("cycle\n%s\ndoes not name %q", msg, want)
		}
	}

	// the confirmation time not passed: no verdict, however many looks
	w = Watch{}
	v.Timings.DeadlockConfirm = time.Hour
	for look := 1; look <= 5; look++ {
		if d := w.Judge(ctx, v, false); d != nil {
			t.Fatalf("look %d within the confirmation time: %v", look, d)
		}
	}

	// something moved: three more looks from then
	w = Watch{}
	v = stuckView(g)
	w.Judge(ctx, v, false)
	w.Judge(ctx, v, false)
	mid := v.Replicas[Replica{"mid", 0}]
	mid.ItemsIn++
	v.Replicas[Replica{"mid", 0}] = mid
	for look := 1; look <= 2; look++ {
		if d := w.Judge(ctx, v, false); d != nil {
			t.Fatalf("look %d after mid took an item: %v", look, d)
		}
	}
	if w.Judge(ctx, v, false) == nil {
		t.Error("third look after mid took an item: no deadlock")
	}

	for _, tc := range []struct {
		name   string
		change func(v *View)
	}{
		{"a replica working", func(v *View) {
			r := v.Replicas[Replica{"step", 1}]
			r.Waits = nil
			v.Replicas[Replica{"step", 1}] = r
		}},
		{"a replica its share has not said", func(v *View) { delete(v.Replicas, Replica{"mid", 0}) }},
		{"a lost share's replica not finished", func(v *View) {
			r := v.Replicas[Replica{"mid", 0}]
			r.Lost = true
			v.Replicas[Replica{"mid", 0}] = r
		}},
		{"a worker lost lately", func(v *View) { v.LastLoss, v.Timings.Lease = time.Now(), time.Hour }},
		{"an item on its way", func(v *View) {
			v.Queued = func(context.Context, int, int) (int, error) { return 1, nil } // queue 1 not empty, queue 0 not full
		}},
		{"a stream that cannot be read", func(v *View) {
			v.Queued = func(context.Context, int, int) (int, error) { return 0, errors.New("timeout") }
		}},
		{"a member not arrived", func(v *View) { v.Groups["step"] = host{} }},
		{"a group not hosted", func(v *View) { delete(v.Groups, "step") }},
	} {
		var w Watch
		v := stuckView(g)
		tc.change(v)
		for look := 1; look <= 4; look++ {
			if d := w.Judge(ctx, v, false); d != nil {
				t.Errorf("%s: look %d judged %v", tc.name, look, d)
				break
			}
		}
	}
}
