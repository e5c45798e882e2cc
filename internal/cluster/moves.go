package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/report"
)

// Moves across hosts (CoordOptions.Rebalance).
//
// The coordinator decides the moves on the merged figures of every
// worker, and a worker makes its part of each (package engine's
// parked.go). Every rebalanced stage gets spare slots, parked replicas of
// its own: on each worker as many as the rebalanced replicas placed
// there, so that any device there may go to any of the stages. A move of
// a replica from stage A to stage B picks a running replica of A (the
// highest index, on a worker where another replica of A runs, and that
// has a parked slot of B), and asks that worker's share to let the
// replica leave after its item in hand and start the slot on its device
// once it has: the new replica runs where the freed device is. A stage
// whose inputs have ended (every replica feeding them done), or every
// stage once the run drains or fails, has its slots let go: they will not
// start, and their queues no longer wait for them. A share taking over a
// lost worker's replicas is told which slots had started and which
// replicas had left (Job.Started, Job.Left).
//
// A group stage's members move too (package group: a slot joins as a
// restart does, a member a move takes away never comes back, Host.Moved),
// but not a group that restarts whole (engine.Movable); moves start from a
// split at the full budget: a spare replica of the budget (a move from no
// stage) has no device to start on.

// moves is the coordinator's record of a rebalance across hosts.
type moves struct {
	// parked are the slots each rebalanced stage got (the last of its
	// replicas), from is the first slot's index
	parked map[string]int
	from   map[string]int
	// started are the slots a move started (or will, once the replica
	// leaving their device has returned), in the order moves chose them;
	// leaving the replicas told to leave; released the stages whose slots
	// are let go, and told the shares told so
	started  map[string][]int
	leaving  map[string]map[int]bool
	released map[string]bool
	told     map[string]map[string]bool
	made     []report.Move
	said     string // the last move not made, as the log said it
}

// slots places a rebalance's spare slots: stage -> the worker of each,
// as many on each worker as the rebalanced replicas placed there.
func slots(stages []string, place map[string][]string, workers []string) map[string][]string {
	on := map[string]int{}
	for _, name := range stages {
		for _, w := range place[name] {
			on[w]++
		}
	}
	out := map[string][]string{}
	for _, name := range stages {
		for _, w := range workers {
			for range on[w] {
				out[name] = append(out[name], w)
			}
		}
	}
	return out
}

// addSlots gives the rebalanced stages their parked slots, placed after
// the replicas placed already (which stay where they were).
func (c *Coordinator) addSlots() error {
	rb := c.g.Rebalance
	sl := slots(rb.Stages, c.place, c.workers)
	mv := &moves{parked: map[string]int{}, from: map[string]int{}, started: map[string][]int{},
		leaving: map[string]map[int]bool{}, released: map[string]bool{}, told: map[string]map[string]bool{}}
	pins := map[string][]string{}
	for _, s := range c.g.Stages {
		pins[s.Name] = c.place[s.Name]
	}
	for _, name := range rb.Stages {
		mv.parked[name], mv.from[name] = len(sl[name]), c.g.Stage(name).Replicas
		mv.leaving[name], mv.told[name] = map[int]bool{}, map[string]bool{}
		pins[name] = append(slices.Clone(c.place[name]), sl[name]...)
	}
	g, err := wire.WithSlots(c.g, mv.parked)
	if err != nil {
		return err
	}
	c.g, c.o.Graph = g, g
	c.place, c.remote, c.chained = control.Place(g, c.workers, c.kinds(), pins)
	c.o.Job.Parked = mv.parked
	c.moves = mv
	return nil
}

