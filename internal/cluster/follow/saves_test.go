package follow

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// TestLocalSaveNamesEveryMembersItem: a group summing in one share (its
// members on one worker) tells the coordinator, with each save, the items
// the save holds that are not yet settled, which a restore drops if they
// come back. Two such items were missing, and trained twice after a
// restore (TestDFlashLost's "drafters on one" counted 37 batches of 36):
//   - a member's item of the round saved, when the save came before the
//     member's goroutine had run on from the collective;
//   - an item in hand at a save, settled only at the next one, after
//     that one's note had left it out.
func TestLocalSaveNamesEveryMembersItem(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 2)
	job := &wire.Job{Run: "saves", Remote: map[string][]bool{"a": {true}, "b": {false}}, Place: map[string][]string{"src": {"w1"}, "work": {"w1", "w1"}, "sink": {"w1"}}}
	ctx := context.Background()
	f, in, _ := followed(t, job, g, "w1")
	nc := f.env.NC
	notes := make(chan wire.SavesNote, 8)
	sub, err := nc.Subscribe(wire.SubjSaves(job.Run, "work"), func(m *nats.Msg) {
		var n wire.SavesNote
		json.Unmarshal(m.Data, &n)
		notes <- n
		m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// A round completes once both have joined; member 1 then stays in
	// the collective until released, as a goroutine not yet run again
	// (released after the first save, it runs straight on).
	joined, release := make(chan struct{}), make(chan struct{})
	lg := f.localGroupFor(g.Stage("work"))
	var trs [2]*tracked
	var members [2]savingGroup
	for i := range members {
		inner := stalledGroup{joined: joined, release: release, lead: i == 0}
		trs[i] = &tracked{clocked: clocked{groupReplica{i: i, g: inner}}, f: f, local: lg}
		f.mu.Lock()
		f.replicas[replicaKey{"work", i}] = trs[i]
		f.mu.Unlock()
		members[i] = trs[i].Group().(savingGroup)
		if err := members[i].Saves(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// round: each member finishes the item in hand (kept for a save),
	// takes ids[i] and trains it; the lead saves the round as step.
	round := func(step int, ids ...string) wire.SavesNote {
		t.Helper()
		for i, tr := range trs {
			tr.mu.Lock()
			cur := tr.cur
			tr.mu.Unlock()
			if cur != nil {
				cur.Done() // as the engine does at the member's next receive
			}
			tr.mu.Lock()
			tr.cur = f.env.Ledger.Take(in, ids[i], nil, false) // from where the items come
			tr.cur.HeldBy(tr)
			tr.mu.Unlock()
		}
		done := make(chan error, 1)
		go func() {
			_, err := members[1].AllReduce(ctx, nodes.Floats(make([]float32, 1)))
			done <- err
		}()
		if _, err := members[0].AllReduce(ctx, nodes.Floats(make([]float32, 1))); err != nil {
			t.Fatal(err)
		}
		if err := members[0].Saved(ctx, step); err != nil {
			t.Fatal(err)
		}
		if step == 1 {
			close(release)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var last wire.SavesNote
		for len(notes) > 0 {
			last = <-notes
		}
		return last
	}
	want := func(n wire.SavesNote, step int, ids [2][]string) {
		t.Helper()
		if n.Step != step || len(n.Skip) != 2 || !slices.Equal(n.Skip[0], ids[0]) || !slices.Equal(n.Skip[1], ids[1]) {
			t.Errorf("the save of step %d named %v as trained and not settled (its note: step %d); want %v", step, n.Skip, n.Step, ids)
		}
	}
	// Saved while member 1 is still in the collective: its item is named.
	want(round(1, "a", "b"), 1, [2][]string{{"a"}, {"b"}})
	// a and b were in hand at the first save and settle only at this
	// one, after its note: the note still names them.
	want(round(2, "c", "d"), 2, [2][]string{{"a", "c"}, {"b", "d"}})
	// Settled by the save before, they are named no more.
	want(round(3, "e", "f"), 3, [2][]string{{"c", "e"}, {"d", "f"}})
}

// groupReplica is replica i as a tracked replica sees it: its index and
// its group.
type groupReplica struct {
	nodes.Replica
	i int
	g nodes.Group
}

func (r groupReplica) Index() int { return r.i }

func (r groupReplica) Group() nodes.Group { return r.g }

func (r groupReplica) Stage() string { return "work" }

func (r groupReplica) Replicas() int { return 2 }

func (r groupReplica) Metrics() nodes.Metrics { return nil }

// stalledGroup is one member's side of an in-process group of two whose
// round completes once both have joined: the lead's AllReduce returns
// then, the other's only when released.
type stalledGroup struct {
	nodes.Group
	joined, release chan struct{}
	lead            bool
}

func (s stalledGroup) AllReduce(ctx context.Context, x nodes.Reducible) (int, error) {
	if s.lead {
		select {
		case <-s.joined:
			return 2, nil
		case <-time.After(30 * time.Second):
			return 0, context.DeadlineExceeded
		}
	}
	s.joined <- struct{}{}
	<-s.release
	return 2, nil
}
