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
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
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
// with the fewest, or says which stateful replica was lost.
func (c *Coordinator) recover(in *instance) error {
	// Whatever it still does, the share is over: told so, it stops keeping
	// its items from redelivery (a worker that was only slow, say).
	c.o.Conn.Publish(wire.SubjAbortShare(c.run, in.name), nil)
	ended := c.endedOn(in)
	if err := c.sealChain(in); err != nil {
		return fmt.Errorf("worker %s lost: %w", in.worker, err)
	}
	// why the share is over: its worker silent, or a group's restore
	// needs a member it ran back (its worker lives)
	lost := fmt.Sprintf("worker %s lost (no word from it for %v)", in.worker, c.o.Timings.Lease)
	if in.evict != "" {
		lost = fmt.Sprintf("the share %s on worker %s, counted lost for stage %q's restore of its last save (the worker lives)", in.name, in.worker, in.evict)
	}
	c.mu.Lock()
	c.lastLoss = time.Now()
	c.markRan(in)
	type rep struct {
		s *graph.Stage
		i int
	}
	var move, stay []rep
	var moved []string
	var stateful error
	for _, s := range c.g.Stages {
		for i, p := range c.place[s.Name] {
			if p != in.name {
				continue
			}
			switch {
			case ended[finished.Replica{Stage: s.Name, I: i}]:
				// its worker recorded it settled (endedOn): nothing of
				// it can come back, and its consumers may have ended on
				// its ends; run again, it could take an item another
				// lost replica held and send it after its end
				stay = append(stay, rep{s, i})
				in.last = finished.MarkDone(in.last, s.Name, i)
				if h := c.groups[s.Name]; h != nil {
					h.LeftLost(i, in.name)
				}
			case c.restartable(s):
				// done or not: not recorded settled, it may have left
				// an item unsettled, which comes back to its restart
				move = append(move, rep{s, i})
				if say := c.restartSaid(s.Name, i); say != "" {
					moved = append(moved, say)
				}
				if err := c.loseMember(in, s, i); err != nil && stateful == nil {
					stateful = err
				}
			case finished.Done(in.last, s.Name, i):
				stay = append(stay, rep{s, i}) // finished: not run again
			case stateful == nil:
				if h := c.groups[s.Name]; h != nil {
					h.Lose(i, in.name)
				}
				stateful = fmt.Errorf("%s: stage %q replica %d (%s) keeps state and cannot restart elsewhere; the run fails (a checkpointing node resumes from its last checkpoint on the next run)",
					lost, s.Name, i, s.Node)
			}
		}
	}
	c.mu.Unlock()
	if stateful != nil {
		fmt.Fprintf(c.o.Log, "dflow: %v\n", stateful)
		return stateful
	}
	// A finished replica that stays where it was lost has sent all it
	// will.
	var stayed []string
	for _, r := range stay {
		stayed = append(stayed, fmt.Sprintf("%s[%d]", r.s.Name, r.i))
		if err := c.writeEnds(r.s, r.i); err != nil {
			return fmt.Errorf("%s: stage %q replica %d had finished, but its end of input could not be recorded: %v", lost, r.s.Name, r.i, err)
		}
	}
	if len(move) == 0 {
		fmt.Fprintf(c.o.Log, "dflow: %s: its replicas had finished (%s)\n", lost, strings.Join(stayed, ", "))
		return nil
	}
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
		target := c.leastLoaded(gone...)
		if target == "" {
			return fmt.Errorf("%s, and no live worker left to restart %s on", lost, strings.Join(moved, ", "))
		}
		c.mu.Lock()
		c.restarts++
		inst := fmt.Sprintf("%s-r%d", target, c.restarts)
		for _, r := range move {
			c.place[r.s.Name][r.i] = inst
		}
		delete(c.instances, failed)
		c.instances[inst] = &instance{name: inst, worker: target}
		c.mu.Unlock()
		finished := ""
		if len(stayed) > 0 {
			finished = " (" + strings.Join(stayed, ", ") + " had finished)"
		}
		fmt.Fprintf(c.o.Log, "dflow: %s: restarting %s on %s%s; its unfinished items are redelivered\n",
			lost, strings.Join(moved, ", "), target, finished)
		err := c.startInstance(target, inst)
		if !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		failed = inst
		fmt.Fprintf(c.o.Log, "dflow: worker %s did not answer (gone too): restarting %s elsewhere\n", target, strings.Join(moved, ", "))
		gone = append(gone, target)
	}
}

