package follow

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/settle"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
)

// tracked is a restartable replica's runtime, following its items: the
// one it took last is in hand until it asks for the next (or returns), and
// what it sends meanwhile derives from it. A stateless kind handles one
// item at a time; its ports may still sit on two goroutines, hence mu.
type tracked struct {
	clocked
	f *Replicas

	mu  sync.Mutex
	cur *settle.Taken // the delivery in hand (nil: none); a dropped one until the next receive
	// took are the ids of what the replica took since its group's last
	// step (several where a step takes k items), where its stage steps
	// together (steps): the group's host names them all trained in the
	// next, for a restart to drop
	took  []string
	steps bool
	// skip are the items a restart drops if they come back: the group's
	// state it took holds what they trained (its group names them), each
	// with the round it was trained in where no save holds that yet (0:
	// one does, or its group does not save)
	skip map[string]uint32
	// hold: its group saves (nodes.Group.Saves), so what it finishes is
	// kept, each with the round it was trained in, until a save holds
	// that round; round is the cur's (0: none yet), last the replica's
	// latest
	hold        bool
	kept        []keptItem
	round, last uint32
	// local is its group's record where the group sums in this process
	local *localGroup
	// open counts what it took and is not yet settled; once it has
	// returned without error (key set) and none is open, its record of
	// that goes, once (recordSettled)
	open     int
	key      string
	recorded bool
	// untoldOf is an item taken again whose group could not say whether
	// it was trained: never settled here (untold)
	untoldOf *settle.Taken
}

// SettledOne notes that an item it took is settled (settle.Holder).
func (t *tracked) SettledOne() {
	t.mu.Lock()
	t.open--
	t.recordLocked()
	t.mu.Unlock()
}

// returned notes that its Run returned without error; key is its
// wire.KeySettled.
func (t *tracked) returned(key string) {
	t.mu.Lock()
	t.key = key
	t.recordLocked()
	t.mu.Unlock()
}

// recordLocked starts the replica's record once it has returned and all
// it took is settled, unless the share is closing (a replica that
// outlived the share's end, past its Grace, records nothing: Share.Go).
// t.mu held.
func (t *tracked) recordLocked() {
	if t.key == "" || t.open > 0 || t.recorded {
		return
	}
	t.recorded = true
	f, key := t.f, t.key
	f.env.Share.Go(func() { f.recordSettled(key) })
}

// recordSettled writes key (wire.KeySettled) for a replica that has
// returned and settled everything it took: such a replica has nothing
// left that could come back to a restart, so a lost worker's finished
// replica is not run again (package finished). Run again, it could take
// an item that another lost replica held (a shared input's) and send it
// after the end its consumers may have ended on. The settle can come long
// after the end (a large item's input settles once its consumer has its
// bytes, and a stage that saves takes them for good at a save), so the
// record is apart from the end. A share aborted writes nothing: its
// replica restarts, as one not settled.
func (f *Replicas) recordSettled(key string) {
	env := f.env
	if env.Share.Aborting() {
		return
	}
	ctx, cancel := context.WithTimeout(env.Stop, 10*time.Second)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if _, err := env.Ends.Put(ctx, key, []byte(env.Instance)); err == nil || ctx.Err() != nil {
			return // not written: the replica restarts if its worker is lost
		}
		select {
		case <-time.After(wait):
		case <-env.Stop.Done():
			return
		}
	}
}

// Group is the replica's group, with the share's record of its rounds and
// saves where it sums in this process.
func (t *tracked) Group() nodes.Group {
	if t.local != nil {
		return savingGroup{Group: t.Replica.Group(), lg: t.local, t: t}
	}
	return t.Replica.Group()
}

// keptItem is a finished item waiting for a save.
type keptItem struct {
	t     *settle.Taken
	round uint32
}

func (t *tracked) In(port string) nodes.Input { return &trackedIn{Input: t.Replica.In(port), t: t} }
func (t *tracked) Out(port string) nodes.Output {
	return &trackedOut{Output: t.Replica.Out(port), t: t}
}

