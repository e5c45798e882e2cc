package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// In one process (`dflow run`), the group of a kind that restores
// (Kind.restores) whose stage allows restarts (graph.Stage.Restarts)
// restarts whole when a rank's process dies, as a cluster restarts it
// when a worker holding a rank is lost: a torch process group cannot
// shrink, so every member is stopped, and every member starts again (a
// fresh MASTER_PORT), told the step of the group's last save to restore
// (Start.restore_step; -1 when it had saved nothing yet), and given back
// first the items it took since that save, once.
//
// The host keeps, per member, the items it took since the save that
// holds them: a member of a kind that restores asks for each item as it
// takes it for a step (credit 1, checked in pump), so the item dflow
// takes from the member's input while the member has asked for k
// collectives is trained in its collective k+1 (a round: Barrier or
// AllReduce; the members step in lockstep, so the k-th of each is the
// same round). A save said by a member whose last round is R (Saved,
// between two steps) holds the rounds up to R: the items of rounds up to
// R are released, on every member. So what is kept is bounded by the
// save interval, and once every member has said Done the group is over
// and nothing is kept.
//
// A rank whose own code fails (its Done carries an error) fails the run
// as it always did; restarts are for a process that dies (killed by the
// kernel or a person, a crash in native code), which its stream breaking
// without a Done says. A rank's collective fails too when a peer's
// process dies (gloo's connection closed), and that can reach dflow
// before the dead peer's stream is seen broken: a rank that fails so
// waits up to deathGrace for a peer's death to explain it.

// rejoiner is the engine's in-process group member: every member can
// rejoin the group (internal/engine's member.RejoinAll). A cluster's
// group is not one: there the coordinator restarts a group whole.
type rejoiner interface{ RejoinAll() }

// stageRestarts is implemented by the engine's replicas: the stage's
// restarts.
type stageRestarts interface{ Restarts() int }

// deathGrace bounds how long a rank that failed with an error of its own
// waits, in a stage that allows restarts, for a peer's process death to
// explain it (its collective failed because the peer died): long, since
// the peer's stream is normally seen broken at once, and only a failure
// that is the rank's own pays it.
const deathGrace = 10 * time.Second

// restarter is a group stage's restarts in this process, shared by its
// members' Runs.
type restarter struct {
	n     *remoteNode
	stage string
	limit int // restarts allowed
	size  int // members
	group rejoiner

	mu     sync.Mutex
	used   int // restarts done
	step   int // the last save's step; -1: none
	att    *attempt
	clocks map[int]*carriedClock // each member's own account of its time, over its attempts
}

// attempt is one start of the whole group: the first, or a restart.
type attempt struct {
	rs      *restarter
	restore *int64 // Start.restore_step: nil on the first start
	ctx     context.Context
	stop    context.CancelFunc // stops every member's stream
	next    chan struct{}      // closed once the attempt's outcome is decided

	// under rs.mu
	rounds   []uint32           // each member's collectives that are rounds
	kept     [][]keptItem       // each member's items not yet held by a save, in the order taken
	replay   []map[string][]any // each member's items to hand back first, by port
	ended    []bool             // the member's stream has ended
	ok       []bool             // ... with its Done
	stopping bool               // the attempt is being stopped
	deaths   []death            // the members whose processes died, in the order seen
	own      *death             // a member's failure of its own (no death seen)
	timer    *time.Timer        // deathGrace for own
	outcome  int                // once next is closed: outcomeDone, outcomeRestart, outcomeFail
	fail     error              // outcomeFail: the error of the member named by failing
	failing  int                // outcomeFail: the member that returns fail (the others the run's cancellation)
}

const (
	outcomeDone = iota + 1
	outcomeRestart
	outcomeFail
)

// keptItem is an item a member took, and the round it is trained in.
type keptItem struct {
	port  string
	item  any
	round uint32
}

// death is a member whose process died (or, as own, failed by itself).
type death struct {
	rank   int
	err    error
	stderr string // "; " and its last stderr lines (lastWords), or ""
}

// memberOutcome is how a member's stream ended in an attempt.
type memberOutcome int

const (
	endedDone    memberOutcome = iota // its Done, without error
	endedDied                         // its stream broke: its process died
	endedFailed                       // its Done with an error, or dflow's side failed it
	endedFatal                        // its process could not start
	endedStopped                      // stopped: the attempt's, or the run's, end
)

// processDied is a member's stream that broke without its Done: its
// process died (or closed the stream).
type processDied struct{ err error }

func (e *processDied) Error() string { return e.err.Error() }
func (e *processDied) Unwrap() error { return e.err }

