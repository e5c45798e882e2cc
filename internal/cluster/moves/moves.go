package moves

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// Book is a rebalance's record across hosts: the spare slots each
// rebalanced stage got, the moves made, the replicas they took away and
// the stages whose slots are let go. It has a lock of its own, taken
// after the coordinator's where both are held.
type Book struct {
	mu sync.Mutex
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

// Slots places a rebalance's spare slots: stage -> the worker of each,
// as many on each worker as the rebalanced replicas placed there, so that
// any device there may go to any of the stages.
func Slots(stages []string, place map[string][]string, workers []string) map[string][]string {
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

// New is the book of a rebalance whose stages have replicas[stage]
// replicas of their own and slots[stage] spare slots after them.
func New(replicas map[string]int, slots map[string][]string) *Book {
	b := &Book{parked: map[string]int{}, from: map[string]int{}, started: map[string][]int{},
		leaving: map[string]map[int]bool{}, released: map[string]bool{}, told: map[string]map[string]bool{}}
	for name, n := range replicas {
		b.parked[name], b.from[name] = len(slots[name]), n
		b.leaving[name], b.told[name] = map[int]bool{}, map[string]bool{}
	}
	return b
}

// Parked is how many spare slots each rebalanced stage got.
func (b *Book) Parked() map[string]int { return maps.Clone(b.parked) }

// SlotsOf are the indices of stage's spare slots; none for a stage not
// rebalanced.
func (b *Book) SlotsOf(stage string) []int {
	var out []int
	for i := range b.parked[stage] {
		out = append(out, b.from[stage]+i)
	}
	return out
}

// Report leaves a rebalance's slots that never ran out of rep, as a run
// in one process does: out of each rebalanced stage's replicas (a move's
// slot let go before it started, the run drained, shows no lifetime) and
// out of its edges' producers and consumers.
func (b *Book) Report(rep *report.Report) {
	for name, from := range b.from {
		rs, ok := rep.Stages[name]
		if !ok {
			continue
		}
		ran := map[int]bool{}
		var keep []report.Replica
		for _, r := range rs.Replicas {
			if r.Index < from || r.ItemsIn+r.ItemsOut > 0 || r.BusySeconds+r.IdleSeconds+r.BlockedSeconds > 0 {
				keep = append(keep, r)
				ran[r.Index] = true
			}
		}
		rs.Replicas = keep
		rep.Stages[name] = rs
		for en, e := range rep.Edges {
			for qi := range e.Queues {
				q := &e.Queues[qi]
				if e.From == name {
					q.Producers = slices.DeleteFunc(slices.Clone(q.Producers), func(i int) bool { return i >= from && !ran[i] })
				}
				if e.To == name {
					q.Consumers = slices.DeleteFunc(slices.Clone(q.Consumers), func(i int) bool { return i >= from && !ran[i] })
				}
			}
			rep.Edges[en] = e
		}
	}
}

// Job is what a share taking over a lost worker's replicas is told:
// the slots moves started, the stages whose slots are let go, and the
// replicas moves took away.
func (b *Book) Job() (started map[string][]int, released []string, left map[string][]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	started, left = map[string][]int{}, map[string][]int{}
	for name, slots := range b.started {
		started[name] = slices.Clone(slots)
	}
	for name, rel := range b.released {
		if rel {
			released = append(released, name)
		}
	}
	slices.Sort(released)
	for name, l := range b.leaving {
		for i := range l {
			left[name] = append(left[name], i)
		}
		slices.Sort(left[name])
	}
	return started, released, left
}

// Leaving says whether a move took replica i of stage away.
func (b *Book) Leaving(stage string, i int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leaving[stage][i]
}

// Leave counts replica i of stage as taken away by a move: a share that
// takes over its worker does not run it again.
func (b *Book) Leave(stage string, i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leaving[stage] == nil {
		b.leaving[stage] = map[int]bool{}
	}
	b.leaving[stage][i] = true
}

// Back counts replica i of stage as not taken away after all: it held
// its group's state when lost, and restarts as any lost member does.
func (b *Book) Back(stage string, i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.leaving[stage], i)
}

// Said names replica i of stage in a restart's log line: "" for a slot
// that no move started (it stays parked), and a replica a move took away
// is said not to run again.
func (b *Book) Said(stage string, i int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch from, ok := b.from[stage]; {
	case b.leaving[stage][i]:
		return fmt.Sprintf("%s[%d] (which a move took away: not run again)", stage, i)
	case ok && i >= from && !slices.Contains(b.started[stage], i):
		return ""
	}
	return fmt.Sprintf("%s[%d]", stage, i)
}

// Visible is s as a user sees it: each rebalanced stage's replicas in a
// fixed order (the spec's, then the slots in the order moves started
// them, as in one process: a replica keeps its place from one snapshot
// to the next, which the series and the policy's fits compare), the
// slots no move started left out of the stages and of their edges'
// producers (g's edges name them), and the moves made so far.
func (b *Book) Visible(s *report.Snapshot, g *graph.Graph) *report.Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := *s
	out.Moves = slices.Clone(b.made)
	shown := func(stage string, i int) bool {
		from, ok := b.from[stage]
		return !ok || i < from || slices.Contains(b.started[stage], i)
	}
	out.Stages = make([]report.StageSnapshot, len(s.Stages))
	for si, st := range s.Stages {
		if from, ok := b.from[st.Name]; ok {
			st.Rebalanced = true
			reps := slices.Clone(st.Replicas[:min(from, len(st.Replicas))])
			for _, j := range b.started[st.Name] {
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
		if _, ok := b.from[e.From]; ok {
			e.Queues = slices.Clone(e.Queues)
			for qi := range e.Queues {
				q := &e.Queues[qi]
				if ge := g.Edge(e.Name); ge != nil && qi < len(ge.Queues) {
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

// View is what the coordinator knows of its shares at a look, read
// under its lock: where each replica runs, and of each share whether it
// has said how its replicas fare (a snapshot, or its end) and whether it
// still runs (neither done nor lost).
type View struct {
	Place map[string][]string // stage -> share per replica
	Said  map[string]bool
	Live  map[string]bool
}

// Release says which shares to tell to let go of which stages' spare
// slots: those of each rebalanced stage whose inputs have ended (of
// every one, with all set), on every share running one that has not
// said it did (Told). An input has ended once every replica of the stage
// that feeds it is done, as the share that runs it says (it shows a
// producer done only once its queues are closed there); a slot started
// now would find nothing.
func (b *Book) Release(s *report.Snapshot, g *graph.Graph, v View, all bool) map[string][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	done := map[string]bool{} // stages whose every replica is done, as its own share says
	for _, st := range s.Stages {
		done[st.Name] = true
		for i, r := range st.Replicas {
			said := i < len(v.Place[st.Name]) && v.Said[v.Place[st.Name][i]]
			done[st.Name] = done[st.Name] && r.Done && said
		}
	}
	asks := map[string][]string{} // share -> stages to let go there
	for _, name := range g.Rebalance.Stages {
		if !b.released[name] {
			ended := true
			for _, e := range g.Edges {
				if e.To.Stage.Name == name {
					ended = ended && done[e.From.Stage.Name]
				}
			}
			if !ended && !all {
				continue
			}
			b.released[name] = true
		}
		for i := b.from[name]; i < len(v.Place[name]); i++ {
			inst := v.Place[name][i]
			if v.Live[inst] && !b.told[name][inst] && !slices.Contains(asks[inst], name) {
				asks[inst] = append(asks[inst], name)
			}
		}
	}
	return asks
}

// Told records that share inst let go of stage's spare slots.
func (b *Book) Told(stage, inst string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.told[stage][inst] = true
}

// Unit is one replica's move: replica Leave of stage From leaves its
// device on share Inst, where slot Start of stage To starts.
type Unit struct {
	Move     int // of the moves planned
	From, To string
	Leave    int
	Start    int
	Inst     string
}

// Plan places moves, as many replicas of each as can be: each on the
// share where a replica of its From stage runs and a slot of its To
// stage is parked (pick). Where a move cannot be placed whole, why says
// so, once for each reason (a spare replica of the budget has no
// device; no worker has a replica to spare beside a slot), else is "".
func (b *Book) Plan(s *report.Snapshot, moves []report.Move, place map[string][]string) (plan []Unit, why []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	taken := map[string]map[int]bool{}
	for i, m := range moves {
		reason, n := "", 0
		if m.From == "" {
			reason = "a spare replica of the budget has no device on a cluster"
		}
		for ; reason == "" && n < m.Replicas; n++ {
			leave, start, inst, ok := b.pick(s, m.From, m.To, place, taken)
			if !ok {
				reason = fmt.Sprintf("no worker has a replica of %s to spare beside a slot of %s (a worker keeps one replica of each stage it runs)", m.From, m.To)
				break
			}
			plan = append(plan, Unit{Move: i, From: m.From, To: m.To, Leave: leave, Start: start, Inst: inst})
		}
		if reason != "" {
			from := m.From
			if from == "" {
				from = "(spare)"
			}
			if msg := fmt.Sprintf("dflow: rebalance: %d of the %d replicas %s -> %s the policy would move can move: %s", n, m.Replicas, from, m.To, reason); msg != b.said {
				b.said = msg
				why = append(why, msg)
			}
		}
	}
	return plan, why
}

// Made records that share u.Inst took move u: its replica leaves (it
// does not come back), its slot starts.
func (b *Book) Made(u Unit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leaving[u.From][u.Leave] = true
	b.started[u.To] = append(b.started[u.To], u.Start)
}

// Record keeps the moves of which any replica was made (m.Replicas),
// stamped at (seconds since the run began), and says whether there was
// one.
func (b *Book) Record(moves []report.Move, at float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	any := false
	for _, m := range moves {
		if m.Replicas > 0 {
			m.T = at
			b.made = append(b.made, m)
			any = true
		}
	}
	return any
}

// pick chooses a move of one replica from stage from to stage to: the
// running replica of from of highest index, on a worker with a parked
// slot of to, while another replica of from keeps running there. b.mu
// held.
func (b *Book) pick(s *report.Snapshot, from, to string, place map[string][]string, taken map[string]map[int]bool) (leave, start int, inst string, ok bool) {
	var fs, ts *report.StageSnapshot
	for i := range s.Stages {
		switch s.Stages[i].Name {
		case from:
			fs = &s.Stages[i]
		case to:
			ts = &s.Stages[i]
		}
	}
	if fs == nil || ts == nil || b.released[to] || b.released[from] {
		return 0, 0, "", false
	}
	running := func(st *report.StageSnapshot, i int) bool {
		r := st.Replicas[i]
		return !r.Parked && !r.Done && !r.Left && !b.leaving[st.Name][i] && !taken[st.Name][i]
	}
	take := func(stage string, i int) {
		if taken[stage] == nil {
			taken[stage] = map[int]bool{}
		}
		taken[stage][i] = true
	}
	var live []int
	for i := range fs.Replicas {
		if running(fs, i) && i < len(place[from]) {
			live = append(live, i)
		}
	}
	if len(live) < 2 {
		return 0, 0, "", false
	}
	on := map[string]int{} // running replicas of from, by share
	for _, i := range live {
		on[place[from][i]]++
	}
	for k := len(live) - 1; k >= 0; k-- {
		i := live[k]
		w := place[from][i]
		if on[w] < 2 {
			// The last one here: its share's side of the stage's input
			// queues holds what it fetched for the replicas here, which
			// the parked slots would not read.
			continue
		}
		for j := b.from[to]; j < len(ts.Replicas) && j < len(place[to]); j++ {
			if place[to][j] == w && ts.Replicas[j].Parked && !slices.Contains(b.started[to], j) && !taken[to][j] {
				take(from, i)
				take(to, j)
				return i, j, w, true
			}
		}
	}
	return 0, 0, "", false
}
