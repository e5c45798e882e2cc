package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
)

// sealChain seals the chain record of lost share in (wire.SealChain: a
// share that is only slow writes no more of it, and acks nothing more),
// and adds its resuming sources' last heads to those a restart counts
// apart (Job.Recount).
func (c *Coordinator) sealChain(in *instance) error {
	if len(c.chained) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, wire.BucketEnds(c.run))
	if err != nil {
		return fmt.Errorf("sealing the chains' record of the share %s: %w", in.name, err)
	}
	rec, err := wire.SealChain(ctx, kv, in.name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.recount.MergeSources(rec.Last)
	c.mu.Unlock()
	return nil
}

// localSaves is the coordinator's record of the local groups' saves, by
// stage, from what their shares say.
type localSaves struct {
	mu    sync.Mutex
	notes map[string]wire.SavesNote
}

func (c *Coordinator) savesNote(m *nats.Msg) {
	var n wire.SavesNote
	if json.Unmarshal(m.Data, &n) != nil {
		return
	}
	stage := n.Stage
	c.mu.Lock()
	in := c.instances[n.Share]
	counted := in != nil && !in.lost
	c.mu.Unlock()
	if counted { // a share counted lost speaks for a group that restarts
		c.saves.mu.Lock()
		if c.saves.notes == nil {
			c.saves.notes = map[string]wire.SavesNote{}
		}
		// (a first note has no old one: its step stands, -1 included;
		// taken from a zero note it read as a save of step 0, which a
		// group lost before its first save then failed to restore)
		if old, had := c.saves.notes[stage]; had && n.Step < 0 && old.Step >= 0 && old.Share != n.Share {
			n.Step, n.Skip = old.Step, old.Skip // a restored group's, until its first save
		}
		if old, had := c.saves.notes[stage]; had && old.Final && old.Share != n.Share {
			n = old // a final group's restart: final still
		}
		c.saves.notes[stage] = n
		c.saves.mu.Unlock()
	}
	m.Respond(nil)
}

// restoreFor says how a local group lost whole restarts: from its last
// save (or, final, dropping everything), or not at all (false: it saves
// nothing).
func (c *Coordinator) restoreFor(stage string) (*wire.Restore, bool) {
	c.saves.mu.Lock()
	defer c.saves.mu.Unlock()
	n, ok := c.saves.notes[stage]
	if !ok || !n.Saves {
		return nil, false
	}
	return &wire.Restore{Step: n.Step, Skip: n.Skip, Final: n.Final}, true
}

// LastSave is the step of stage's last save that the coordinator holds:
// what its group restores if it is lost whole (false: none yet, or the
// stage's group saves nothing on the cluster). A save is the
// coordinator's once a member has told it, after the checkpoint is
// written: one lost in between is not, and the group restores the save
// before it.
func (c *Coordinator) LastSave(stage string) (step int, ok bool) {
	c.mu.Lock()
	h := c.groups[stage]
	c.mu.Unlock()
	if h != nil {
		step := h.SaveStep()
		return step, step >= 0
	}
	c.saves.mu.Lock()
	defer c.saves.mu.Unlock()
	n, had := c.saves.notes[stage]
	return n.Step, had && n.Saves && n.Step >= 0
}

// whyNot says why a group summing on one worker, lost whole, cannot
// restore.
func (c *Coordinator) whyNot(stage string) string {
	return "and it saves nothing to restore (a checkpoint, for a kind that writes one)"
}
