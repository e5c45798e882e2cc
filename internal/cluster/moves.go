package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/moves"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/report"
)

// Moves across hosts (CoordOptions.Rebalance): package moves keeps the
// record and decides where each move goes; the coordinator asks the
// shares to make them, and a worker makes its part of each (package
// engine's parked.go).

// addSlots gives the rebalanced stages their parked slots, placed after
// the replicas placed already (which stay where they were).
func (c *Coordinator) addSlots() error {
	rb := c.g.Rebalance
	sl := moves.Slots(rb.Stages, c.place, c.workers)
	own := map[string]int{}
	pins := map[string][]string{}
	for _, s := range c.g.Stages {
		pins[s.Name] = c.place[s.Name]
	}
	for _, name := range rb.Stages {
		own[name] = c.g.Stage(name).Replicas
		pins[name] = append(slices.Clone(c.place[name]), sl[name]...)
	}
	b := moves.New(own, sl)
	g, err := wire.WithSlots(c.g, b.Parked())
	if err != nil {
		return err
	}
	c.g, c.o.Graph = g, g
	c.place, c.remote, c.chained = control.Place(g, c.workers, c.kinds(), pins)
	c.o.Job.Parked = b.Parked()
	c.moves = b
	return nil
}

// visible is s as a user sees it (moves.Book.Visible).
func (c *Coordinator) visible(s *report.Snapshot) *report.Snapshot {
	if c.moves == nil {
		return s
	}
	return c.moves.Visible(s, c.g)
}

// rebalance releases the slots of the stages that have ended (of every
// stage, once over is set: the run drains or fails), then asks the policy
// for moves and makes them, at a snapshot s (the parked slots in it).
func (c *Coordinator) rebalance(s *report.Snapshot, over bool) {
	if c.moves == nil {
		return
	}
	c.release(s, over)
	if over || c.o.Rebalance == nil {
		return
	}
	ms, done := c.o.Rebalance(c.visible(s))
	if len(ms) == 0 {
		return
	}
	made := c.move(s, ms)
	if done != nil {
		done(made)
	}
}

// release lets go the parked slots of each rebalanced stage whose inputs
// have ended (or of all, with all set), on every share that has one,
// until each has said it did (one that did not answer is asked again at
// the next look).
func (c *Coordinator) release(s *report.Snapshot, all bool) {
	c.mu.Lock()
	v := moves.View{Place: c.place, Said: map[string]bool{}, Live: map[string]bool{}}
	for name, in := range c.instances {
		v.Said[name] = in.last != nil || in.done
		v.Live[name] = !in.done && !in.lost
	}
	asks := c.moves.Release(s, c.g, v, all)
	c.mu.Unlock()
	for inst, stages := range asks {
		for _, name := range stages {
			if err := c.ask(inst, wire.Move{Release: name}); err != nil {
				fmt.Fprintf(c.o.Log, "dflow: rebalance: letting the spare slots of stage %s go on %s: %v (asked again at the next look)\n", name, inst, err)
				continue
			}
			c.moves.Told(name, inst)
		}
	}
}

// move makes moves, as many replicas of each as package moves can place
// (moves.Book.Plan; the log says why one is not made, once for each
// reason). ms[i].Replicas is set to what was made (the policy records
// that), and it reports whether any was. The moves made are recorded,
// stamped with the time they were made.
func (c *Coordinator) move(s *report.Snapshot, ms []report.Move) bool {
	c.mu.Lock()
	place := c.placeCopy()
	c.mu.Unlock()
	plan, why := c.moves.Plan(s, ms, place)
	for _, msg := range why {
		fmt.Fprintln(c.o.Log, msg)
	}
	for i := range ms {
		ms[i].Replicas = 0 // counted again as they are made
	}
	for _, u := range plan {
		if err := c.ask(u.Inst, wire.Move{From: u.From, Leave: u.Leave, To: u.To, Start: u.Start}); err != nil {
			fmt.Fprintf(c.o.Log, "dflow: rebalance: moving %s[%d] to %s[%d] on %s: %v\n", u.From, u.Leave, u.To, u.Start, u.Inst, err)
			continue
		}
		c.mu.Lock()
		c.moves.Made(u)
		if h := c.groups[u.From]; h != nil {
			h.Moved(u.Leave) // it does not come back to its group (package restarts)
		}
		c.mu.Unlock()
		ms[u.Move].Replicas++
	}
	return c.moves.Record(ms, time.Since(c.start).Seconds())
}

// ask sends share inst a move and waits for its answer.
func (c *Coordinator) ask(inst string, m wire.Move) error {
	b, _ := json.Marshal(m)
	msg, err := c.o.Conn.Request(wire.SubjMove(c.run, inst), b, 5*time.Second)
	if err != nil {
		return err
	}
	var r wire.Reply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return err
	}
	if r.Err != "" {
		return errors.New(r.Err)
	}
	return nil
}
