package follow

import (
	"context"
	"encoding/json"
	"slices"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
)

// A group that sums in one worker's process (several replicas of a kind
// that moves, all placed on one instance) has no host to count its rounds
// and saves, so the share does (localGroup): each member's collectives
// are its rounds (in process they go in lockstep, so the k-th of every
// member is the same round), a save holds the rounds up to its member's
// last, and the members' inputs are settled up to there. With every save
// the share tells the coordinator (dflow.r.RUN.saves.STAGE) the save's
// step and the ids of the items trained up to it and not yet settled. A
// member that returns keeps its inputs unsettled until a later save, or
// the group's final one (its last member to return wrote it), holds
// them: the share then says the group is final, with every item it
// trained. The worker lost, the coordinator restarts the group from its
// last save (Job.Restore) as it restarts a hosted group lost whole, its
// finished members too; lost once final, its restarts drop every item
// that comes back, and neither train nor save.

// localGroup is a share's record of a local group's rounds and saves.
type localGroup struct {
	f     *Replicas
	stage *graph.Stage

	mu      sync.Mutex
	saves   bool
	final   bool         // every member has returned: the final save is written
	ended   map[int]bool // the members returned
	step    int          // the last save's, -1: none
	durable uint32
	rounds  map[int]uint32              // each member's collectives
	trained map[int][]group.TrainedItem // not yet settled by a save before the last
	settled map[string]bool             // the ids the last save settled
}

// localGroupFor is the share's record of s's group, made once.
func (f *Replicas) localGroupFor(s *graph.Stage) *localGroup {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.locals == nil {
		f.locals = map[string]*localGroup{}
	}
	lg := f.locals[s.Name]
	if lg == nil {
		lg = &localGroup{f: f, stage: s, step: -1, rounds: map[int]uint32{}, trained: map[int][]group.TrainedItem{}}
		f.locals[s.Name] = lg
	}
	return lg
}

// noteLocked tells the coordinator (lg.mu held).
func (lg *localGroup) noteLocked() {
	n := wire.SavesNote{Share: lg.f.env.Instance, Stage: lg.stage.Name, Saves: lg.saves, Final: lg.final, Step: lg.step,
		Skip: make([][]string, lg.stage.Replicas)}
	for r, items := range lg.trained {
		for _, t := range items {
			if (lg.final || t.Round <= lg.durable) && r < len(n.Skip) {
				n.Skip[r] = append(n.Skip[r], t.ID)
			}
		}
	}
	b, _ := json.Marshal(n)
	// Asked, not published: a save's acks wait until the coordinator has
	// the ids they cover.
	lg.f.env.NC.Request(wire.SubjSaves(lg.f.env.Job.Run, lg.stage.Name), b, lg.f.env.Job.Timings.Lease)
}

// savingGroup is a replica's local group, with the share's record.
type savingGroup struct {
	nodes.Group
	lg *localGroup
	t  *tracked
}

// joining records the round the replica's collective is about to join,
// and the item it trains in it, before the round can complete: the
// member whose arrival completes it may save it at once, before this
// member's goroutine runs again, and what that save's note names as
// trained must hold this member's item of the round (recorded after the
// collective, it was missing there: the item came back after a restore
// and was trained twice). A collective that fails does not undo it: it
// fails only as the group ends (cancelled, or a replica's fault that
// fails the run), which then saves nothing more.
func (g savingGroup) joining() {
	lg, t, i := g.lg, g.t, g.t.Index()
	lg.mu.Lock()
	lg.rounds[i]++
	round := lg.rounds[i]
	t.mu.Lock()
	t.round, t.last = round, round
	id := ""
	if t.cur != nil {
		id = t.cur.ID()
	}
	t.mu.Unlock()
	if id != "" && lg.saves {
		items := lg.trained[i]
		if n := len(items); n > 0 && items[n-1].ID == id {
			items[n-1].Round = round
		} else {
			lg.trained[i] = append(items, group.TrainedItem{Round: round, ID: id})
		}
	}
	lg.mu.Unlock()
}