// visible is s as a user sees it: each rebalanced stage's replicas in a
// fixed order (the spec's, then the slots in the order moves started
// them, as in one process: a replica keeps its place from one snapshot
// to the next, which the series and the policy's fits compare), the
// slots no move started left out of the stages and of their edges'
// producers, and the moves made so far.
func (c *Coordinator) visible(s *report.Snapshot) *report.Snapshot {
	mv := c.moves
	if mv == nil {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := *s
	out.Moves = slices.Clone(mv.made)
	shown := func(stage string, i int) bool {
		from, ok := mv.from[stage]
		return !ok || i < from || slices.Contains(mv.started[stage], i)
	}
	out.Stages = make([]report.StageSnapshot, len(s.Stages))
	for si, st := range s.Stages {
		if from, ok := mv.from[st.Name]; ok {
			st.Rebalanced = true
			reps := slices.Clone(st.Replicas[:min(from, len(st.Replicas))])
			for _, j := range mv.started[st.Name] {
				if j < len(st.Replicas) {
					r := st.Replicas[j]
					if r.Parked { // chosen, not yet started
						r = report.ReplicaSnapshot{Worker: r.Worker}
					}
					reps = append(reps, r)
				}
			}
			st.Replicas = reps
		}
		out.Stages[si] = st
	}
	out.Edges = make([]report.EdgeSnapshot, len(s.Edges))
	for ei, e := range s.Edges {
		if _, ok := mv.from[e.From]; ok {
			e.Queues = slices.Clone(e.Queues)
			for qi := range e.Queues {
				q := &e.Queues[qi]
				if ge := c.g.Edge(e.Name); ge != nil && qi < len(ge.Queues) {
					q.Producers = nil
					for _, p := range ge.Queues[qi].Producers {
						if shown(e.From, p) {
							q.Producers = append(q.Producers, p)
						}
					}
				}
				var open []int
				for _, p := range q.Open {
					if shown(e.From, p) {
						open = append(open, p)
					}
				}
				q.Open = open
			}
		}
		out.Edges[ei] = e
	}
	return &out
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
	moves, done := c.o.Rebalance(c.visible(s))
	if len(moves) == 0 {
		return
	}
	made := c.move(s, moves)
	if done != nil {
		done(made)
	}
}

// release lets go the parked slots of each rebalanced stage whose inputs
// have ended (or of all, with all set), on every share that has one,
// until each has said it did (one that did not answer is asked again at
// the next look). An input has ended once every replica of the stage
// that feeds it is done, as the share that runs it says (it shows a
// producer done only once its queues are closed there: package share's
// sent); a slot started now would find nothing.
func (c *Coordinator) release(s *report.Snapshot, all bool) {
	mv := c.moves
	c.mu.Lock()
	done := map[string]bool{} // stages whose every replica is done, as its own share says
	for _, st := range s.Stages {
		done[st.Name] = true
		for i, r := range st.Replicas {
			var own *instance
			if i < len(c.place[st.Name]) {
				own = c.instances[c.place[st.Name][i]]
			}
			said := own != nil && (own.last != nil || own.done)
			done[st.Name] = done[st.Name] && r.Done && said
		}
	}
	asks := map[string][]string{} // share -> stages to let go there
	for _, name := range c.g.Rebalance.Stages {
		if !mv.released[name] {
			ended := true
			for _, e := range c.g.Edges {
				if e.To.Stage.Name == name {
					ended = ended && done[e.From.Stage.Name]
				}
			}
			if !ended && !all {
				continue
			}
			mv.released[name] = true
		}
		for i := mv.from[name]; i < len(c.place[name]); i++ {
			in := c.instances[c.place[name][i]]
			if in != nil && !in.done && !in.lost && !mv.told[name][in.name] && !slices.Contains(asks[in.name], name) {
				asks[in.name] = append(asks[in.name], name)
			}
		}
	}
	c.mu.Unlock()
	for inst, stages := range asks {
		for _, name := range stages {
			if err := c.ask(inst, wire.Move{Release: name}); err != nil {
				fmt.Fprintf(c.o.Log, "dflow: rebalance: letting the spare slots of stage %s go on %s: %v (asked again at the next look)\n", name, inst, err)
				continue
			}
			c.mu.Lock()
			mv.told[name][inst] = true
			c.mu.Unlock()
		}
	}
}

// move makes moves, as many replicas of each as can be placed: each on
// the worker where a replica of its From stage runs and a slot of its To
// stage is parked (pick). One that cannot be placed (no worker has a
// replica to spare beside a slot, or a spare of the budget, which has no
// device here) is not made, and the log says why, once for each reason;
// moves[i].Replicas is set to what was made (the policy records that),
// and it reports whether any was. The moves made are recorded, stamped
// with the time they were made.
func (c *Coordinator) move(s *report.Snapshot, moves []report.Move) bool {
	mv := c.moves
	type unit struct {
		i            int // of moves
		leave, start int
		inst         string
	}
	var plan []unit
	taken := map[string]map[int]bool{}
	for i, m := range moves {
		why, n := "", 0
		if m.From == "" {
			why = "a spare replica of the budget has no device on a cluster"
		}
		for ; why == "" && n < m.Replicas; n++ {
			leave, start, inst, ok := c.pick(s, m.From, m.To, taken)
			if !ok {
				why = fmt.Sprintf("no worker has a replica of %s to spare beside a slot of %s (a worker keeps one replica of each stage it runs)", m.From, m.To)
				break
			}
			plan = append(plan, unit{i, leave, start, inst})
		}
		if why != "" {
			from := m.From
			if from == "" {
				from = "(spare)"
			}
			if msg := fmt.Sprintf("dflow: rebalance: %d of the %d replicas %s -> %s the policy would move can move: %s", n, m.Replicas, from, m.To, why); msg != mv.said {
				mv.said = msg
				fmt.Fprintln(c.o.Log, msg)
			}
		}
		moves[i].Replicas = 0 // counted again as they are made
	}
	for _, u := range plan {
		m := moves[u.i]
		if err := c.ask(u.inst, wire.Move{From: m.From, Leave: u.leave, To: m.To, Start: u.start}); err != nil {
			fmt.Fprintf(c.o.Log, "dflow: rebalance: moving %s[%d] to %s[%d] on %s: %v\n", m.From, u.leave, m.To, u.start, u.inst, err)
			continue
		}
		c.mu.Lock()
		mv.leaving[m.From][u.leave] = true
		mv.started[m.To] = append(mv.started[m.To], u.start)
		if h := c.groups[m.From]; h != nil {
			h.Moved(u.leave) // it does not come back to its group (membership.go)
		}
		c.mu.Unlock()
		moves[u.i].Replicas++
	}
	at := time.Since(c.start).Seconds()
	any := false
	c.mu.Lock()
	for _, m := range moves {
		if m.Replicas > 0 {
			m.T = at
			mv.made = append(mv.made, m)
			any = true
		}
	}
	c.mu.Unlock()
	return any
}

// pick chooses a move of one replica from stage from to stage to: the
// running replica of from of highest index, on a worker with a parked
// slot of to, while another replica of from keeps running.
func (c *Coordinator) pick(s *report.Snapshot, from, to string, taken map[string]map[int]bool) (leave, start int, inst string, ok bool) {
	mv := c.moves
	var fs, ts *report.StageSnapshot
	for i := range s.Stages {
		switch s.Stages[i].Name {
		case from:
			fs = &s.Stages[i]
		case to:
			ts = &s.Stages[i]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if fs == nil || ts == nil || mv.released[to] || mv.released[from] {
		return 0, 0, "", false
	}
	running := func(st *report.StageSnapshot, i int) bool {
		r := st.Replicas[i]
		return !r.Parked && !r.Done && !r.Left && !mv.leaving[st.Name][i] && !taken[st.Name][i]
	}
	take := func(stage string, i int) {
		if taken[stage] == nil {
			taken[stage] = map[int]bool{}
		}
		taken[stage][i] = true
	}
	var live []int
	for i := range fs.Replicas {
		if running(fs, i) {
			live = append(live, i)
		}
	}
	if len(live) < 2 {
		return 0, 0, "", false
	}
	on := map[string]int{} // running replicas of from, by share
	for _, i := range live {
		on[c.place[from][i]]++
	}
	for k := len(live) - 1; k >= 0; k-- {
		i := live[k]
		w := c.place[from][i]
		if on[w] < 2 {
			// The last one here: its share's side of the stage's input
			// queues holds what it fetched for the replicas here, which
			// the parked slots would not read.
			continue
		}
		for j := mv.from[to]; j < len(ts.Replicas) && j < len(c.place[to]); j++ {
			if c.place[to][j] == w && ts.Replicas[j].Parked && !slices.Contains(mv.started[to], j) && !taken[to][j] {
				take(from, i)
				take(to, j)
				return i, j, w, true
			}
		}
	}
	return 0, 0, "", false
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