// Keeps takes d off the replica's hands, and reports whether it is kept
// for a save (settle.Holder): where its group saves, with the round it
// was trained in (in no round: held until a save after the next), or,
// dropped as trained on by the state its restart took, with that round
// where no save holds it yet.
func (t *tracked) Keeps(d *settle.Taken) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur == d {
		t.cur = nil
	}
	if d == t.untoldOf {
		return true // never settled here (untold)
	}
	round := t.round
	t.round = 0
	switch dropped, keep := d.Dropped(); {
	case dropped && keep == 0:
		return false // in a save already
	case dropped:
		round = keep
	case !t.hold:
		return false
	case round == 0:
		round = t.last + 1
	}
	t.kept = append(t.kept, keptItem{d, round})
	return true
}

// handsOff settles the replica's delivery in hand as its Run returns,
// before what it kept for a save is settled (ended).
func (t *tracked) handsOff() {
	if h, ok := t.Replica.(engine.Hands); ok {
		h.Hand(nil)
	}
}

// delivered is the replica's delivery in hand, from a queue whose
// consuming stage restarts elsewhere (nil: none).
func delivered(r nodes.Replica) *settle.Taken {
	if h, ok := r.(engine.Hands); ok {
		t, _ := h.Delivered().(*settle.Taken)
		return t
	}
	return nil
}

// ended settles what the replica kept for a save, now that it has
// returned, and reports false when its share is over before: what it
// kept comes back to a restart. Where its group saves, that waits for
// the group's final save (its last member's return): until then a group
// lost whole restores its last save, this member included, and trains
// again on what came after. A local group's last member to return
// settles every member's; a member of a group across workers leaves it
// and asks the host, the wait counted as the replica's idle time.
func (t *tracked) ended(ctx context.Context, s *graph.Stage) bool {
	t.mu.Lock()
	hold := t.hold
	t.mu.Unlock()
	switch g := t.f.groupOf(s.Name); {
	case !hold:
	case t.local != nil:
		t.local.returned(t.Index())
		return true
	case g != nil:
		t.Replica.Group().Leave() // its group's rounds do not wait for it
		if f, ok := t.Replica.(interface{ Free() }); ok {
			f.Free() // a move that takes its device goes on now
		}
		end := func() {}
		if w, ok := t.Replica.(interface{ WaitIdle() (end func()) }); ok {
			end = w.WaitIdle() // the wait for the final save is idle, not work
		}
		done := g.Done(ctx, t.Index())
		end()
		if !done {
			return false
		}
	}
	t.saved(^uint32(0))
	return true
}

// saved settles the items kept for a save that holds their round (every
// one where round is ^0: the replica has returned), and returns them.
func (t *tracked) saved(round uint32) []*settle.Taken {
	t.mu.Lock()
	var done []*settle.Taken
	t.kept = slices.DeleteFunc(t.kept, func(k keptItem) bool {
		if k.round <= round {
			done = append(done, k.t)
			return true
		}
		return false
	})
	t.mu.Unlock()
	for _, d := range done {
		d.Finish()
	}
	return done
}

type trackedIn struct {
	nodes.Input
	t *tracked
}

