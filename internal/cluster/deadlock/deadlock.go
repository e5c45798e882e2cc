package deadlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/report"
)

// looks is how many judgements a stuck state across workers takes,
// unchanged, besides holding for Timings.DeadlockConfirm, before the run
// fails.
const looks = 3

// Group is what the watch reads of a replica group across workers that
// the coordinator hosts (*host.Host, package internal/cluster/group/host).
type Group interface {
	// WaitingFor says, of the step in progress, whether member i has
	// arrived (in) and which members still present it waits for (on),
	// with how many of how many have arrived.
	WaitingFor(i int) (on []int, arrived, members int, in bool)
	// Round is the step in progress: it moves while the group does.
	Round() uint32
}

// Replica names one replica of a run.
type Replica struct {
	Stage string
	I     int
}

// Seen is a replica as its share's latest snapshot has it, and the
// worker that runs it.
type Seen struct {
	report.ReplicaSnapshot
	Worker string
	// Lost: its share is counted lost (a replica of it not done may still
	// be moving, or restarting elsewhere)
	Lost bool
}

// View is what the coordinator knows of the run at one look. The
// coordinator builds it under its own lock; Judge reads it after, and
// keeps nothing of it.
type View struct {
	Graph   *graph.Graph
	Timings wire.Timings
	// LastLoss is when a worker was last counted lost (zero: never):
	// the watch waits for its replicas' restart.
	LastLoss time.Time
	// Replicas are every replica's latest figures, from the share that
	// runs it (or ran it, if that share was lost). One missing: its share
	// has said nothing of it yet.
	Replicas map[Replica]Seen
	// Groups are the groups across workers the coordinator hosts, by
	// stage.
	Groups map[string]Group
	// Queued is how many messages of queue q of the ei-th edge's stream
	// wait to be delivered (wire.QueueWaiting: what it stores, less what
	// is delivered and not yet acked), what the queue's room counts.
	Queued func(ctx context.Context, ei, q int) (int, error)
}

// Watch is the coordinator's deadlock watch: its state from one look to
// the next. The zero Watch is ready; one goroutine uses it.
type Watch struct {
	since time.Time
	mark  int64
	looks int
}

// Judge judges the run at one look: a *engine.Deadlock once the same
// stuck state has been seen on three looks and has held for the
// confirmation time (v.Timings.DeadlockConfirm), nil until then, or as
// soon as anything moves.
func (w *Watch) Judge(ctx context.Context, v *View, draining bool) *engine.Deadlock {
	waits, mark, ok := stuck(ctx, v)
	if !ok {
		*w = Watch{}
		return nil
	}
	if w.looks == 0 || mark != w.mark {
		*w = Watch{since: time.Now(), mark: mark, looks: 1}
		return nil
	}
	if w.looks++; w.looks < looks || time.Since(w.since) < v.Timings.DeadlockConfirm {
		return nil
	}
	return engine.NewDeadlock(waits, draining)
}

// look is one judgement of the run: the view, and the streams' counts as
// read for it.
type look struct {
	v    *View
	ctx  context.Context
	msgs map[string]int
}

// judged is one wait that cannot end: in words, the edges it is on (and
// those it waits for room on), and the replicas that could end it.
type judged struct {
	what        string
	edges, full []*graph.Edge
	on          []Replica
}

// stuck reads every replica's wait; ok is false as soon as one may move.
// mark adds up what moves when anything does.
func stuck(ctx context.Context, v *View) (waits []engine.StuckWait, mark int64, ok bool) {
	mark, ok = settled(v)
	if !ok {
		return nil, 0, false
	}
	lk := &look{v: v, ctx: ctx, msgs: map[string]int{}}
	index := map[Replica]int{}
	var order []Replica
	for _, s := range v.Graph.Stages {
		for i := range s.Replicas {
			if r := (Replica{s.Name, i}); !v.Replicas[r].Done {
				index[r] = len(order)
				order = append(order, r)
			}
		}
	}
	if len(order) == 0 {
		return nil, 0, false
	}
	for _, r := range order {
		sw, on, ok := lk.replica(r)
		if !ok {
			return nil, 0, false
		}
		for _, o := range on {
			j, stuck := index[o]
			if !stuck {
				return nil, 0, false // one it waits for has ended
			}
			sw.WaitsFor = append(sw.WaitsFor, j)
		}
		waits = append(waits, sw)
	}
	for _, n := range lk.msgs {
		mark += int64(n)
	}
	return waits, mark, true
}

