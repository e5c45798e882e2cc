package engine

import (
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Waits for a detector that sees the whole run.
//
// A run across hosts has one engine per host, and no engine sees the
// whole: a queue on a transport may hold items in flight elsewhere, and a
// group across hosts is hosted by the coordinator. Each engine's detector
// leaves those waits alone (they count as able to move), and its
// snapshots say what each running replica waits on (report.Wait), by the
// same rule as stuckWaits: a replica that works, or whose wait its engine
// sees can end, has none; a wait on a local queue or an in-process group
// that cannot end names the replicas that could end it; a wait on a
// transport's queue or a group across hosts names the queue or the
// group, for the coordinator to judge with what it sees (the streams, its
// groups, every host's replicas).

// exportWaits returns the replica's waits that its engine cannot see end.
func (rep *replica) exportWaits() []report.Wait {
	if rep.away || rep.ended.Load() != 0 {
		return nil
	}
	if q, ok := rep.stage.node.(nodes.Quiescer); ok && q.Quiescent(rep.index) {
		sites, ok := rep.waitingSites()
		if !ok {
			return nil
		}
		var out []report.Wait
		for _, site := range sites {
			w, ok := rep.exportWait(site)
			if !ok {
				return nil
			}
			out = append(out, w)
		}
		return out
	}
	if _, _, _, inIdle, inBlocked := rep.waitTotals(); inIdle+inBlocked != 1 {
		return nil
	}
	w, ok := rep.exportWait(rep.waitOn.Load())
	if !ok {
		return nil
	}
	return []report.Wait{w}
}

// exportWait reads one wait; ok is false when it may end.
func (rep *replica) exportWait(site *waitSite) (w report.Wait, ok bool) {
	if site == nil {
		return w, false
	}
	switch site.kind {
	case waitRecv:
		w.Kind = "recv"
		for _, iq := range site.in.all {
			q := iq.q
			if len(q.ch) > 0 {
				return w, false // an item waits
			}
			ref := report.QueueRef{Edge: q.edge.g.Name, Queue: q.index}
			switch {
			case q.t != nil:
				q.mu.Lock()
				closed := q.closed
				q.mu.Unlock()
				if closed {
					continue // ended here; Recv moves on to the others
				}
				ref.Remote = true
			case q.producersLeft.Load() == 0:
				continue
			default:
				ref.For = indices(q.liveProducers())
			}
			w.Queues = append(w.Queues, ref)
		}
		if len(w.Queues) == 0 {
			return w, false // every queue has ended: Recv returns io.EOF
		}
	case waitSend, waitBytes:
		q := site.q
		if q.consumersGone.isSet() {
			return w, false
		}
		w.Kind = "send"
		ref := report.QueueRef{Edge: q.edge.g.Name, Queue: q.index, Remote: q.t != nil}
		if q.t == nil {
			sw := rep.stuckWait(site)
			if sw == nil {
				return w, false
			}
			ref.For = indices(sw.waitsFor)
		}
		w.Queues = []report.QueueRef{ref}
	case waitGroup:
		sw := rep.stuckWait(site)
		if sw == nil {
			return w, false
		}
		w.Kind, w.For = "group", indices(sw.waitsFor)
	case waitRemoteGroup:
		w.Kind = "group"
	default:
		return w, false
	}
	return w, true
}

func indices(reps []*replica) []int {
	out := make([]int, len(reps))
	for i, r := range reps {
		out[i] = r.index
	}
	return out
}