// restarterFor is the stage's restarter, made by its first member to
// start; nil where the stage does not restart in this process: a kind
// that does not restore, no restarts, or a group that is not the
// engine's in this process (a cluster's).
func (n *remoteNode) restarterFor(ctx context.Context, r nodes.Replica) *restarter {
	if !n.k.restores || nodes.RankPlacerFrom(ctx) != nil || n.k.host.GroupPlace != nil {
		return nil
	}
	sr, ok := r.(stageRestarts)
	if !ok || sr.Restarts() <= 0 {
		return nil
	}
	g, ok := r.Group().(rejoiner)
	if !ok {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.restarts == nil {
		n.restarts = &restarter{n: n, stage: r.Stage(), limit: sr.Restarts(), size: r.Replicas(), group: g, step: -1}
		n.restarts.att = n.restarts.newAttempt(nil)
	}
	return n.restarts
}

// newAttempt is the group's next start (rs.mu held, or before anyone
// else sees rs).
func (rs *restarter) newAttempt(replay []map[string][]any) *attempt {
	a := &attempt{rs: rs, next: make(chan struct{}), rounds: make([]uint32, rs.size), kept: make([][]keptItem, rs.size),
		replay: replay, ended: make([]bool, rs.size), ok: make([]bool, rs.size)}
	if a.replay == nil {
		a.replay = make([]map[string][]any, rs.size)
	}
	a.ctx, a.stop = context.WithCancel(context.Background())
	if rs.att != nil {
		step := int64(rs.step)
		a.restore = &step
	}
	return a
}

// current is the attempt a member starts now.
func (rs *restarter) current() *attempt {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.att
}

// runRestarting runs member r of a group that restarts whole in this
// process: one process and stream per attempt, until the group is over
// (every member said Done in one attempt), it fails, or the run ends.
func (n *remoteNode) runRestarting(ctx context.Context, r nodes.Replica, rs *restarter) error {
	i := r.Index()
	for {
		a := rs.current()
		how, err, stderr := n.attempt(ctx, r, a)
		var waited func()
		if how == endedDone {
			// Out of the group's collectives until the group is over or
			// restarts, as a replica that has returned is; the wait for
			// the others is idle, a wait the runtime's own.
			r.Group().Leave()
			if w, ok := r.(interface{ WaitIdle() (end func()) }); ok {
				waited = w.WaitIdle()
			}
		}
		outcome := a.end(ctx, i, how, err, stderr)
		if waited != nil {
			waited()
		}
		switch outcome {
		case outcomeDone:
			return nil
		case outcomeRestart:
			continue
		}
		rs.mu.Lock()
		failing, ferr := a.failing, a.fail
		rs.mu.Unlock()
		if failing == i && ferr != nil {
			return ferr
		}
		// The member that failed the group fails the run, whose end
		// ends the others' contexts: their errors come after its.
		<-ctx.Done()
		return ctx.Err()
	}
}

// attempt runs member r's process for one attempt of its group, and says
// how its stream ended, with the error and its last stderr lines.
func (n *remoteNode) attempt(ctx context.Context, r nodes.Replica, a *attempt) (memberOutcome, error, string) {
	k := n.k
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.ctx, cancel)()
	place, err := n.place(actx, r)
	if err != nil {
		return endedFatal, fmt.Errorf("plugin %s (%s): %w", k.plugin, k.path, err), ""
	}
	env, device := rankEnv(r, place)
	p, err := k.host.start(k.path, fmt.Sprintf("[%s/%d] ", r.Stage(), r.Index()), env...)
	if err != nil {
		if actx.Err() != nil {
			return endedStopped, err, ""
		}
		return endedFatal, err, ""
	}
	err = n.stream(actx, r, p, device, a.restore, a)
	k.host.kill(p.client) // waits for the process and its stderr
	var died *processDied
	switch {
	case err == nil:
		return endedDone, nil, ""
	case errors.As(err, &died): // before the attempt's stop, if it came
		return endedDied, err, lastWords(p)
	case actx.Err() != nil:
		return endedStopped, err, ""
	}
	return endedFailed, err, lastWords(p)
}

// lastWords is "; " and the process's last stderr lines, "" where it
// wrote none.
func lastWords(p *process) string {
	if p.stderr.empty() {
		return ""
	}
	return "; " + p.stderr.last()
}

