package restarts

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/finished"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/moves"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Share is one share of the run as the decisions read it: a worker's, or
// a restart's.
type Share struct {
	Name, Worker string
	Done, Lost   bool
	// Evict: counted lost though heard from, for the restore of this
	// stage's group
	Evict string
	// Last is what the share said last (nil: nothing yet).
	Last *report.Snapshot
}

// Group is a group across workers that the coordinator hosts
// (host.Host): what a loss does to it.
type Group interface {
	// Lose counts member replica, run by share, lost, and says how many
	// members are left present.
	Lose(replica int, share string) (present int)
	// LoseMoved loses a member a move took away: false, it has left its
	// group; true, it held the group's state and restarts.
	LoseMoved(replica int, share string) (restarts bool)
	// LeftLost counts a member that had finished, run by share, gone.
	LeftLost(replica int, share string)
	Keeps() bool
	AnyDue() bool
	Restoring(replica int) bool
	RestoreWhole() bool
	Evictions() []host.Eviction
	SaveSaid() string
	Why() string
}

// View is what the decisions read of the run; the coordinator builds it
// under its lock, and a decision changes only what it says it does (the
// shares it counts lost, the lost share's last snapshot).
type View struct {
	Graph    *graph.Graph
	Registry *nodes.Registry
	// Lease is how long a worker may go unheard before it is lost.
	Lease time.Duration
	// Place is where each replica runs: stage -> share per replica.
	Place map[string][]string
	// Shares are the run's shares by name.
	Shares map[string]*Share
	// Groups are the groups across workers the coordinator hosts, by
	// stage; Moves a rebalance's record (nil without one).
	Groups map[string]Group
	Moves  *moves.Book
	// Workers are the run's, in order; Live those heard from within the
	// lease.
	Workers []string
	Live    map[string]bool
}

// Book is the restarts' record of what groups restore: the saves the
// local groups (those summing on one worker) said they made, the
// restores of those lost whole, and the attempts and the shares counted
// in the last loss of those that restart whole (Spec.Whole). It has a
// lock of its own, taken after the coordinator's where both are held.
type Book struct {
	mu        sync.Mutex
	notes     map[string]wire.SavesNote
	restores  map[string]*wire.Restore   // for the restarts of local groups lost whole
	attempts  map[string]int             // the times each group was lost whole (Job.Attempt)
	lostWhole map[string]map[string]bool // the shares counted in each group's last whole loss
}

// Note takes what the share of a local group (one counted live) says it
// saved.
func (b *Book) Note(n wire.SavesNote) {
	b.mu.Lock()
	defer b.mu.Unlock()
	stage := n.Stage
	if b.notes == nil {
		b.notes = map[string]wire.SavesNote{}
	}
	// (a first note has no old one: its step stands, -1 included; taken
	// from a zero note it read as a save of step 0, which a group lost
	// before its first save then failed to restore)
	if old, had := b.notes[stage]; had && n.Step < 0 && old.Step >= 0 && old.Share != n.Share {
		n.Step, n.Skip = old.Step, old.Skip // a restored group's, until its first save
	}
	if old, had := b.notes[stage]; had && old.Final && old.Share != n.Share {
		n = old // a final group's restart: final still
	}
	b.notes[stage] = n
}

// restoreFor says how a local group lost whole restarts: from its last
// save (or, final, dropping everything), or not at all (false: it saves
// nothing). b.mu held.
func (b *Book) restoreFor(stage string) (*wire.Restore, bool) {
	n, ok := b.notes[stage]
	if !ok || !n.Saves {
		return nil, false
	}
	return &wire.Restore{Step: n.Step, Skip: n.Skip, Final: n.Final}, true
}

// LastSave is the step of a local group's last save that its shares
// said (false: none yet, or it saves nothing on the cluster).
func (b *Book) LastSave(stage string) (step int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, had := b.notes[stage]
	return n.Step, had && n.Saves && n.Step >= 0
}

// Job is what a share's job says of the groups lost whole: the restore
// of each local one (Job.Restore) and the attempt of each (Job.Attempt).
func (b *Book) Job() (restore map[string]*wire.Restore, attempt map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.restores), maps.Clone(b.attempts)
}

// fails ends the error of a loss the run cannot recover from.
const fails = "the run fails (a checkpointing node resumes from its last checkpoint on the next run)"