// restartSaid names replica i of stage in a restart's log line: "" for
// a rebalance's slot that no move started (it stays parked), and a
// replica a move took away is said not to run again. c.mu held.
func (c *Coordinator) restartSaid(stage string, i int) string {
	if c.moves != nil {
		return c.moves.Said(stage, i)
	}
	return fmt.Sprintf("%s[%d]", stage, i)
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

// loseMember takes replica i of s, lost with in, out of its group across
// workers. A group whose state moves needs a member left to take it from,
// or a save to restore (a hosted group's, or what the share of a group
// summing on the lost worker said: records.go): without either, the run
// fails.
func (c *Coordinator) loseMember(in *instance, s *graph.Stage, i int) error {
	h := c.groups[s.Name]
	if h == nil {
		// no group across workers: every replica was on the lost one,
		// summing there; it restores its last save where it saves
		if r, ok := c.restoreFor(s.Name); ok && wire.Moves(c.o.Registry, s) {
			if c.restores == nil {
				c.restores = map[string]*wire.Restore{}
			}
			switch {
			case i != slices.Index(c.place[s.Name], in.name): // said once, at its first replica
			case r.Final:
				fmt.Fprintf(c.o.Log, "dflow: stage %q lost every member of its group after its final save: its restarts drop what comes back\n", s.Name)
			default:
				fmt.Fprintf(c.o.Log, "dflow: stage %q lost every member of its group: its restarts restore its last save (%s)\n", s.Name, host.StepSaid(r.Step))
			}
			c.restores[s.Name] = r
			return nil
		}
		if wire.Moves(c.o.Registry, s) {
			return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) had every replica of its group there (%d), and its state is gone with them, %s; the run fails (a checkpointing node resumes from its last checkpoint on the next run)",
				in.worker, c.o.Timings.Lease, s.Name, s.Node, s.Replicas, c.whyNot(s.Name))
		}
		return nil
	}
	if c.moves != nil && c.moves.Leaving(s.Name, i) {
		if !h.LoseMoved(i, in.name) {
			// A move took it away (the share that takes over does not
			// run it: Job.Left): it has left its group, its step under
			// way counting for nothing, and what it trained comes back
			// to members that drop it (Member.Trained).
			return nil
		}
		// It held the group's state (it left last, or was the last
		// present): it restarts as any lost member does.
		c.moves.Back(s.Name, i)
	}
	if wire.Whole(c.o.Registry, s) {
		return c.loseWhole(in, s, i, h)
	}
	present := h.Lose(i, in.name)
	if present == 0 && h.Keeps() && h.AnyDue() {
		return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) replica %d keeps state, and no member of its group is left to take it from, %s; the run fails (a checkpointing node resumes from its last checkpoint on the next run)",
			in.worker, c.o.Timings.Lease, s.Name, s.Node, i, h.Why())
	}
	if h.Restoring(i) {
		fmt.Fprintf(c.o.Log, "dflow: stage %q lost every member of its group: its restarts restore its last save (%s)\n", s.Name, h.SaveSaid())
	}
	// Members that had finished after the save, on shares still counted
	// live, restart to restore it too: their shares are counted lost now
	// (the host refuses them already: what they say is not the run's),
	// and restarted at the next check (checkLive). A share counted lost
	// restarts all it runs, so each must be able to, or have finished,
	// and a member whose share has ended cannot restart: else the run
	// fails here, for the restore, not for a worker lost (it is not).
	ev := h.Evictions()
	for _, x := range ev {
		needs := fmt.Sprintf("stage %q lost every member of its group, and its restore of its last save needs back member %d, which had finished since, on the share %s", s.Name, x.Member, x.Share)
		if err := c.evictable(s, x, ev, needs); err != nil {
			return err
		}
	}
	for _, x := range ev {
		if e := c.instances[x.Share]; e != nil && !e.lost {
			e.lost, e.evict = true, s.Name
			c.markRan(e)
			c.evicted = append(c.evicted, e)
			if x.Moved {
				fmt.Fprintf(c.o.Log, "dflow: stage %q restores its last save: the share %s, on worker %s, ran member %d, which a move took away since; the share restarts without it, and what it trained since comes back\n", s.Name, x.Share, e.worker, x.Member)
			} else {
				fmt.Fprintf(c.o.Log, "dflow: stage %q restores its last save: the share %s, on worker %s, ran member %d, which had finished since and restarts too\n", s.Name, x.Share, e.worker, x.Member)
			}
		}
	}
	return nil
}