// end records how member i's stream ended in the attempt, decides the
// attempt's outcome once that is known, and waits for it.
func (a *attempt) end(ctx context.Context, i int, how memberOutcome, err error, stderr string) int {
	rs := a.rs
	rs.mu.Lock()
	a.ended[i] = true
	switch how {
	case endedDone:
		a.ok[i] = true
	case endedDied:
		a.deaths = append(a.deaths, death{i, err, stderr})
		a.stopLocked()
	case endedFailed:
		// Its collective may have failed because a peer's process died,
		// which dflow may not have seen yet: the others go on (they
		// cannot step without it) until a death is seen, or deathGrace.
		if !a.stopping && a.own == nil {
			a.own = &death{i, err, stderr}
			fmt.Fprintf(rs.n.k.host.log(), "dflow: stage %q: rank %d of %d failed (%v); waiting up to %v for a peer's process death to explain it (its group restarts then), else the run fails\n",
				rs.stage, i, rs.size, err, deathGrace)
			a.timer = time.AfterFunc(deathGrace, func() {
				rs.mu.Lock()
				defer rs.mu.Unlock()
				a.stopLocked()
				a.decideLocked(ctx)
			})
		}
	case endedFatal:
		if !a.stopping && a.own == nil {
			a.own = &death{i, err, stderr}
		}
		a.stopLocked()
	case endedStopped:
		if ctx.Err() != nil {
			a.stopLocked() // the run is over
		}
	}
	a.decideLocked(ctx)
	rs.mu.Unlock()
	<-a.next
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return a.outcome
}

// stopLocked stops every member's stream (rs.mu held).
func (a *attempt) stopLocked() {
	if !a.stopping {
		a.stopping = true
		a.stop()
	}
}