// Loss is what becomes of a lost share's replicas (Book.Lose).
type Loss struct {
	// Why says why the share is over: its worker silent, or a group's
	// restore needs a member it ran back (its worker lives).
	Why string
	// Stay had finished there and are not run again (their ends to
	// write); Move restart elsewhere, named in Said for the log (a
	// rebalance's slot that no move started is not: it stays parked).
	Stay, Move []finished.Replica
	Said       []string
	// Last is the share's last snapshot, the replicas recorded settled
	// marked done in it.
	Last *report.Snapshot
	// Evicted are the shares it counted lost though heard from (Lost and
	// Evict set in the view), to restart with a group's restore.
	Evicted []string
	// Log is what it said, a line each.
	Log []string
	// Err, not nil, fails the run: a replica that keeps state and cannot
	// restart elsewhere, or a group left with nothing to restore.
	Err error
}

func (l *Loss) logf(format string, args ...any) {
	l.Log = append(l.Log, fmt.Sprintf(format, args...))
}

// loss is a Lose under way.
type loss struct {
	*Loss
	b  *Book
	v  *View
	in *Share
}

// Lose decides what becomes of the replicas the lost share runs
// (v.Shares[share]): those it recorded finished (ended, from
// finished.Replicas) or that its last snapshot has done stay; those of a
// restartable stage restart, each leaving its group across workers
// (member); one that keeps state and cannot restart elsewhere fails the
// run. The coordinator restarts them (View.LeastLoaded) and counts lost
// the shares it evicts. A share the view lacks fails the run, saying so:
// nothing is known of what it ran.
func (b *Book) Lose(v *View, share string, ended map[finished.Replica]bool) *Loss {
	b.mu.Lock()
	defer b.mu.Unlock()
	in := v.Shares[share]
	if in == nil {
		return &Loss{Why: fmt.Sprintf("share %s lost", share),
			Err: fmt.Errorf("share %s was counted lost, but the coordinator has no record of it: what it ran cannot be restarted", share)}
	}
	l := &loss{Loss: &Loss{Last: in.Last}, b: b, v: v, in: in}
	l.Why = fmt.Sprintf("worker %s lost (no word from it for %v)", in.Worker, v.Lease)
	if in.Evict != "" {
		l.Why = fmt.Sprintf("the share %s on worker %s, counted lost for stage %q's restore of its last save (the worker lives)", in.Name, in.Worker, in.Evict)
	}
	for _, s := range v.Graph.Stages {
		for i, p := range v.Place[s.Name] {
			if p != in.Name {
				continue
			}
			r := finished.Replica{Stage: s.Name, I: i}
			switch {
			case ended[r]:
				// its worker recorded it settled (finished.Replicas):
				// nothing of it can come back, and its consumers may have
				// ended on its ends; run again, it could take an item
				// another lost replica held and send it after its end
				l.Stay = append(l.Stay, r)
				l.Last = finished.MarkDone(l.Last, s.Name, i)
				if h := v.Groups[s.Name]; h != nil {
					h.LeftLost(i, in.Name)
				}
			case wire.Restartable(v.Registry, s):
				// done or not: not recorded settled, it may have left
				// an item unsettled, which comes back to its restart
				l.Move = append(l.Move, r)
				if say := v.said(s.Name, i); say != "" {
					l.Said = append(l.Said, say)
				}
				if err := l.member(s, i); err != nil && l.Err == nil {
					l.Err = err
				}
			case finished.Done(l.Last, s.Name, i):
				l.Stay = append(l.Stay, r) // finished: not run again
			case l.Err == nil:
				if h := v.Groups[s.Name]; h != nil {
					h.Lose(i, in.Name)
				}
				l.Err = fmt.Errorf("%s: stage %q replica %d (%s) keeps state and cannot restart elsewhere; %s",
					l.Why, s.Name, i, s.Node, fails)
			}
		}
	}
	return l.Loss
}

// said names replica i of stage in a restart's log line: "" for a
// rebalance's slot that no move started (it stays parked), and a replica
// a move took away is said not to run again (moves.Book.Said).
func (v *View) said(stage string, i int) string {
	if v.Moves != nil {
		return v.Moves.Said(stage, i)
	}
	return fmt.Sprintf("%s[%d]", stage, i)
}