// settled says whether every replica's figures are at hand and none can
// be moving unseen: not while a lost worker's replicas may still restart
// and what it held be redelivered (restartQuiet), nor while a share has
// said nothing of a replica, nor where a lost share's replica had not
// finished. mark adds up every replica's items in and out, those done
// and the hosted groups' steps.
func settled(v *View) (mark int64, ok bool) {
	if !v.LastLoss.IsZero() && time.Since(v.LastLoss) < restartQuiet(v.Timings) {
		return 0, false
	}
	for _, s := range v.Graph.Stages {
		for i := range s.Replicas {
			r, had := v.Replicas[Replica{s.Name, i}]
			if !had || r.Lost && !r.Done {
				return 0, false
			}
			mark += r.ItemsIn + r.ItemsOut
			if r.Done {
				mark++
			}
		}
	}
	for _, h := range v.Groups {
		mark += int64(h.Round())
	}
	return mark, true
}

// replica judges replica r's waits (several for a quiescent node, all of
// which must be stuck): its wait as the deadlock names it, and the
// replicas that could end it.
func (lk *look) replica(r Replica) (sw engine.StuckWait, on []Replica, ok bool) {
	rs := lk.v.Replicas[r]
	if len(rs.Waits) == 0 {
		return sw, nil, false // working, or in a wait that may end
	}
	sw.Name = fmt.Sprintf("%s[%d] on %s", r.Stage, r.I, rs.Worker)
	var whats []string
	for _, w := range rs.Waits {
		j, ok := lk.wait(r, w)
		if !ok {
			return sw, nil, false
		}
		whats = append(whats, j.what)
		sw.Edges, sw.Full = append(sw.Edges, j.edges...), append(sw.Full, j.full...)
		for _, o := range j.on {
			if !slices.Contains(on, o) {
				on = append(on, o)
			}
		}
	}
	sw.What = strings.Join(whats, "; and ")
	return sw, on, true
}

// wait judges one wait of replica r; ok is false when it may end.
func (lk *look) wait(r Replica, w report.Wait) (judged, bool) {
	switch w.Kind {
	case "recv":
		return lk.recv(w)
	case "send":
		return lk.send(w)
	case "group":
		return lk.group(r, w)
	}
	return judged{}, false
}

// recv: every queue waited on is empty (its stream holds nothing, or its
// engine saw it empty) and has producers running.
func (lk *look) recv(w report.Wait) (j judged, ok bool) {
	var names []string
	for _, ref := range w.Queues {
		e := lk.v.Graph.Edge(ref.Edge)
		if e == nil || ref.Queue >= len(e.Queues) {
			return j, false
		}
		from := e.From.Stage.Name
		by := lk.live(from, ref.For)
		if ref.Remote {
			if n, ok := lk.streamMsgs(e, ref.Queue); !ok || n > 0 {
				return j, false // an item on its way, or unknown
			}
			by = lk.live(from, e.Queues[ref.Queue].Producers)
		}
		if len(by) == 0 {
			continue // its producers have all ended: it ends
		}
		names = append(names, queueName(e, ref.Queue))
		j.edges = append(j.edges, e)
		j.on = append(j.on, by...)
	}
	if len(names) == 0 {
		return j, false
	}
	j.what = fmt.Sprintf("waits for input on %s (empty), fed by %s", strings.Join(names, ", "), refNames(j.on))
	return j, true
}

