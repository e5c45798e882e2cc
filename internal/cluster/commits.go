package cluster

// The coordinator's side of the ledger (ledger.go): a share's commits of
// finished items, counted once and acked.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// commit applies a share's commit (ledger.go): its items' messages are
// acked, then its counts go into the share's ledger, each item's once
// (countOnce), then it is answered. A commit from a share already counted
// lost is refused: its items come back to the shares that took over.
func (c *Coordinator) commit(m *nats.Msg) {
	var cm commit
	if err := json.Unmarshal(m.Data, &cm); err != nil {
		respond(m, fmt.Errorf("bad commit: %v", err))
		return
	}
	c.mu.Lock()
	in := c.instances[cm.Instance]
	switch {
	case in == nil:
		c.mu.Unlock()
		respond(m, fmt.Errorf("no share %q in run %s", cm.Instance, c.run))
		return
	case in.lost:
		c.mu.Unlock()
		respond(m, fmt.Errorf("worker %s was counted lost; its items went to others", in.worker))
		return
	case cm.Seq <= in.seq:
		// Counted already: its answer was lost. Acks are idempotent: they
		// go again.
		c.mu.Unlock()
		if err := c.ack(cm.acks()); err != nil {
			respondRetry(m, err)
			return
		}
		respond(m, nil)
		return
	}
	// Acked, then counted once the server has the acks (if it has not, the
	// worker sends the commit again). The lock is not held meanwhile (the
	// workers' announcements need it), so the share may be counted lost in
	// between: its items are acked, not redelivered, and are counted all
	// the same, in the ledger by which a lost share is counted.
	c.mu.Unlock()
	if err := c.ack(cm.acks()); err != nil {
		respondRetry(m, err)
		return
	}
	c.mu.Lock()
	if cm.Seq > in.seq {
		in.seq = cm.Seq
		in.ledger.add(cm.Counts)
		now := time.Now()
		for _, it := range cm.Items {
			if c.countOnce(it.Queue+"/"+it.ID, now) {
				in.ledger.add(it.Counts)
			} else {
				c.dups++ // done twice (its message came back): counted once
			}
		}
	}
	c.mu.Unlock()
	respond(m, nil)
}

// countOnce reports whether an item (its queue and id) is counted for the
// first time, and remembers it for JetStream's duplicate window: an item
// whose message came back after a commit had counted it (a commit that
// reached the coordinator late, say) was done twice, and is counted once
// (c.mu held).
func (c *Coordinator) countOnce(key string, now time.Time) bool {
	if c.counted == nil {
		c.counted = map[string]bool{}
	}
	for len(c.countedAt) > 0 && now.Sub(c.countedAt[0].at) > 2*time.Minute {
		delete(c.counted, c.countedAt[0].key)
		c.countedAt = c.countedAt[1:]
	}
	if c.counted[key] {
		return false
	}
	c.counted[key] = true
	c.countedAt = append(c.countedAt, countedKey{key, now})
	return true
}

type countedKey struct {
	key string
	at  time.Time
}

// ack acks messages by their reply subjects and waits until the server
// has them; the worker keeps them from redelivery until it hears so.
func (c *Coordinator) ack(subjects []string) error {
	for _, subj := range subjects {
		if subj == "" {
			continue
		}
		if err := c.o.Conn.Publish(subj, []byte("+ACK")); err != nil {
			return err
		}
	}
	if err := c.o.Conn.FlushTimeout(2 * time.Second); err != nil {
		return err
	}
	return nil
}