// member takes replica i of s, lost with the share, out of its group
// across workers. A group whose state moves needs a member left to take
// it from, or a save to restore (a hosted group's, or what the share of a
// group summing on the lost worker said: Note): without either, the run
// fails.
func (l *loss) member(s *graph.Stage, i int) error {
	v, in := l.v, l.in
	h := v.Groups[s.Name]
	if h == nil {
		// no group across workers: every replica was on the lost one,
		// summing there; it restores its last save where it saves
		if r, ok := l.b.restoreFor(s.Name); ok && wire.Moves(v.Registry, s) {
			if l.b.restores == nil {
				l.b.restores = map[string]*wire.Restore{}
			}
			switch {
			case i != slices.Index(v.Place[s.Name], in.Name): // said once, at its first replica
			case r.Final:
				l.logf("dflow: stage %q lost every member of its group after its final save: its restarts drop what comes back", s.Name)
			default:
				l.logf("dflow: stage %q lost every member of its group: its restarts restore its last save (%s)", s.Name, host.StepSaid(r.Step))
			}
			l.b.restores[s.Name] = r
			return nil
		}
		if wire.Moves(v.Registry, s) {
			return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) had every replica of its group there (%d), and its state is gone with them, and it saves nothing to restore (a checkpoint, for a kind that writes one); %s",
				in.Worker, v.Lease, s.Name, s.Node, s.Replicas, fails)
		}
		return nil
	}
	if v.Moves != nil && v.Moves.Leaving(s.Name, i) {
		if !h.LoseMoved(i, in.Name) {
			// A move took it away (the share that takes over does not
			// run it: Job.Left): it has left its group, its step under
			// way counting for nothing, and what it trained comes back
			// to members that drop it (Member.Trained).
			return nil
		}
		// It held the group's state (it left last, or was the last
		// present): it restarts as any lost member does.
		v.Moves.Back(s.Name, i)
	}
	if wire.Whole(v.Registry, s) {
		return l.whole(s, i, h)
	}
	present := h.Lose(i, in.Name)
	if present == 0 && h.Keeps() && h.AnyDue() {
		return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) replica %d keeps state, and no member of its group is left to take it from, %s; %s",
			in.Worker, v.Lease, s.Name, s.Node, i, h.Why(), fails)
	}
	if h.Restoring(i) {
		l.logf("dflow: stage %q lost every member of its group: its restarts restore its last save (%s)", s.Name, h.SaveSaid())
	}
	// Members that had finished after the save, on shares still counted
	// live, restart to restore it too: their shares are counted lost now
	// (the host refuses them already: what they say is not the run's),
	// and restarted at the coordinator's next check. A share counted lost
	// restarts all it runs, so each must be able to, or have finished,
	// and a member whose share has ended cannot restart: else the run
	// fails here, for the restore, not for a worker lost (it is not).
	ev := h.Evictions()
	for _, x := range ev {
		needs := fmt.Sprintf("stage %q lost every member of its group, and its restore of its last save needs back member %d, which had finished since, on the share %s", s.Name, x.Member, x.Share)
		if err := l.evictable(s, x, ev, needs); err != nil {
			return err
		}
	}
	for _, x := range ev {
		if e := l.evict(x.Share, s.Name); e != nil {
			if x.Moved {
				l.logf("dflow: stage %q restores its last save: the share %s, on worker %s, ran member %d, which a move took away since; the share restarts without it, and what it trained since comes back", s.Name, x.Share, e.Worker, x.Member)
			} else {
				l.logf("dflow: stage %q restores its last save: the share %s, on worker %s, ran member %d, which had finished since and restarts too", s.Name, x.Share, e.Worker, x.Member)
			}
		}
	}
	return nil
}

// evict counts share lost for the restore of stage's group, unless it is
// counted lost already (nil).
func (l *loss) evict(share, stage string) *Share {
	e := l.v.Shares[share]
	if e == nil || e.Lost {
		return nil
	}
	e.Lost, e.Evict = true, stage
	l.Evicted = append(l.Evicted, share)
	return e
}