// send: the queue is full (its stream holds its capacity, or its engine
// saw it full) and has consumers running.
func (lk *look) send(w report.Wait) (j judged, ok bool) {
	if len(w.Queues) != 1 {
		return j, false
	}
	ref := w.Queues[0]
	e := lk.v.Graph.Edge(ref.Edge)
	if e == nil || ref.Queue >= len(e.Queues) {
		return j, false
	}
	depth := e.Capacity
	j.on = lk.live(e.To.Stage.Name, ref.For)
	if ref.Remote {
		n, ok := lk.streamMsgs(e, ref.Queue)
		if !ok || n < e.Capacity {
			return j, false // room, or unknown
		}
		// What the stream stores past the capacity was delivered to the
		// consumers' workers (fetched ahead, or in a replica's hands): out
		// of the queue, as an item in hand is in process. Full is the
		// capacity, as the queue's depth shows it (jsQueue.Depth).
		j.on = lk.live(e.To.Stage.Name, e.Queues[ref.Queue].Consumers)
	}
	if len(j.on) == 0 {
		return j, false
	}
	j.edges, j.full = []*graph.Edge{e}, []*graph.Edge{e}
	j.what = fmt.Sprintf("waits to send on %s (full, %d of %d), read by %s", queueName(e, ref.Queue), depth, e.Capacity, refNames(j.on))
	return j, true
}

// group: the replica has arrived at its group's step (an in-process
// group as its engine saw it, or the coordinator's host of a group across
// workers) and members still present have not.
func (lk *look) group(r Replica, w report.Wait) (j judged, ok bool) {
	arrived, members := 0, 0
	if w.For != nil {
		j.on = lk.live(r.Stage, w.For)
	} else {
		h := lk.v.Groups[r.Stage]
		if h == nil {
			return j, false
		}
		on, arr, mem, in := h.WaitingFor(r.I)
		if !in {
			return j, false // not arrived, or released
		}
		for _, i := range on {
			j.on = append(j.on, Replica{r.Stage, i})
		}
		arrived, members = arr, mem
	}
	if len(j.on) == 0 {
		return j, false
	}
	j.what = fmt.Sprintf("waits at stage %s's group step for %s", r.Stage, refNames(j.on))
	if members > 0 {
		j.what += fmt.Sprintf(" (%d of %d there)", arrived, members)
	}
	return j, true
}

// live are the replicas of stage at idx that have not ended.
func (lk *look) live(stage string, idx []int) []Replica {
	var out []Replica
	for _, i := range idx {
		if o := (Replica{stage, i}); !lk.v.Replicas[o].Done {
			out = append(out, o)
		}
	}
	return out
}

// streamMsgs is how many messages queue q of e's stream holds, read once
// a look.
func (lk *look) streamMsgs(e *graph.Edge, q int) (int, bool) {
	key := fmt.Sprintf("%s/%d", e.Name, q)
	if n, ok := lk.msgs[key]; ok {
		return n, true
	}
	ctx, cancel := context.WithTimeout(lk.ctx, time.Second)
	defer cancel()
	n, err := lk.v.Queued(ctx, wire.EdgeIndex(lk.v.Graph, e), q)
	if err != nil {
		return 0, false
	}
	lk.msgs[key] = n
	return lk.msgs[key], true
}

// queueName is a queue as the status line shows it.
func queueName(e *graph.Edge, q int) string {
	if len(e.Queues) == 1 {
		return e.Name
	}
	return fmt.Sprintf("%s[%d]", e.Name, q)
}

func refNames(rs []Replica) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = fmt.Sprintf("%s[%d]", r.Stage, r.I)
	}
	return strings.Join(names, ", ")
}

// restartQuiet is how long, after a worker is lost, its replicas' restart
// and the redelivery of what it held may take.
func restartQuiet(t wire.Timings) time.Duration {
	return 2*t.AckWait + 2*t.Lease
}
