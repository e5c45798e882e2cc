package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
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

// deadlockConfirm is how long a stuck state across workers must hold,
// unchanged, before the run fails; looks is how many judgements it takes.
const (
	deadlockConfirm = 2 * time.Second
	deadlockLooks   = 3
)

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
	if d.looks++; d.looks < deadlockLooks || time.Since(d.since) < deadlockConfirm {
		return nil
	}
	return engine.NewDeadlock(waits, draining)
}

// replicaRef is one replica of the run.
type replicaRef struct {
	stage string
	i     int
}

// stuck reads every replica's wait; ok is false as soon as one may move.
// mark adds up what moves when anything does.
func (c *Coordinator) stuck(ctx context.Context) (waits []engine.StuckWait, mark int64, ok bool) {
	view, worker, mark, ok := c.waitView()
	if !ok {
		return nil, 0, false
	}
	msgs := map[string]int{} // stream counts read for this look
	streamMsgs := func(e *graph.Edge, q int) (int, bool) {
		key := fmt.Sprintf("%s/%d", e.Name, q)
		if n, ok := msgs[key]; ok {
			return n, true
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		s, err := c.js.Stream(sctx, streamQueue(c.run, edgeIndex(c.g, e), q))
		if err != nil {
			return 0, false
		}
		info, err := s.Info(sctx)
		if err != nil {
			return 0, false
		}
		msgs[key] = int(info.State.Msgs)
		return msgs[key], true
	}
	index := map[replicaRef]int{}
	var order []replicaRef
	for _, s := range c.g.Stages {
		for i := range s.Replicas {
			r := replicaRef{s.Name, i}
			if !view[r].Done {
				index[r] = len(order)
				order = append(order, r)
			}
		}
	}
	if len(order) == 0 {
		return nil, 0, false
	}
	waitsFor := make([][]replicaRef, len(order))
	for k, r := range order {
		rs := view[r]
		if len(rs.Waits) == 0 {
			return nil, 0, false // working, or in a wait that may end
		}
		sw := engine.StuckWait{Name: fmt.Sprintf("%s[%d] on %s", r.stage, r.i, worker[r])}
		var whats []string
		for _, w := range rs.Waits {
			what, edges, full, on, ok := c.judgeWait(r, w, view, streamMsgs)
			if !ok {
				return nil, 0, false
			}
			whats = append(whats, what)
			sw.Edges, sw.Full = append(sw.Edges, edges...), append(sw.Full, full...)
			for _, o := range on {
				if !slices.Contains(waitsFor[k], o) {
					waitsFor[k] = append(waitsFor[k], o)
				}
			}
		}
		sw.What = strings.Join(whats, "; and ")
		waits = append(waits, sw)
	}
	for k := range order {
		for _, o := range waitsFor[k] {
			j, stuck := index[o]
			if !stuck {
				return nil, 0, false // one it waits for has ended
			}
			waits[k].WaitsFor = append(waits[k].WaitsFor, j)
		}
	}
	for _, n := range msgs {
		mark += int64(n)
	}
	return waits, mark, true
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
		h.mu.Lock()
		mark += int64(h.round)
		h.mu.Unlock()
	}
	return view, worker, mark, true
}

// judgeWait judges one wait of replica r: what it waits for in words, the
// edges it is on (and those it waits for room on), the replicas that
// could end it; ok is false when it may end.
func (c *Coordinator) judgeWait(r replicaRef, w report.Wait, view map[replicaRef]report.ReplicaSnapshot,
	streamMsgs func(*graph.Edge, int) (int, bool)) (what string, edges, full []*graph.Edge, on []replicaRef, ok bool) {
	live := func(stage string, idx []int) []replicaRef {
		var out []replicaRef
		for _, i := range idx {
			if o := (replicaRef{stage, i}); !view[o].Done {
				out = append(out, o)
			}
		}
		return out
	}
	switch w.Kind {
	case "recv":
		var names []string
		for _, ref := range w.Queues {
			e := c.g.Edge(ref.Edge)
			if e == nil || ref.Queue >= len(e.Queues) {
				return "", nil, nil, nil, false
			}
			from := e.From.Stage.Name
			var by []replicaRef
			if ref.Remote {
				n, ok := streamMsgs(e, ref.Queue)
				if !ok || n > 0 {
					return "", nil, nil, nil, false // an item on its way, or unknown
				}
				by = live(from, e.Queues[ref.Queue].Producers)
			} else {
				by = live(from, ref.For)
			}
			if len(by) == 0 {
				continue // its producers have all ended: it ends
			}
			names = append(names, queueName(e, ref.Queue))
			edges = append(edges, e)
			on = append(on, by...)
		}
		if len(names) == 0 {
			return "", nil, nil, nil, false
		}
		what = fmt.Sprintf("waits for input on %s (empty), fed by %s", strings.Join(names, ", "), refNames(on))
	case "send":
		if len(w.Queues) != 1 {
			return "", nil, nil, nil, false
		}
		ref := w.Queues[0]
		e := c.g.Edge(ref.Edge)
		if e == nil || ref.Queue >= len(e.Queues) {
			return "", nil, nil, nil, false
		}
		depth := e.Capacity
		if ref.Remote {
			n, ok := streamMsgs(e, ref.Queue)
			if !ok || n < e.Capacity {
				return "", nil, nil, nil, false // room, or unknown
			}
			depth = n
			on = live(e.To.Stage.Name, e.Queues[ref.Queue].Consumers)
		} else {
			on = live(e.To.Stage.Name, ref.For)
		}
		if len(on) == 0 {
			return "", nil, nil, nil, false
		}
		edges, full = []*graph.Edge{e}, []*graph.Edge{e}
		what = fmt.Sprintf("waits to send on %s (full, %d of %d), read by %s", queueName(e, ref.Queue), depth, e.Capacity, refNames(on))
	case "group":
		arrived, members := 0, 0
		if w.For != nil {
			on = live(r.stage, w.For)
		} else {
			h := c.groups[r.stage]
			if h == nil {
				return "", nil, nil, nil, false
			}
			var in bool
			on, arrived, members, in = h.waitingFor(r.i)
			if !in {
				return "", nil, nil, nil, false // not arrived, or released
			}
		}
		if len(on) == 0 {
			return "", nil, nil, nil, false
		}
		what = fmt.Sprintf("waits at stage %s's group step for %s", r.stage, refNames(on))
		if members > 0 {
			what += fmt.Sprintf(" (%d of %d there)", arrived, members)
		}
	default:
		return "", nil, nil, nil, false
	}
	return what, edges, full, on, true
}

// waitingFor says, of a round in progress, whether replica i has arrived
// and which present members it waits for.
func (h *groupHost) waitingFor(i int) (on []replicaRef, arrived, members int, in bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	here := make([]bool, len(h.left))
	for _, m := range h.waiting {
		if len(m.Data) >= 5 {
			if j := int(binary.LittleEndian.Uint32(m.Data[1:5])); j < len(here) {
				here[j] = true
			}
		}
	}
	if i >= len(here) || !here[i] {
		return nil, 0, 0, false
	}
	for j, left := range h.left {
		if !left && !here[j] {
			on = append(on, replicaRef{h.stage, j})
		}
	}
	return on, len(h.waiting), h.members, true
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