// loseWhole loses member i of stage s with share in, for a group that
// cannot go on without any member (Spec.Whole: a torch process group
// cannot shrink): every share that runs another member is counted lost
// too (they restart), and the group restores its last save whole (or,
// having saved nothing yet, starts afresh, its inputs coming back), in a
// new attempt, whose ranks meet at its new rank 0 (Job.Attempt). A share
// counted in this attempt's loss already (the lost one's other members,
// those stopped for it) changes nothing more; a restart lost during the
// restore begins another attempt. Each share it stops must be able to
// restart whole (evictable). c.mu held.
func (c *Coordinator) loseWhole(in *instance, s *graph.Stage, i int, h *host.Host) error {
	h.Lose(i, in.name)
	if c.lostWhole[s.Name][in.name] {
		return nil
	}
	var ev []host.Eviction
	for j, share := range c.place[s.Name] {
		if share != in.name {
			ev = append(ev, host.Eviction{Member: j, Share: share})
		}
	}
	for _, x := range ev {
		needs := fmt.Sprintf("stage %q (%s) lost member %d with worker %s, and its group cannot go on without it: its members restart together, member %d among them, on the share %s",
			s.Name, s.Node, i, in.worker, x.Member, x.Share)
		if err := c.evictable(s, x, ev, needs); err != nil {
			return err
		}
	}
	for _, x := range ev {
		h.Lose(x.Member, x.Share)
	}
	restorable := h.RestoreWhole()
	h.Evictions() // the finished members it restores are on the shares stopped above
	if !restorable {
		return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) replica %d is a member of a group that cannot go on without it, and no member of it is left to take its state from, %s; the run fails (a checkpointing node resumes from its last checkpoint on the next run)",
			in.worker, c.o.Timings.Lease, s.Name, s.Node, i, h.Why())
	}
	counted := map[string]bool{in.name: true}
	for _, x := range ev {
		counted[x.Share] = true
		if e := c.instances[x.Share]; e != nil && !e.lost {
			e.lost, e.evict = true, s.Name
			c.markRan(e)
			c.evicted = append(c.evicted, e)
			fmt.Fprintf(c.o.Log, "dflow: stage %q lost member %d with worker %s, and its group cannot go on without it: the share %s, on worker %s, restarts too\n",
				s.Name, i, in.worker, x.Share, e.worker)
		}
	}
	if c.lostWhole == nil {
		c.lostWhole = map[string]map[string]bool{}
	}
	if c.attempts == nil {
		c.attempts = map[string]int{}
	}
	c.lostWhole[s.Name] = counted
	c.attempts[s.Name]++
	fmt.Fprintf(c.o.Log, "dflow: stage %q lost every member of its group: its restarts restore its last save (%s)\n", s.Name, h.SaveSaid())
	return nil
}

// evictable checks that the share of x, a member of s's group that had
// finished, can be counted lost for the group's restore (ev, all the
// members it needs back), so that x restarts: it is counted lost already,
// or it has not ended and everything else it runs can restart elsewhere
// or has finished. c.mu held.
func (c *Coordinator) evictable(s *graph.Stage, x host.Eviction, ev []host.Eviction, needs string) error {
	e := c.instances[x.Share]
	const fails = "the run fails (a checkpointing node resumes from its last checkpoint on the next run)"
	switch {
	case e == nil:
		return fmt.Errorf("%s, which the coordinator does not know, so that the member cannot restart; %s", needs, fails)
	case e.lost:
		return nil // it restarts with the share
	case e.done:
		return fmt.Errorf("%s on worker %s, which has ended, so that the member cannot restart; %s", needs, e.worker, fails)
	}
	for _, t := range c.g.Stages {
		for j, p := range c.place[t.Name] {
			switch {
			case p != x.Share:
			case t == s && slices.ContainsFunc(ev, func(y host.Eviction) bool { return y.Member == j }):
			case c.restartable(t), finished.Done(e.last, t.Name, j):
			default:
				return fmt.Errorf("%s on worker %s, which also runs stage %q replica %d (%s): that replica keeps state and cannot restart elsewhere, and the share restarts whole; %s",
					needs, e.worker, t.Name, j, t.Node, fails)
			}
		}
	}
	return nil
}

// leastLoaded is the live worker, other than those in not, running the
// fewest replicas.
func (c *Coordinator) leastLoaded(not ...string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	load := map[string]int{}
	for _, w := range c.workers {
		if !slices.Contains(not, w) && c.silent(w) < c.o.Timings.Lease {
			load[w] = 0
		}
	}
	for _, s := range c.g.Stages {
		for _, p := range c.place[s.Name] {
			if in := c.instances[p]; in != nil {
				if _, ok := load[in.worker]; ok {
					load[in.worker]++
				}
			}
		}
	}
	best := ""
	for _, w := range c.workers {
		if n, ok := load[w]; ok && (best == "" || n < load[best]) {
			best = w
		}
	}
	return best
}