// decideLocked decides the attempt's outcome once it is known (rs.mu
// held): done once every member has said Done; once it is being stopped
// and every member has ended, a restart where a member's process died
// and restarts are left, else the group's failure.
func (a *attempt) decideLocked(ctx context.Context) {
	rs := a.rs
	if a.outcome != 0 {
		return
	}
	all, ended := true, true
	for i := range a.ok {
		all = all && a.ok[i]
		ended = ended && a.ended[i]
	}
	switch {
	case all:
		a.outcome = outcomeDone
		a.kept = nil // the group is over: its last member wrote its final save
	case !a.stopping || !ended:
		return
	case ctx.Err() != nil:
		a.outcome, a.failing = outcomeFail, -1
	case len(a.deaths) > 0 && rs.used < rs.limit:
		a.outcome = outcomeRestart
		rs.restartLocked(a)
	case len(a.deaths) > 0:
		d := a.deaths[0]
		a.outcome, a.failing = outcomeFail, d.rank
		a.fail = fmt.Errorf("%s: %w; its group restarted %s, all that restarts = %d allows%s%s",
			rs.n.who(d.rank, rs.size), d.err, count(rs.used, "time"), rs.limit, rs.alsoDied(a), d.stderr)
	case a.own != nil:
		a.outcome, a.failing = outcomeFail, a.own.rank
		a.fail = fmt.Errorf("%s: %w%s", rs.n.who(a.own.rank, rs.size), a.own.err, a.own.stderr)
	default: // stopped, with no cause known: not expected
		a.outcome, a.failing = outcomeFail, 0
		a.fail = fmt.Errorf("%s: its group was stopped, and no member said why", rs.n.who(0, rs.size))
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	a.stop()
	close(a.next)
}

// restartLocked starts the group's next attempt (rs.mu held; every member
// of a has ended): the engine's group takes every member back, rank 0
// gets a fresh port, and each member gets back the items it took since
// the last save, in the order it took them, before any other.
func (rs *restarter) restartLocked(a *attempt) {
	rs.used++
	replay := make([]map[string][]any, rs.size)
	for m := range replay {
		replay[m] = map[string][]any{}
		for _, it := range a.kept[m] {
			replay[m][it.port] = append(replay[m][it.port], it.item)
		}
		for port, items := range a.replay[m] { // not yet handed back
			replay[m][port] = append(replay[m][port], items...)
		}
	}
	rs.group.RejoinAll()
	rs.n.mu.Lock()
	rs.n.master = 0
	rs.n.mu.Unlock()
	ranks := make([]int, len(a.deaths))
	for i, d := range a.deaths {
		ranks[i] = d.rank
	}
	from := fmt.Sprintf("restoring its save of step %d; what each rank took since comes back to it", rs.step)
	if rs.step < 0 {
		from = "from scratch, as the group had saved nothing yet; everything each rank took comes back to it"
	}
	what := "the process of "
	if len(ranks) > 1 {
		what = "the processes of "
	}
	fmt.Fprintf(rs.n.k.host.log(), "dflow: stage %q: %s%s of %d died (%v): its group cannot go on without it, and restarts whole (restart %d of %d): every rank starts again, %s\n",
		rs.stage, what, rankList(ranks), rs.size, a.deaths[0].err, rs.used, rs.limit, from)
	rs.att = rs.newAttempt(replay)
}

// alsoDied names the other members whose processes died in a, if any.
func (rs *restarter) alsoDied(a *attempt) string {
	var ranks []int
	for _, d := range a.deaths[1:] {
		ranks = append(ranks, d.rank)
	}
	if len(ranks) == 0 {
		return ""
	}
	if len(ranks) == 1 {
		return fmt.Sprintf(" (the process of %s died with it)", rankList(ranks))
	}
	return fmt.Sprintf(" (the processes of %s died with it)", rankList(ranks))
}

// rankList says ranks: "rank 1", "ranks 1 and 2", "ranks 0, 1 and 2".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// count says n times: "once", "twice", "3 times".
func count(n int, what string) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// who names rank i of a plugin's group, as a failure names it.
func (n *remoteNode) who(i, size int) string {
	return fmt.Sprintf("plugin %s (%s): rank %d of %d", n.k.plugin, n.k.path, i, size)
}

// collective takes note of a member's collective (before it goes to the
// group): a Barrier or an AllReduce is a round, in which the items the
// member took since its last are trained; a Saved holds the rounds up to
// the member's last, and releases their items on every member.
func (a *attempt) collective(i int, op proto.CollectiveOp, step int64) {
	if a == nil {
		return
	}
	rs := a.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch op {
	case proto.CollectiveOp_COLLECTIVE_BARRIER, proto.CollectiveOp_COLLECTIVE_ALL_REDUCE:
		a.rounds[i]++
	case proto.CollectiveOp_COLLECTIVE_SAVED:
		held := a.rounds[i]
		for m, items := range a.kept {
			a.kept[m] = slices.DeleteFunc(items, func(it keptItem) bool { return it.round <= held })
		}
		rs.step = int(step)
	}
}

// input is member r's input port: in a group that restarts whole, the
// items to hand back come first, and every item taken is kept until a
// save holds it.
func (a *attempt) input(r nodes.Replica, port string) nodes.Input {
	if a == nil {
		return r.In(port)
	}
	return &keptInput{a: a, i: r.Index(), port: port, in: r.In(port)}
}

type keptInput struct {
	a    *attempt
	i    int
	port string
	in   nodes.Input
}

func (k *keptInput) Recv(ctx context.Context) (any, error) {
	a, rs := k.a, k.a.rs
	rs.mu.Lock()
	if q := a.replay[k.i][k.port]; len(q) > 0 {
		item := q[0]
		a.replay[k.i][k.port] = q[1:]
		a.keepLocked(k.i, k.port, item)
		rs.mu.Unlock()
		return item, nil
	}
	rs.mu.Unlock()
	item, err := k.in.Recv(ctx)
	if err == nil {
		rs.mu.Lock()
		a.keepLocked(k.i, k.port, item)
		rs.mu.Unlock()
	}
	return item, err
}

// keepLocked keeps an item member i takes, until a save holds its round:
// the member's next (rs.mu held).
func (a *attempt) keepLocked(i int, port string, item any) {
	a.kept[i] = append(a.kept[i], keptItem{port: port, item: item, round: a.rounds[i] + 1})
}

// carry makes member i's own account of its time (pluginClock, nil when
// its plugin does not measure it) go on over the group's restarts: each
// attempt's plugin counts from zero, and what the attempts before it
// counted is added to its figures.
func (a *attempt) carry(i int, c *pluginClock) *pluginClock {
	if a == nil || c == nil {
		return c
	}
	rs := a.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.clocks == nil {
		rs.clocks = map[int]*carriedClock{}
	}
	cc := rs.clocks[i]
	if cc == nil {
		cc = &carriedClock{c: c.c}
		rs.clocks[i] = cc
	}
	cc.mu.Lock()
	cc.idle, cc.blocked = cc.lastIdle, cc.lastBlocked
	cc.mu.Unlock()
	return &pluginClock{cc}
}

// carriedClock adds the attempts before to a member's own account.
type carriedClock struct {
	c                     ownClock
	mu                    sync.Mutex
	idle, blocked         time.Duration // the attempts' before this one
	lastIdle, lastBlocked time.Duration // as last told the replica
}

func (cc *carriedClock) OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool) {
	cc.mu.Lock()
	cc.lastIdle, cc.lastBlocked = cc.idle+max(idle, 0), cc.blocked+max(blocked, 0)
	idle, blocked = cc.lastIdle, cc.lastBlocked
	cc.mu.Unlock()
	cc.c.OwnTimes(idle, blocked, idleNow, blockedNow)
}

func (cc *carriedClock) OwnService(sum time.Duration, counts map[time.Duration]int64) {
	cc.c.OwnService(sum, counts)
}