func (in *trackedIn) Recv(ctx context.Context) (any, error) {
	t := in.t
	for {
		// The engine settles the delivery in hand first (Taken.Done).
		item, err := in.Input.Recv(ctx)
		if err != nil {
			return item, err
		}
		rec := delivered(t.Replica)
		// Taken again, from a member lost or gone since: its group across
		// workers says whether it is in the group's state already.
		var trained bool
		var at uint32
		if rec != nil && rec.Again() { // rare: the group is looked up only then
			if g := t.f.groupOf(t.Stage()); g != nil {
				if at, trained, err = t.trained(ctx, g, rec.ID()); err != nil {
					t.untold(ctx, rec, err)
					return nil, err
				}
			}
		}
		t.mu.Lock()
		t.cur = rec
		round, drop := uint32(0), false
		if rec != nil {
			rec.HeldBy(t)
			t.open++
			if t.skip != nil {
				round, drop = t.skip[rec.ID()]
			}
			if !drop && trained {
				round, drop = at, true
			}
		}
		if rec != nil && !drop && t.steps {
			t.took = append(t.took, rec.ID())
		}
		if drop {
			// Trained on before the state the restart took was: in it
			// already, settled at the next receive (or at the save that
			// holds it).
			delete(t.skip, rec.ID())
			keep := uint32(0)
			if round > 0 && t.hold {
				keep = round
			}
			rec.Drop(keep)
		}
		t.mu.Unlock()
		if !drop {
			return item, nil
		}
		fmt.Fprintf(t.f.env.Share.Log(), "dflow worker %s: stage %s replica %d drops item %s, which the state it took over was trained on\n", t.f.env.Share.Worker(), t.Stage(), t.Index(), rec.ID())
	}
}

// untold keeps rec, an item taken again whose group could not say
// whether it trained it, from being settled here, and fails the share
// (unless the run is ending): a node that goes on receiving past the
// error must not have the item acked untrained, nor trained twice. The
// item stays in its stream.
func (t *tracked) untold(ctx context.Context, rec *settle.Taken, err error) {
	t.mu.Lock()
	t.cur, t.untoldOf = rec, rec
	rec.HeldBy(t)
	t.open++
	t.mu.Unlock()
	if ctx.Err() == nil {
		t.f.env.Share.Fail(err)
	}
}

// trained asks t's group across workers whether item id, taken again,
// was trained in a completed step. The group answers at once, or, where
// a member has the item in hand in the step under way, once that step
// completes or that member is lost: a member whose share stopped keeping
// the item (paused, or cut off) yet is not counted lost could keep that
// step open for ever, so the wait is bounded, and the run fails then
// rather than train the item twice or not at all.
func (t *tracked) trained(ctx context.Context, g *group.Member, id string) (uint32, bool, error) {
	tm := t.f.env.Job.Timings.WithDefaults()
	wait := 3*tm.Lease + tm.AckWait
	c, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	round, trained, err := g.Trained(c, t.Index(), id)
	switch {
	case err == nil:
		return round, trained, nil
	case ctx.Err() != nil:
		return 0, false, ctx.Err()
	case c.Err() != nil:
		return 0, false, fmt.Errorf("stage %s replica %d: item %s came again while another member had it in hand in the step under way, and that member was neither lost nor done within %v: its worker stopped keeping the item (paused, or cut off from the coordinator?), and whether it was trained cannot be known", t.Stage(), t.Index(), id, wait)
	}
	return 0, false, fmt.Errorf("stage %s replica %d: item %s came again, and its group could not say whether it was trained: %w", t.Stage(), t.Index(), id, err)
}

type trackedOut struct {
	nodes.Output
	t *tracked
}

func (o *trackedOut) Send(ctx context.Context, item any) error {
	t := o.t
	if err := o.Output.Send(ctx, item); err != nil {
		return err
	}
	t.f.env.Share.AfterSend(t.Stage()) // tests: a crash between a send and its input's settling
	return nil
}

// ownClock is the engine's replica taking a node's own account of its
// time (a plugin that measures its own busy and idle time; plugins/host).
type ownClock interface {
	OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool)
	OwnService(sum time.Duration, counts map[time.Duration]int64)
}

// clocked is a replica as a runtime around a node embeds it: it passes
// the node's own account of its time on to the engine's replica, as the
// node would without the runtime around it (plugins/host asks its replica
// for OwnTimes and OwnService).
type clocked struct{ nodes.Replica }

func (c clocked) OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool) {
	if o, ok := c.Replica.(ownClock); ok {
		o.OwnTimes(idle, blocked, idleNow, blockedNow)
	}
}

func (c clocked) OwnService(sum time.Duration, counts map[time.Duration]int64) {
	if o, ok := c.Replica.(ownClock); ok {
		o.OwnService(sum, counts)
	}
}
