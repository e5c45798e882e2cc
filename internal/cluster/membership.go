package cluster

// The coordinator's membership and placement: which workers run the
// run, where each replica runs, and what happens when a worker is lost.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/finished"
	"github.com/dflow-dev/dflow/internal/cluster/restarts"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
)

func (c *Coordinator) hello(m *nats.Msg) {
	var h wire.Hello
	if json.Unmarshal(m.Data, &h) != nil || !wire.ValidName.MatchString(h.Name) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.Busy && c.instances[h.Name] == nil {
		delete(c.seen, h.Name) // busy with another run
		return
	}
	c.seen[h.Name] = time.Now()
}

// idle lists the workers heard from lately, sorted.
func (c *Coordinator) idle() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []string
	for w, t := range c.seen {
		if time.Since(t) < c.o.Timings.Lease {
			ws = append(ws, w)
		}
	}
	sort.Strings(ws)
	return ws
}

// Placement says where each replica runs, one line.
func (c *Coordinator) Placement() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, s := range c.g.Stages {
		parts = append(parts, fmt.Sprintf("%s %s", s.Name, strings.Join(c.place[s.Name], ",")))
	}
	return strings.Join(parts, "; ")
}

// Workers are the workers the run uses.
func (c *Coordinator) Workers() []string { return slices.Clone(c.workers) }

// Where returns where each replica runs: stage -> worker per replica.
func (c *Coordinator) Where() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.placeCopy()
}

// placeCopy is a copy of where each replica runs (c.mu held).
func (c *Coordinator) placeCopy() map[string][]string {
	out := map[string][]string{}
	for k, v := range c.place {
		out[k] = slices.Clone(v)
	}
	return out
}

// markRan records which replicas a share lost ran, and adds it to the
// heartbeat's list (c.mu held); once.
func (c *Coordinator) markRan(in *instance) {
	if in.ran != nil {
		return
	}
	var b []byte
	if old := c.lostList.Load(); old != nil {
		b = append(b, *old...)
	}
	b = append(append(b, in.name...), '\n')
	c.lostList.Store(&b)
	in.ran = map[string][]int{}
	for _, s := range c.g.Stages {
		for i, p := range c.place[s.Name] {
			if p == in.name {
				in.ran[s.Name] = append(in.ran[s.Name], i)
			}
		}
	}
}

// silent is how long worker w has not been heard from, the coordinator's
// own pauses aside (c.mu held).
func (c *Coordinator) silent(w string) time.Duration {
	return time.Since(c.paused.Since(c.seen[w]))
}

// checkLive looks for workers gone silent: their stateless replicas
// restart on a live worker; a stateful replica lost fails the run.
func (c *Coordinator) checkLive(ctx context.Context) error {
	c.mu.Lock()
	var lost []*instance
	for _, in := range c.instances {
		if !in.done && !in.lost && c.silent(in.worker) > c.o.Timings.Lease {
			in.lost = true
			c.markRan(in) // now, whatever recover makes of it
			lost = append(lost, in)
		}
	}
	lost = append(lost, c.evicted...)
	c.evicted = nil
	c.mu.Unlock()
	for _, in := range lost {
		if err := c.recover(in); err != nil {
			return err
		}
	}
	return nil
}