func (g savingGroup) Barrier(ctx context.Context) error {
	g.joining()
	return g.Group.Barrier(ctx)
}

func (g savingGroup) AllReduce(ctx context.Context, x nodes.Reducible) (int, error) {
	g.joining()
	return g.Group.AllReduce(ctx, x)
}

func (g savingGroup) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	return g.AllReduce(ctx, nodes.Floats(buf))
}

// Finish is the group's, but for the restart of a group lost once final:
// none of its members is the last, which would save again.
func (g savingGroup) Finish(ctx context.Context) (bool, error) {
	if r := g.lg.f.env.Job.Restore[g.lg.stage.Name]; r != nil && r.Final {
		g.Group.Leave()
		return false, nil
	}
	return g.Group.Finish(ctx)
}

// returned records that member i has returned; the last to return, the
// final save written, settles what every member kept and tells the
// coordinator that the group is final.
func (lg *localGroup) returned(i int) {
	lg.mu.Lock()
	if lg.ended == nil {
		lg.ended = map[int]bool{}
	}
	lg.ended[i] = true
	final := !lg.final && len(lg.ended) == lg.stage.Replicas
	if final {
		lg.final = true
		if lg.saves {
			lg.noteLocked()
		}
	}
	lg.mu.Unlock()
	if !final {
		return
	}
	for i := range lg.stage.Replicas {
		if t := lg.f.trackedReplica(lg.stage.Name, i); t != nil {
			t.saved(^uint32(0))
		}
	}
}

func (g savingGroup) Saves(ctx context.Context) error {
	lg := g.lg
	g.t.mu.Lock()
	g.t.hold = true
	g.t.mu.Unlock()
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if !lg.saves {
		lg.saves = true
		lg.noteLocked()
	}
	return nil
}

// Saved records the save as of the replica's last round, tells the
// coordinator, then settles what every member here trained up to it.
// What the note names stays named until a save after the one that
// settled it: an item still in hand at a save (every member's of its
// last round) is settled only at the next, after that one's note.
func (g savingGroup) Saved(ctx context.Context, step int) error {
	lg := g.lg
	lg.mu.Lock()
	lg.durable, lg.step = lg.rounds[g.t.Index()], step
	for r, items := range lg.trained {
		lg.trained[r] = slices.DeleteFunc(items, func(t group.TrainedItem) bool { return lg.settled[t.ID] })
	}
	lg.noteLocked()
	durable := lg.durable
	lg.mu.Unlock()
	settled := map[string]bool{}
	for i := range lg.stage.Replicas {
		if t := lg.f.trackedReplica(lg.stage.Name, i); t != nil {
			for _, d := range t.saved(durable) {
				settled[d.ID()] = true
			}
		}
	}
	// Acked before the next save's note leaves them out (an item with
	// publishes unanswered is acked once they are, which a save interval
	// outlasts).
	err := lg.f.env.Ledger.Settle()
	lg.mu.Lock()
	lg.settled = settled
	lg.mu.Unlock()
	return err
}

// Keep restores the group's last save where the coordinator says so (the
// group was lost whole), or records st as the in-process group does.
func (g savingGroup) Keep(ctx context.Context, st nodes.State) error {
	if r, ok := g.lg.f.env.Job.Restore[g.lg.stage.Name]; ok && r != nil {
		// Every member's: on a shared queue an item one member trained
		// comes back to whichever restart takes it.
		var skip map[string]uint32
		for _, ids := range r.Skip {
			for _, id := range ids {
				if skip == nil {
					skip = map[string]uint32{}
				}
				skip[id] = 0 // in the save restored: settled when it comes
			}
		}
		if skip != nil {
			g.t.mu.Lock()
			g.t.skip = skip
			g.t.mu.Unlock()
		}
		if r.Final {
			return nil // it trains nothing: every item it gets was trained
		}
		return &nodes.Restore{Step: r.Step}
	}
	return g.Group.Keep(ctx, st)
}
