package cluster

import (
	"context"
	"encoding/json"
	"fmt"
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

// savesNote takes what the share of a group summing on one worker says
// it saved (restarts.Book.Note), from a share counted live: one counted
// lost speaks for a group that restarts.
func (c *Coordinator) savesNote(m *nats.Msg) {
	var n wire.SavesNote
	if json.Unmarshal(m.Data, &n) != nil {
		return
	}
	c.mu.Lock()
	in := c.instances[n.Share]
	counted := in != nil && !in.lost
	c.mu.Unlock()
	if counted {
		c.restores.Note(n)
	}
	m.Respond(nil)
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
	return c.restores.LastSave(stage)
}