// whole loses member i of stage s with the share, for a group that
// cannot go on without any member (Spec.Whole: a torch process group
// cannot shrink): every share that runs another member is counted lost
// too (they restart), and the group restores its last save whole (or,
// having saved nothing yet, starts afresh, its inputs coming back), in a
// new attempt, whose ranks meet at its new rank 0 (Job.Attempt). A share
// counted in this attempt's loss already (the lost one's other members,
// those stopped for it) changes nothing more; a restart lost during the
// restore begins another attempt. Each share it stops must be able to
// restart whole (evictable).
func (l *loss) whole(s *graph.Stage, i int, h Group) error {
	v, in := l.v, l.in
	h.Lose(i, in.Name)
	if l.b.lostWhole[s.Name][in.Name] {
		return nil
	}
	var ev []host.Eviction
	for j, share := range v.Place[s.Name] {
		if share != in.Name {
			ev = append(ev, host.Eviction{Member: j, Share: share})
		}
	}
	for _, x := range ev {
		needs := fmt.Sprintf("stage %q (%s) lost member %d with worker %s, and its group cannot go on without it: its members restart together, member %d among them, on the share %s",
			s.Name, s.Node, i, in.Worker, x.Member, x.Share)
		if err := l.evictable(s, x, ev, needs); err != nil {
			return err
		}
	}
	for _, x := range ev {
		h.Lose(x.Member, x.Share)
	}
	restorable := h.RestoreWhole()
	h.Evictions() // the finished members it restores are on the shares stopped above
	if !restorable {
		return fmt.Errorf("worker %s lost (no word from it for %v): stage %q (%s) replica %d is a member of a group that cannot go on without it, and no member of it is left to take its state from, %s; %s",
			in.Worker, v.Lease, s.Name, s.Node, i, h.Why(), fails)
	}
	counted := map[string]bool{in.Name: true}
	for _, x := range ev {
		counted[x.Share] = true
		if e := l.evict(x.Share, s.Name); e != nil {
			l.logf("dflow: stage %q lost member %d with worker %s, and its group cannot go on without it: the share %s, on worker %s, restarts too",
				s.Name, i, in.Worker, x.Share, e.Worker)
		}
	}
	if l.b.lostWhole == nil {
		l.b.lostWhole = map[string]map[string]bool{}
	}
	if l.b.attempts == nil {
		l.b.attempts = map[string]int{}
	}
	l.b.lostWhole[s.Name] = counted
	l.b.attempts[s.Name]++
	l.logf("dflow: stage %q lost every member of its group: its restarts restore its last save (%s)", s.Name, h.SaveSaid())
	return nil
}

// evictable checks that the share of x, a member of s's group that had
// finished, can be counted lost for the group's restore (ev, all the
// members it needs back), so that x restarts: it is counted lost already,
// or it has not ended and everything else it runs can restart elsewhere
// or has finished.
func (l *loss) evictable(s *graph.Stage, x host.Eviction, ev []host.Eviction, needs string) error {
	v := l.v
	e := v.Shares[x.Share]
	switch {
	case e == nil:
		return fmt.Errorf("%s, which the coordinator does not know, so that the member cannot restart; %s", needs, fails)
	case e.Lost:
		return nil // it restarts with the share
	case e.Done:
		return fmt.Errorf("%s on worker %s, which has ended, so that the member cannot restart; %s", needs, e.Worker, fails)
	}
	for _, t := range v.Graph.Stages {
		for j, p := range v.Place[t.Name] {
			switch {
			case p != x.Share:
			case t == s && slices.ContainsFunc(ev, func(y host.Eviction) bool { return y.Member == j }):
			case wire.Restartable(v.Registry, t), finished.Done(e.Last, t.Name, j):
			default:
				return fmt.Errorf("%s on worker %s, which also runs stage %q replica %d (%s): that replica keeps state and cannot restart elsewhere, and the share restarts whole; %s",
					needs, e.Worker, t.Name, j, t.Node, fails)
			}
		}
	}
	return nil
}

// LeastLoaded is the live worker, other than those in not, running the
// fewest replicas (the first in Workers' order among equals): "" if none.
func (v *View) LeastLoaded(not ...string) string {
	load := map[string]int{}
	for _, w := range v.Workers {
		if !slices.Contains(not, w) && v.Live[w] {
			load[w] = 0
		}
	}
	for _, s := range v.Graph.Stages {
		for _, p := range v.Place[s.Name] {
			if in := v.Shares[p]; in != nil {
				if _, ok := load[in.Worker]; ok {
					load[in.Worker]++
				}
			}
		}
	}
	best := ""
	for _, w := range v.Workers {
		if n, ok := load[w]; ok && (best == "" || n < load[best]) {
			best = w
		}
	}
	return best
}
