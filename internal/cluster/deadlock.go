package cluster

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

// Deadlocks across workers.
//
// No worker's engine sees a whole run across hosts: what a queue on a
// stream holds, and who has arrived at a group the coordinator hosts, are
// elsewhere. So each engine's detector leaves those waits alone, and its
// snapshots say what each replica waits on (report.Wait); the coordinator
// judges the whole run by the engine's rule. The run is deadlocked when
// every replica still running is in a wait that cannot end, each waiting
// for replicas that are stuck too:
//   - an input on queues that are all empty (a stream holding no message,
//     delivered or not, nothing at hand on the consumer's worker) with
//     producers still running;
//   - room on a queue that is full (its stream holds its capacity) with
//     consumers still running;
//   - a group step its member has arrived at (the coordinator holds its
//     request) that members still present have not;
//
// and nothing moved (no item produced or consumed anywhere, no group step,
// no replica ended, no stream's count changed) over the confirmation
// window, on at least three looks a second or more apart. A share with no
// snapshot yet, a worker lost lately (restartQuiet), and a replica
// working or in a wait its engine can see end all count as able to move.

// deadlockLooks is how many judgements a stuck state across workers
// takes, unchanged, besides holding for Timings.DeadlockConfirm, before
// the run fails.
const deadlockLooks = 3

// deadlockWatch is the coordinator's detector state.
type deadlockWatch struct {
	since time.Time
	mark  int64
	looks int
}

// watchDeadlock judges the run from the shares' latest snapshots: a
// *engine.Deadlock once the same stuck state has held for the window.
func (c *Coordinator) watchDeadlock(ctx context.Context, draining bool) *engine.Deadlock {
	waits, mark, ok := c.stuck(ctx)
	d := &c.deadlock
	if !ok {
		*d = deadlockWatch{}
		return nil
	}
	if d.looks == 0 || mark != d.mark {
		*d = deadlockWatch{since: time.Now(), mark: mark, looks: 1}
		return nil
	}
	if d.looks++; d.looks < deadlockLooks || time.Since(d.since) < c.o.Timings.DeadlockConfirm {
		return nil
	}
	return engine.NewDeadlock(waits, draining)
}

// replicaRef is one replica of the run.
type replicaRef struct {
	stage string
	i     int
}

// look is one judgement of the run: every replica's latest figures and
// worker, and the streams' counts as read for it.
type look struct {
	c      *Coordinator
	ctx    context.Context
	view   map[replicaRef]report.ReplicaSnapshot
	worker map[replicaRef]string
	msgs   map[string]int
}

// judged is one wait that cannot end: in words, the edges it is on (and
// those it waits for room on), and the replicas that could end it.
type judged struct {
	what        string
	edges, full []*graph.Edge
	on          []replicaRef
}

// stuck reads every replica's wait; ok is false as soon as one may move.
// mark adds up what moves when anything does.
func (c *Coordinator) stuck(ctx context.Context) (waits []engine.StuckWait, mark int64, ok bool) {
	view, worker, mark, ok := c.waitView()
	if !ok {
		return nil, 0, false
	}
	lk := &look{c: c, ctx: ctx, view: view, worker: worker, msgs: map[string]int{}}
	index := map[replicaRef]int{}
	var order []replicaRef
	for _, s := range c.g.Stages {
		for i := range s.Replicas {
			if r := (replicaRef{s.Name, i}); !view[r].Done {
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

// replica judges replica r's waits (several for a quiescent node, all of
// which must be stuck): its wait as the deadlock names it, and the
// replicas that could end it.
func (lk *look) replica(r replicaRef) (sw engine.StuckWait, on []replicaRef, ok bool) {
	rs := lk.view[r]
	if len(rs.Waits) == 0 {
		return sw, nil, false // working, or in a wait that may end
	}
	sw.Name = fmt.Sprintf("%s[%d] on %s", r.stage, r.i, lk.worker[r])
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
func (lk *look) wait(r replicaRef, w report.Wait) (judged, bool) {
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
		e := lk.c.g.Edge(ref.Edge)
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
	e := lk.c.g.Edge(ref.Edge)
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
func (lk *look) group(r replicaRef, w report.Wait) (j judged, ok bool) {
	arrived, members := 0, 0
	if w.For != nil {
		j.on = lk.live(r.stage, w.For)
	} else {
		h := lk.c.groups[r.stage]
		if h == nil {
			return j, false
		}
		on, arr, mem, in := h.WaitingFor(r.i)
		if !in {
			return j, false // not arrived, or released
		}
		for _, i := range on {
			j.on = append(j.on, replicaRef{r.stage, i})
		}
		arrived, members = arr, mem
	}
	if len(j.on) == 0 {
		return j, false
	}
	j.what = fmt.Sprintf("waits at stage %s's group step for %s", r.stage, refNames(j.on))
	if members > 0 {
		j.what += fmt.Sprintf(" (%d of %d there)", arrived, members)
	}
	return j, true
}

// live are the replicas of stage at idx that have not ended.
func (lk *look) live(stage string, idx []int) []replicaRef {
	var out []replicaRef
	for _, i := range idx {
		if o := (replicaRef{stage, i}); !lk.view[o].Done {
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
	n, err := wire.QueueWaiting(ctx, lk.c.js, lk.c.run, wire.EdgeIndex(lk.c.g, e), q)
	if err != nil {
		return 0, false
	}
	lk.msgs[key] = n
	return lk.msgs[key], true
}

// waitView is every replica's latest figures, from the share that runs it
// (or ran it, if that share was lost once it had finished), and the
// worker it runs on; ok is false while any share has said nothing yet or
// a lost worker's replicas may still be moving.
func (c *Coordinator) waitView() (view map[replicaRef]report.ReplicaSnapshot, worker map[replicaRef]string, mark int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastLoss.IsZero() && time.Since(c.lastLoss) < c.restartQuiet() {
		return nil, nil, 0, false
	}
	view, worker = map[replicaRef]report.ReplicaSnapshot{}, map[replicaRef]string{}
	for _, s := range c.g.Stages {
		for i := range s.Replicas {
			in := c.instances[c.place[s.Name][i]]
			if in == nil {
				return nil, nil, 0, false
			}
			ss := in.last.Stage(s.Name)
			if ss == nil || i >= len(ss.Replicas) || (in.lost && !ss.Replicas[i].Done) {
				return nil, nil, 0, false
			}
			r := replicaRef{s.Name, i}
			view[r], worker[r] = ss.Replicas[i], in.worker
			mark += ss.Replicas[i].ItemsIn + ss.Replicas[i].ItemsOut
			if ss.Replicas[i].Done {
				mark++
			}
		}
	}
	for _, h := range c.groups {
		mark += int64(h.Round())
	}
	return view, worker, mark, true
}

// queueName is a queue as the status line shows it.
func queueName(e *graph.Edge, q int) string {
	if len(e.Queues) == 1 {
		return e.Name
	}
	return fmt.Sprintf("%s[%d]", e.Name, q)
}

func refNames(rs []replicaRef) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = fmt.Sprintf("%s[%d]", r.stage, r.i)
	}
	return strings.Join(names, ", ")
}

// restartQuiet is how long, after a worker is lost, its replicas' restart
// and the redelivery of what it held may take.
func (c *Coordinator) restartQuiet() time.Duration {
	return 2*c.o.Timings.AckWait + 2*c.o.Timings.Lease
}