// recover restarts the replicas of a lost instance on the live worker
// with the fewest, or says which stateful replica was lost: package
// restarts decides (restarts.Book.Lose), and this says so to the shares,
// writes the ends of those that stay and starts the restart.
func (c *Coordinator) recover(in *instance) error {
	// Whatever it still does, the share is over: told so, it stops keeping
	// its items from redelivery (a worker that was only slow, say).
	c.o.Conn.Publish(wire.SubjAbortShare(c.run, in.name), nil)
	ended := c.endedOn(in)
	if err := c.sealChain(in); err != nil {
		return fmt.Errorf("worker %s lost: %w", in.worker, err)
	}
	c.mu.Lock()
	c.lastLoss = time.Now()
	c.markRan(in)
	v := c.restartView(in)
	l := c.restores.Lose(v, in.name, ended)
	in.last = l.Last
	for _, name := range l.Evicted {
		// counted lost though heard from, restarted at the next check
		// (checkLive): a group's restore needs a member it ran back
		e := c.instances[name]
		e.lost, e.evict = true, v.Shares[name].Evict
		c.markRan(e)
		c.evicted = append(c.evicted, e)
	}
	c.mu.Unlock()
	for _, line := range l.Log {
		fmt.Fprintln(c.o.Log, line)
	}
	if l.Err != nil {
		fmt.Fprintf(c.o.Log, "dflow: %v\n", l.Err)
		return l.Err
	}
	// A finished replica that stays where it was lost has sent all it
	// will.
	var stayed []string
	for _, r := range l.Stay {
		stayed = append(stayed, fmt.Sprintf("%s[%d]", r.Stage, r.I))
		if err := c.writeEnds(c.g.Stage(r.Stage), r.I); err != nil {
			return fmt.Errorf("%s: stage %q replica %d had finished, but its end of input could not be recorded: %v", l.Why, r.Stage, r.I, err)
		}
	}
	if len(l.Move) == 0 {
		fmt.Fprintf(c.o.Log, "dflow: %s: its replicas had finished (%s)\n", l.Why, strings.Join(stayed, ", "))
		return nil
	}
	moved := l.Said
	if len(moved) == 0 {
		moved = []string{"its rebalance's spare slots"}
	}
	// A worker lost at the same time, not yet silent for a lease, may be
	// picked: nobody answers its request (its connection is gone), and
	// the restart goes to the next. Its own share is recovered once its
	// lease runs out.
	gone := []string{in.worker}
	if in.evict != "" {
		gone = nil // its worker lives, or is found lost in turn
	}
	failed := "" // the instance that never started, replaced with the placement
	for {
		c.mu.Lock()
		target := c.restartView(nil).LeastLoaded(gone...)
		if target == "" {
			c.mu.Unlock()
			return fmt.Errorf("%s, and no live worker left to restart %s on", l.Why, strings.Join(moved, ", "))
		}
		c.restarts++
		inst := fmt.Sprintf("%s-r%d", target, c.restarts)
		for _, r := range l.Move {
			c.place[r.Stage][r.I] = inst
		}
		delete(c.instances, failed)
		c.instances[inst] = &instance{name: inst, worker: target}
		c.mu.Unlock()
		finished := ""
		if len(stayed) > 0 {
			finished = " (" + strings.Join(stayed, ", ") + " had finished)"
		}
		fmt.Fprintf(c.o.Log, "dflow: %s: restarting %s on %s%s; its unfinished items are redelivered\n",
			l.Why, strings.Join(moved, ", "), target, finished)
		err := c.startInstance(target, inst)
		if !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		failed = inst
		fmt.Fprintf(c.o.Log, "dflow: worker %s did not answer (gone too): restarting %s elsewhere\n", target, strings.Join(moved, ", "))
		gone = append(gone, target)
	}
}

// restartView is what package restarts reads of the run (c.mu held): the
// shares as they stand, in among them (the share lost, which may be
// known no more).
func (c *Coordinator) restartView(in *instance) *restarts.View {
	v := &restarts.View{Graph: c.g, Registry: c.o.Registry, Lease: c.o.Timings.Lease, Place: c.place,
		Shares: map[string]*restarts.Share{}, Groups: map[string]restarts.Group{}, Moves: c.moves,
		Workers: c.workers, Live: map[string]bool{}}
	share := func(e *instance) *restarts.Share {
		return &restarts.Share{Name: e.name, Worker: e.worker, Done: e.done, Lost: e.lost, Evict: e.evict, Last: e.last}
	}
	for name, e := range c.instances {
		v.Shares[name] = share(e)
	}
	if in != nil {
		v.Shares[in.name] = share(in)
	}
	for stage, h := range c.groups {
		v.Groups[stage] = h
	}
	for _, w := range c.workers {
		v.Live[w] = c.silent(w) < c.o.Timings.Lease
	}
	return v
}

// endedOn reads which restartable replicas placed on in had finished
// there, and stay (finished.Replicas); none where the run's end bucket
// cannot be read.
func (c *Coordinator) endedOn(in *instance) map[finished.Replica]bool {
	c.mu.Lock()
	l := &finished.Lost{Graph: c.g, Place: c.placeCopy(), Remote: c.remote, Chained: c.chained,
		Hosted: map[string]bool{}, Restartable: c.restartable, Share: in.name, Last: in.last}
	for stage := range c.groups {
		l.Hosted[stage] = true
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, wire.BucketEnds(c.run))
	if err != nil {
		return nil
	}
	return finished.Replicas(ctx, kv, l)
}

// writeEnds writes the end keys of replica i of s, a replica that has
// finished (finished.WriteEnds).
func (c *Coordinator) writeEnds(s *graph.Stage, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, wire.BucketEnds(c.run))
	if err != nil {
		return err
	}
	return finished.WriteEnds(ctx, kv, c.g, s, i)
}

// restartable reports whether a stage's replicas may restart elsewhere.
func (c *Coordinator) restartable(s *graph.Stage) bool { return wire.Restartable(c.o.Registry, s) }

// kinds is what placement reads of the stages' kinds.
func (c *Coordinator) kinds() control.Kinds {
	return control.Kinds{Restartable: c.restartable,
		Chainable: func(s *graph.Stage) bool { return wire.Chainable(c.o.Registry, s) }}
}
